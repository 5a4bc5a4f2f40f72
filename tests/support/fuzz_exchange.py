"""The net exchange as the fuzz targets meet it (tests/test_fuzz_netserver.py,
test_fuzz_read_reply.py, test_fuzz_exchange_regressions.py): a job's token and a worker's
record, a NetServer answering on a connection that was sent a known challenge, signing,
nonces, and the checks of a denial and of the launcher's read_reply."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from mpi_bootstrap.ssh import netserver, netx
from mpi_bootstrap.ssh import netx as exchange
from mpi_bootstrap.ssh.netx import Record, RecordError
from tests.support.strategies import check_record, json_values, outcome, tainted

TOKEN = "fuzz-token-0123456789abcdef"  # noqa: S105 - the test job's token, not a secret
CHALLENGE = "c0" * 32  # what the worker sent on the connection the fuzzed line arrives on
RECORD = Record(
    "worker-0",
    ("10.0.0.2", "fd00::2"),
    2222,
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9",
    "mpi",
)
CLIENT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ9vO1Vf0a6n3Hc7bqW0oJkq2z5p8sY1xR4tU7wZ"
DENIED = b'{"type":"denied"}\n'
TARGET = "worker-0"  # RECORD's own name, which the launcher asks for
VALID_HELLO = {
    "v": 3,
    "type": "hello",
    "challenge": CHALLENGE,
    "nonce": "0" * 64,
    "client_key": CLIENT_KEY,
    "target": TARGET,
}


@dataclasses.dataclass
class Worker:
    """A NetServer (a worker's start: a restarted worker is a new one), recording what it
    authorised and logged."""

    authorized: list[str] = dataclasses.field(default_factory=list)
    logged: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = netserver.NetServer(
            TOKEN,
            RECORD,
            lambda key, _peer: self.authorized.append(key),
            lambda event, **kw: self.logged.append((event, kw)),
        )

    def answer(self, raw: bytes, challenge: str = CHALLENGE) -> bytes:
        """The reply to `raw` on a connection that was sent `challenge`."""
        reply = self.server.answer(raw, "10.0.0.9", challenge)
        assert TOKEN not in repr(self.logged)
        return reply


def signed(message: Mapping[str, Any], token: str = TOKEN) -> bytes:
    return netx.signed(netx.derive_key(token), dict(message))


hex_nonces = st.text("0123456789abcdef", min_size=64, max_size=64)
nonces = st.one_of(
    hex_nonces,
    hex_nonces,
    hex_nonces.map(str.upper),
    hex_nonces.map(lambda n: n[1:]),
    hex_nonces.map(lambda n: n + "0"),
    tainted(hex_nonces),
    json_values,
)
# The challenge a hello carries: mostly the connection's own (so deeper checks are reached),
# else another connection's, a near miss, or anything.
challenges = st.one_of(
    st.just(CHALLENGE),
    st.just(CHALLENGE),
    hex_nonces,
    st.just(CHALLENGE.upper()),
    st.just(CHALLENGE + "\n"),
    st.just(CHALLENGE[:-1]),
    tainted(st.just(CHALLENGE)),
    json_values,
)


def check_denied(worker: Worker, reply: bytes) -> None:
    outcome("denied")
    assert reply == DENIED
    assert worker.authorized == []


NONCE = "ab" * 32


def check_read_reply(raw: bytes) -> Record | None:
    try:
        record = exchange.read_reply(raw, TOKEN, NONCE, TARGET)
    except RecordError as exc:
        outcome("RecordError")
        assert str(exc).startswith(f"{TARGET}: ")
        return None
    check_record(record)
    return record
