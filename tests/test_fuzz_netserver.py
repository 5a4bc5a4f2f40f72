"""Fuzz target: the worker's net exchange server (ssh/netserver.py). The rule every fuzz
target follows, and the shared strategies: tests/support/strategies.py and
tests/support/fuzz_exchange.py."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import names, records, sign
from mpi_bootstrap.ssh import netx
from mpi_bootstrap.ssh import netx as exchange
from tests.support.fuzz_exchange import (
    CHALLENGE,
    CLIENT_KEY,
    DENIED,
    RECORD,
    TARGET,
    TOKEN,
    VALID_HELLO,
    Worker,
    challenges,
    check_denied,
    hex_nonces,
    nonces,
    signed,
)
from tests.support.strategies import fuzz, json_values, outcome, public_keys, tainted

pytestmark = pytest.mark.timeout(120)


HELLO_KEYS = {"v", "type", "challenge", "nonce", "client_key", "target", "mac"}
client_keys = st.one_of(
    public_keys,
    public_keys,
    tainted(public_keys),
    public_keys.map(lambda k: k + " launcher"),
    public_keys.map(lambda k: 'command="id" ' + k),
    json_values,
)
# RECORD's names and addresses (accepted), other workers' (refused), and anything.
targets = st.one_of(
    st.sampled_from(
        [
            TARGET,
            "WORKER-0",
            "worker-0.job.default.svc",
            "10.0.0.2",
            "fd00::2",
            "worker-1",
            "worker-1.job.default.svc",
            "10.0.0.3",
            "worker-00",
            "10.0.0.2 ",
            "",
            "worker-0\n",
            "worker-0.!",
            "worker-0..svc",
        ]
    ),
    tainted(st.just(TARGET)),
    json_values,
)


def target_is_record(target: object) -> bool:
    """Is `target` RECORD's worker: one of its addresses, or a name whose first label is
    its host (ssh/netx.py's docstring, step 2)?"""
    if not isinstance(target, str):
        return False
    if target in ("10.0.0.2", "fd00::2"):
        return True
    return target.split(".", 1)[0].lower() == "worker-0" and names.is_dns_name(target)


HELLO_FUZZ: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([2, 1, 0, "3", None, True, 3.0, [3]]),
    "type": st.sampled_from(["record", "HELLO", "denied", "challenge", "hello ", None]),
    "challenge": challenges,
    "nonce": nonces,
    "client_key": client_keys,
    "target": targets,
}


@st.composite
def hellos(draw: st.DrawFn) -> dict[str, Any]:
    """A valid hello for the connection's CHALLENGE with up to two changes: a field fuzzed,
    a field dropped or a field added (version 2's `time`, for one)."""
    message: dict[str, Any] = {
        "v": 3,
        "type": "hello",
        "challenge": CHALLENGE,
        "nonce": draw(hex_nonces),
        "client_key": draw(public_keys),
        "target": draw(st.sampled_from([TARGET, "10.0.0.2", "worker-0.job.default.svc"])),
    }
    changes = st.sampled_from([*sorted(HELLO_FUZZ), "drop", "extra"])
    for change in draw(st.lists(changes, max_size=2, unique=True)):
        if change == "drop":
            del message[draw(st.sampled_from(sorted(message)))]
        elif change == "extra":
            name = draw(st.sampled_from(["time", "extra", "mac2", "nonce ", ""]))
            message[name] = draw(json_values)
        else:
            message[change] = draw(HELLO_FUZZ[change])
    return message


def hello_is_valid(message: Mapping[str, Any], challenge: str) -> bool:
    """Protocol step 2 for the fields of a hello signed as it is, arriving on a connection
    that was sent `challenge`, written down independently of NetServer.answer."""
    return (
        set(message) | {"mac"} == HELLO_KEYS
        and "mac" not in message
        and message["type"] == "hello"
        and type(message["v"]) is int
        and message["v"] == 3
        and type(message["challenge"]) is str
        and message["challenge"] == challenge
        and isinstance(message["nonce"], str)
        and re.fullmatch(r"[0-9a-f]{64}", message["nonce"]) is not None
        and isinstance(message["client_key"], str)
        and names.is_public_key(message["client_key"])
        and target_is_record(message["target"])
    )


def check_accepted(worker: Worker, reply: bytes, message: Mapping[str, Any]) -> None:
    outcome("accepted")
    assert reply != DENIED
    assert worker.authorized == [message["client_key"]]
    assert exchange.read_reply(reply, TOKEN, message["nonce"], TARGET) == RECORD


class TestNetServerFuzz:
    """The worker authorises a key only for a hello signed with the token for the challenge
    it sent on that connection, exactly that key; anything else is `denied`, and answer()
    never raises."""

    @fuzz(1000)
    @given(st.binary(max_size=400))
    @example(b" " * (records.MAX_MESSAGE + 1))
    @example(b"[" * 100_000)
    @example(
        b'{"v":3,"type":"hello","challenge":"","nonce":"","client_key":"","target":"","mac":""}'
    )
    def test_bytes(self, raw: bytes) -> None:
        """Any bytes (oversized, deeply nested, a hello with empty fields) are denied without an
        exception, and no key is authorised."""
        worker = Worker()
        check_denied(worker, worker.answer(raw))

    @fuzz(800)
    @given(
        st.one_of(
            json_values,
            hellos(),
            st.builds(lambda m, mac: {**m, "mac": mac}, hellos(), json_values),
        )
    )
    def test_unsigned_json(self, message: object) -> None:
        """JSON without a valid mac (any value, an unsigned hello, a hello with a bogus mac) is
        denied and authorises no key."""
        worker = Worker()
        check_denied(worker, worker.answer(json.dumps(message).encode()))

    @fuzz(1500)
    @given(
        hellos(),
        st.sampled_from([CHALLENGE, CHALLENGE, CHALLENGE, "d1" * 32]),
        st.sampled_from(["none", "none", "none", "tamper", "mac", "nomac"]),
    )
    @example(VALID_HELLO, CHALLENGE, "none")
    @example(VALID_HELLO, "d1" * 32, "none")  # a hello for another connection: a replay
    @example({**VALID_HELLO, "client_key": CLIENT_KEY + "\n"}, CHALLENGE, "none")
    @example({**VALID_HELLO, "challenge": CHALLENGE + "\n"}, CHALLENGE, "none")
    @example({**VALID_HELLO, "challenge": "é" * 64}, CHALLENGE, "none")
    @example({**VALID_HELLO, "time": 1_750_000_000}, CHALLENGE, "none")  # version 2's field
    @example({**VALID_HELLO, "target": "worker-1"}, CHALLENGE, "none")  # a relayed hello
    @example({**VALID_HELLO, "target": "10.0.0.3"}, CHALLENGE, "none")
    @example({**VALID_HELLO, "target": "10.0.0.2"}, CHALLENGE, "none")
    def test_signed(self, message: dict[str, Any], challenge: str, after: str) -> None:
        """A token-signed hello authorises that key alone, exactly when it is valid, carries the
        challenge of the connection it arrives on and is for this worker; a tampered field,
        another message's mac or no mac is denied."""
        worker = Worker()
        raw = signed(message)
        if after != "none":  # change the message after signing
            sent = json.loads(raw)
            if after == "tamper":
                field = sorted(set(sent) - {"mac"})[0] if set(sent) - {"mac"} else "v"
                sent[field] = [sent.get(field)]
            elif after == "mac":
                sent["mac"] = sign.mac(netx.derive_key(TOKEN), {"nonce": "0" * 64})
            else:
                del sent["mac"]
            raw = json.dumps(sent).encode()
        reply = worker.answer(raw, challenge)
        if after == "none" and hello_is_valid(message, challenge):
            check_accepted(worker, reply, message)
        else:
            check_denied(worker, reply)

    @fuzz(500)
    @given(st.text(min_size=1, max_size=40).filter(lambda t: t != TOKEN), hellos())
    @example(TOKEN + " ", {**VALID_HELLO, "nonce": "1" * 64})
    def test_wrong_token(self, other: str, message: dict[str, Any]) -> None:
        """A hello signed with any token but the job's is denied and authorises no key."""
        worker = Worker()
        try:
            raw = signed(message, other)
        except UnicodeEncodeError:  # a lone surrogate cannot be a token: nothing to send
            return
        check_denied(worker, worker.answer(raw))

    @fuzz(300)
    @given(st.lists(hex_nonces.filter(lambda c: c != CHALLENGE), min_size=1, max_size=4))
    def test_replay(self, later: list[str]) -> None:
        """A hello accepted once is denied on every later connection (each with its own fresh
        challenge), by the same worker or by a restarted one (a new NetServer, with no
        memory), and authorises nothing more."""
        raw, nonce = exchange.make_hello(TOKEN, CLIENT_KEY, TARGET, CHALLENGE)
        worker = Worker()
        check_accepted(worker, worker.answer(raw), {"client_key": CLIENT_KEY, "nonce": nonce})
        restarted = Worker()
        for challenge in later:
            assert worker.answer(raw, challenge) == DENIED
            assert restarted.answer(raw, challenge) == DENIED
        assert worker.authorized == [CLIENT_KEY]
        assert restarted.authorized == []
        reasons = {
            kw.get("reason") for event, kw in restarted.logged if event == "exchange refused"
        }
        assert reasons == {"challenge is not the one sent on this connection (a replayed hello)"}
