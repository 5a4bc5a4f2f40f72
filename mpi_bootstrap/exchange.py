"""How peers learn each other's sshd: records, and the `net` exchange (the `dir` exchange
is direxchange.py).

A worker's *record* says where its sshd listens and which host key it presents:
`{"v": 1, "host", "addresses", "port", "host_key", "user"}`. Nothing in it is secret.

- `secret`: no exchange. The job's key from the mounted Secret is also every sshd's host
  key, so clients pin it with no exchange at all; the port is fixed.
- `dir`: one JSON file per worker in a shared directory (direxchange.py).
- `net`: the launcher asks each worker over the control network; both sides prove they
  hold the token `MPI_BOOTSTRAP_TOKEN` (protocol below).

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

Stdlib only: the worker's resident supervisor serves the net exchange.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import hmac
import json
import re
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from mpi_bootstrap.names import is_dns_name, is_ip_literal, is_public_key, is_user_name

VERSION = 1  # of a record
PROTOCOL = 2  # of the net exchange's messages
MAX_MESSAGE = 16384
CLOCK_SKEW = 120.0  # seconds a hello's timestamp may differ from the worker's clock
NONCE_TTL = 2 * CLOCK_SKEW
MAX_CONNECTIONS = 16  # open at once on a worker; more evict the oldest
CONNECTION_SECONDS = 2.0  # a peer has this long to send its hello
_NONCE = re.compile(r"[0-9a-f]{64}")  # fullmatch: `$` would accept a trailing newline
_MAX_TIME = 2**62  # a hello's time must fit arithmetic with the clock (found by fuzzing)


class RecordError(ValueError):
    """A record or message that does not have exactly the expected shape."""


@dataclasses.dataclass(frozen=True)
class Record:
    host: str  # the worker's hostname (pod name)
    addresses: tuple[str, ...]  # its control-interface addresses
    port: int
    host_key: str  # "ssh-ed25519 AAAA…"
    user: str

    def to_dict(self) -> dict[str, Any]:
        return {"v": VERSION, "host": self.host, "addresses": list(self.addresses),
                "port": self.port, "host_key": self.host_key, "user": self.user}


def record_from(data: Any) -> Record:
    """Validate a decoded record: every field present, typed and in range; no extras."""
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    expected = {"v", "host", "addresses", "port", "host_key", "user"}
    if set(data) != expected:
        raise RecordError(f"fields {sorted(set(data) ^ expected)} unexpected or missing")
    if not _is_version(data["v"]):
        raise RecordError(f"version {data['v']!r} is not {VERSION}")
    host, port, key, user, addrs = (data["host"], data["port"], data["host_key"],
                                    data["user"], data["addresses"])
    if not isinstance(host, str) or not is_dns_name(host) or host.endswith("."):
        raise RecordError("host is not a hostname")
    if type(port) is not int or not 1 <= port <= 65535:
        raise RecordError("port is not 1..65535")
    if not isinstance(key, str) or not is_public_key(key):
        raise RecordError("host_key is not one OpenSSH public key (type and base64 only)")
    if not isinstance(user, str) or not is_user_name(user):
        raise RecordError("user is not a user name")
    if not isinstance(addrs, list) or len(addrs) > 16 or not all(
            isinstance(a, str) and is_ip_literal(a) for a in addrs):
        raise RecordError("addresses is not a list of IP addresses")
    return Record(host, tuple(addrs), port, key, user)


def decode(text: str | bytes, where: str) -> Record:
    try:
        return record_from(json.loads(text))
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{where}: {exc}") from None


# ---------------------------------------------------------------- net

def _is_version(v: Any, version: int = VERSION) -> bool:
    """Exactly the integer `version`: JSON `true` and `1.0` are == 1 in Python."""
    return type(v) is int and v == version


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), b"mpi-bootstrap exchange v2", hashlib.sha256).digest()


def _mac(key: bytes, message: Mapping[str, Any]) -> str:
    body = json.dumps({k: v for k, v in message.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _signed(key: bytes, message: dict[str, Any]) -> bytes:
    message["mac"] = _mac(key, message)
    return json.dumps(message).encode() + b"\n"


def _valid_mac(key: bytes, message: Mapping[str, Any]) -> bool:
    """Never raises: compare_digest refuses non-ASCII text (TypeError), and a message
    nested just below json's limits cannot be dumped again (RecursionError) — both
    reachable without the token (found by tests/test_fuzz.py)."""
    mac = message.get("mac")
    if not isinstance(mac, str) or not mac.isascii():
        return False
    try:
        expected = _mac(key, message)
    except (RecursionError, ValueError):
        return False
    return hmac.compare_digest(mac, expected)


def is_target(target: str, record: Record) -> bool:
    """Is `target` (a hostname or an address) the worker of `record`? A name matches the
    record's host by its first label (the hostfile may name `<pod>.<job>.<ns>.svc`), an
    address matches one of the record's addresses."""
    if is_ip_literal(target):
        return target in record.addresses
    return is_dns_name(target) and target.split(".", 1)[0].lower() == record.host.lower()


def make_hello(token: str, client_key: str, target: str, *, now: float | None = None
               ) -> tuple[bytes, str]:
    nonce = secrets.token_hex(32)
    message = {"v": PROTOCOL, "type": "hello", "nonce": nonce,
               "time": int(time.time() if now is None else now), "client_key": client_key,
               "target": target}
    return _signed(_key(token), message), nonce


class NetServer:
    """The worker's side: verifies hellos, authorises the client key, answers the record."""

    def __init__(self, token: str, record: Record,
                 authorize: Callable[[str, str], None], log: Callable[..., None],
                 clock: Callable[[], float] = time.time) -> None:
        self._key = _key(token)
        self.record = record
        self.authorize = authorize
        self.log = log
        self.clock = clock
        self._seen: dict[str, float] = {}

    def answer(self, raw: bytes, peer: str) -> bytes:
        """The reply to one request line. Never raises on bad input."""
        def deny(reason: str) -> bytes:
            self.log("exchange refused", level="warning", peer=peer, reason=reason)
            return b'{"type":"denied"}\n'

        if len(raw) > MAX_MESSAGE:
            return deny("message too long")
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            return deny("not JSON")
        if not isinstance(message, dict) or message.get("type") != "hello" or \
                not _is_version(message.get("v"), PROTOCOL) or set(message) != {
                    "v", "type", "nonce", "time", "client_key", "target", "mac"}:
            return deny("not a hello message (of protocol version 2)")
        if not _valid_mac(self._key, message):
            return deny("bad mac (wrong or missing token)")
        nonce, stamp, client_key = message["nonce"], message["time"], message["client_key"]
        if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
            return deny("bad nonce")
        now = self.clock()
        if type(stamp) is not int or not 0 <= stamp < _MAX_TIME or \
                abs(stamp - now) > CLOCK_SKEW:
            return deny("stale or future timestamp (replay or clock skew)")
        self._seen = {n: t for n, t in self._seen.items() if now - t < NONCE_TTL}
        if nonce in self._seen:
            return deny("replayed nonce")
        if not isinstance(client_key, str) or not is_public_key(client_key):
            return deny("client_key is not one OpenSSH public key")
        target = message["target"]
        if not isinstance(target, str) or not is_target(target, self.record):
            # A hello for another worker, relayed here by whoever holds that worker's
            # (stale) address: answering would pin this worker's key for the other.
            return deny(f"addressed to {str(target)[:64]!r}, not to this worker")
        self._seen[nonce] = now
        try:
            self.authorize(client_key, peer)
        except OSError as exc:  # a full or read-only state dir: say so, do not crash
            return deny(f"cannot authorise the key: {exc}")
        self.log("exchange answered", peer=peer)
        return _signed(self._key, {"v": PROTOCOL, "type": "record", "nonce": nonce,
                                   "record": self.record.to_dict()})

    def attach(self, listener: socket.socket, readers: dict[int, Callable[[], None]]
               ) -> None:
        """Serve from an event loop that calls `readers[fd]()` when fd is readable.

        Nothing here ever blocks, so a peer that connects and says nothing (or trickles
        bytes) cannot stall the loop (the worker's PID 1, which also forwards signals).
        At most MAX_CONNECTIONS are open at once: a newcomer closes the oldest, and any
        open longer than CONNECTION_SECONDS.
        """
        listener.setblocking(False)
        conns: dict[int, tuple[socket.socket, float, bytearray, str]] = {}

        def close(fd: int) -> None:
            conn = conns.pop(fd)[0]
            readers.pop(fd, None)
            conn.close()

        def accept() -> None:
            try:
                conn, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of fds: free one, or the loop would spin
                if exc.errno in (errno.EMFILE, errno.ENFILE) and conns:
                    close(min(conns, key=lambda fd: conns[fd][1]))
                return  # (or a peer that reset before we accepted)
            now = time.monotonic()
            for fd in [fd for fd, c in conns.items() if now - c[1] > CONNECTION_SECONDS]:
                close(fd)
            if len(conns) >= MAX_CONNECTIONS:
                close(min(conns, key=lambda fd: conns[fd][1]))
            conn.setblocking(False)
            fd = conn.fileno()
            conns[fd] = (conn, now, bytearray(), str(addr[0]))
            readers[fd] = lambda: receive(fd)

        def receive(fd: int) -> None:
            if fd not in conns:
                return
            conn, _, data, peer = conns[fd]
            try:
                chunk = conn.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            data += chunk
            if chunk and b"\n" not in data and len(data) <= MAX_MESSAGE:
                return  # more to come
            if data:  # a line, too much, or the end of the peer's stream
                line = bytes(data.split(b"\n", 1)[0])
                # A reply fits any socket buffer; one that does not go out whole is lost.
                with contextlib.suppress(OSError):
                    conn.send(self.answer(line, peer))
            close(fd)

        readers[listener.fileno()] = accept


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
            not _is_version(reply.get("v"), PROTOCOL):
        raise ExchangeRefused(f"{target}: exchange refused (is MPI_BOOTSTRAP_TOKEN the "
                              "same on both sides, and the agent the same version?)")
    if not _valid_mac(_key(token), reply):
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
