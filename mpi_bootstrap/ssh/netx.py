"""The `net` exchange's protocol and the launcher's side (the worker's server is
ssh/netserver.py): the launcher asks each worker for its record (core/records.py) over the
control network, both sides proving they hold the job's token (core/tokens.py). The
protocol (version 3, core/sign.py): docs/exchanges.md, "The net exchange"; why each step:
SECURITY.md, promises 31 and 32 (tests/test_attacks.py's TestNetExchangeReplay and
TestNetExchangeRelay). Standard library only: the worker's resident PID 1 serves it.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from mpi_bootstrap.core import sign
from mpi_bootstrap.core.records import (
    MAX_MESSAGE,
    Record,
    RecordError,
    is_target,
    is_version,
    record_from,
)

PROTOCOL = 3  # of the net exchange's messages
NONCE = re.compile(r"[0-9a-f]{64}")  # fullmatch: `$` would accept a trailing newline


# ---------------------------------------------------------------- net


def derive_key(token: str) -> bytes:
    return sign.derive(token.encode(), "mpi-bootstrap exchange v3")


def signed(key: bytes, message: dict[str, Any]) -> bytes:
    return json.dumps(sign.signed(key, message)).encode() + b"\n"


def new_challenge() -> tuple[str, bytes]:
    """A worker's challenge for one connection, and the line that sends it."""
    challenge = secrets.token_hex(32)
    line = json.dumps({"v": PROTOCOL, "type": "challenge", "challenge": challenge})
    return challenge, line.encode() + b"\n"


def make_hello(token: str, client_key: str, target: str, challenge: str) -> tuple[bytes, str]:
    """The hello answering `challenge`, and the nonce its reply must echo."""
    nonce = secrets.token_hex(32)
    message = {
        "v": PROTOCOL,
        "type": "hello",
        "challenge": challenge,
        "nonce": nonce,
        "client_key": client_key,
        "target": target,
    }
    return signed(derive_key(token), message), nonce


class ExchangeRefused(RecordError):
    """A worker's answer that asking again will not change: it refused us, its reply is
    not signed with the job's token, or it is another worker's record."""


def fetch(
    address: str, port: int, token: str, client_key: str, *, target: str, deadline: float
) -> Record:
    """Ask the worker `target` (at `address`) for its record, all before `deadline`
    (monotonic): connecting, the challenge, sending and every byte of the reply.
    TimeoutError after it."""

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no whole reply before the deadline")
        return remaining

    with socket.create_connection((address, port), timeout=min(2.0, left())) as conn:
        lines = _Lines(conn, left)
        challenge = read_challenge(lines.next(), target)
        hello, nonce = make_hello(token, client_key, target, challenge)
        conn.settimeout(left())
        conn.sendall(hello)
        reply = lines.next()
    return read_reply(reply, token, nonce, target)


class _Lines:
    """The lines a peer sends, each read within the deadline `left` keeps; a line is at
    most MAX_MESSAGE bytes (what is past that, or before the end of the stream, is the
    line)."""

    def __init__(self, conn: socket.socket, left: Callable[[], float]) -> None:
        self.conn, self.left, self.data = conn, left, b""

    def next(self) -> bytes:
        while b"\n" not in self.data and len(self.data) <= MAX_MESSAGE:
            self.conn.settimeout(self.left())
            chunk = self.conn.recv(4096)
            if not chunk:
                break
            self.data += chunk
        line, _, self.data = self.data.partition(b"\n")
        return line


def read_challenge(raw: bytes, target: str) -> str:
    """The challenge a worker sent first on a connection, or RecordError (its subclass
    ExchangeRefused when the peer speaks another protocol) naming `target`."""
    if not raw:
        raise RecordError(
            f"{target}: the exchange port closed the connection without a "
            f"challenge (an agent older than protocol {PROTOCOL} sends none)"
        )
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        message = None
    if (
        not isinstance(message, dict)
        or message.get("type") != "challenge"
        or not is_version(message.get("v"), PROTOCOL)
        or set(message) != {"v", "type", "challenge"}
        or not isinstance(message["challenge"], str)
        or not NONCE.fullmatch(message["challenge"])
    ):
        raise ExchangeRefused(
            f"{target}: the exchange port does not speak protocol "
            f"{PROTOCOL} (is the agent the same version on both sides?)"
        )
    return str(message["challenge"])


def read_reply(raw: bytes, token: str, nonce: str, target: str) -> Record:
    """The record in the reply to our hello `nonce` for `target`, or RecordError (its
    subclass ExchangeRefused when asking again cannot help) naming `target`."""
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        raise RecordError(f"{target}: exchange reply is not JSON") from None
    if (
        not isinstance(reply, dict)
        or reply.get("type") != "record"
        or not is_version(reply.get("v"), PROTOCOL)
    ):
        raise ExchangeRefused(
            f"{target}: exchange refused (is the token the same on both "
            "sides, and the agent the same version?)"
        )
    if not sign.valid(derive_key(token), reply):
        raise ExchangeRefused(f"{target}: exchange reply not signed with the job's token")
    if reply.get("nonce") != nonce:
        raise RecordError(f"{target}: exchange reply answers another request (replay)")
    try:
        record = record_from(reply.get("record"))
    except RecordError as exc:
        raise RecordError(f"{target}: {exc}") from None
    if not is_target(target, record):
        raise ExchangeRefused(
            f"{target}: the worker that answered is {record.host} "
            f"({', '.join(record.addresses) or 'no address'}), not "
            f"{target}: a stale address?"
        )
    return record
