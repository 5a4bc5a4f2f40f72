"""The `net` exchange: the launcher asks each worker for its record (core/records.py)
over the control network; both sides prove they hold the token `MPI_BOOTSTRAP_TOKEN`.
(The other exchanges: `secret` needs none — the Secret's key is every sshd's host key
— and `dir` is ssh/dirx.py.) This module holds the protocol and the launcher's side;
the worker's server is ssh/netserver.py.

The net exchange, in full (version 2). K = HMAC-SHA256(token, "mpi-bootstrap exchange v2").
1. launcher → worker, one JSON line: {"v":2, "type":"hello", "nonce": N (32 random bytes,
   hex), "time": T (unix seconds), "client_key": the job's public key, "target": the
   worker it is meant for (its hostname, or the address the hostfile names), "mac"}.
2. The worker checks the mac, that |T − now| ≤ 120 s, that N was not seen in the last
   240 s, and that `target` is its own hostname or one of its addresses. Any failure: it
   answers {"type":"denied"} and changes nothing, and logs why. Otherwise it authorises
   client_key for its sshd and answers
   {"v":2, "type":"record", "nonce": N, "record": {...}, "mac"}.
3. The launcher checks the reply's mac, that it echoes its own fresh N, and that the
   record is the target's (its host is the target's name, or it lists the target address).
mac = hex HMAC-SHA256(K, canonical JSON of every other field). So: without the token
nobody can add a key (hello mac) or pass as a worker (reply mac); a replayed hello is
refused (nonce cache within the time window, clock check beyond it), and a replayed
reply fails the launcher's nonce check; a hello relayed to another worker (by whoever holds
a worker's stale address) is refused there, and a reply from the wrong worker is refused
by the launcher (version 1 had no target: tests/test_security.py::TestNetExchangeRelay).
Nothing secret travels: the token never does, and records and public keys are not secret.
The launcher's whole fetch from one worker has one deadline: a peer that trickles bytes
cannot hold it past MPI_DNS_WAIT_SECONDS.

Standard library only: the worker's resident PID 1 serves the exchange.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any

from mpi_bootstrap.core.records import (
    MAX_MESSAGE,
    Record,
    RecordError,
    is_target,
    is_version,
    record_from,
)

PROTOCOL = 2  # of the net exchange's messages
CLOCK_SKEW = 120.0  # seconds a hello's timestamp may differ from the worker's clock
NONCE_TTL = 2 * CLOCK_SKEW
NONCE = re.compile(r"[0-9a-f]{64}")  # fullmatch: `$` would accept a trailing newline
MAX_TIME = 2**62  # a hello's time must fit arithmetic with the clock (found by fuzzing)


# ---------------------------------------------------------------- net

def derive_key(token: str) -> bytes:
    return hmac.new(token.encode(), b"mpi-bootstrap exchange v2", hashlib.sha256).digest()


def message_mac(key: bytes, message: Mapping[str, Any]) -> str:
    body = json.dumps({k: v for k, v in message.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def signed(key: bytes, message: dict[str, Any]) -> bytes:
    message["mac"] = message_mac(key, message)
    return json.dumps(message).encode() + b"\n"


def valid_mac(key: bytes, message: Mapping[str, Any]) -> bool:
    """Never raises: compare_digest refuses non-ASCII text (TypeError), and a message
    nested just below json's limits cannot be dumped again (RecursionError) — both
    reachable without the token (found by tests/test_fuzz.py)."""
    mac = message.get("mac")
    if not isinstance(mac, str) or not mac.isascii():
        return False
    try:
        expected = message_mac(key, message)
    except (RecursionError, ValueError):
        return False
    return hmac.compare_digest(mac, expected)


def make_hello(token: str, client_key: str, target: str, *, now: float | None = None
               ) -> tuple[bytes, str]:
    nonce = secrets.token_hex(32)
    message = {"v": PROTOCOL, "type": "hello", "nonce": nonce,
               "time": int(time.time() if now is None else now), "client_key": client_key,
               "target": target}
    return signed(derive_key(token), message), nonce


class ExchangeRefused(RecordError):
    """A worker's answer that asking again will not change: it refused us, its reply is
    not signed with the job's token, or it is another worker's record."""


def fetch(address: str, port: int, token: str, client_key: str, *, target: str,
          deadline: float) -> Record:
    """Ask the worker `target` (at `address`) for its record, all before `deadline`
    (monotonic): connecting, sending and every byte of the reply. TimeoutError after it."""
    hello, nonce = make_hello(token, client_key, target)

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no whole reply before the deadline")
        return remaining

    with socket.create_connection((address, port), timeout=min(2.0, left())) as conn:
        conn.settimeout(left())
        conn.sendall(hello)
        data = b""
        while b"\n" not in data and len(data) <= MAX_MESSAGE:
            conn.settimeout(left())
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    return read_reply(data.split(b"\n", 1)[0], token, nonce, target)


def read_reply(raw: bytes, token: str, nonce: str, target: str) -> Record:
    """The record in the reply to our hello `nonce` for `target`, or RecordError (its
    subclass ExchangeRefused when asking again cannot help) naming `target`."""
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        raise RecordError(f"{target}: exchange reply is not JSON") from None
    if not isinstance(reply, dict) or reply.get("type") != "record" or \
            not is_version(reply.get("v"), PROTOCOL):
        raise ExchangeRefused(f"{target}: exchange refused (is MPI_BOOTSTRAP_TOKEN the "
                              "same on both sides, and the agent the same version?)")
    if not valid_mac(derive_key(token), reply):
        raise ExchangeRefused(f"{target}: exchange reply not signed with the job's token")
    if reply.get("nonce") != nonce:
        raise RecordError(f"{target}: exchange reply answers another request (replay)")
    try:
        record = record_from(reply.get("record"))
    except RecordError as exc:
        raise RecordError(f"{target}: {exc}") from None
    if not is_target(target, record):
        raise ExchangeRefused(f"{target}: the worker that answered is {record.host} "
                              f"({', '.join(record.addresses) or 'no address'}), not "
                              f"{target}: a stale address?")
    return record
