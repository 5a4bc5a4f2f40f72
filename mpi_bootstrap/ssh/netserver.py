"""The worker's side of the `net` exchange (ssh/netx.py has the protocol), served from the
resident PID 1's loop: challenge each connection, verify its hello, authorise its key for
sshd, answer the record.

Standard library only (the resident PID 1 imports it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from mpi_bootstrap.core import sign
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import fingerprint, is_public_key
from mpi_bootstrap.core.records import MAX_MESSAGE, Record, is_target, is_version, record_from
from mpi_bootstrap.core.spec import NetExchange
from mpi_bootstrap.ssh.netx import NONCE, PROTOCOL, derive_key, new_challenge, signed

MAX_CONNECTIONS = 16  # open at once on a worker; more evict the oldest
CONNECTION_SECONDS = 2.0  # a peer has this long to send its hello
Readers = dict[int, Callable[[], None]]


HELLO_KEYS = frozenset({"v", "type", "challenge", "nonce", "client_key", "target", "mac"})


class NetServer:
    """The worker's side: verifies hellos, authorises the client key, answers the record."""

    def __init__(
        self, token: str, record: Record, authorize: Callable[[str, str], None], log: Log
    ) -> None:
        self._key = derive_key(token)
        self.record = record
        self.authorize = authorize
        self.log = log

    def answer(self, raw: bytes, peer: str, challenge: str) -> bytes:
        """The reply to one request line on the connection that was sent `challenge`.
        Never raises on bad input."""
        message, refused = self._hello(raw)
        if message is not None:
            refused = self._fresh(message, challenge)
        if message is not None and refused is None:
            try:
                self.authorize(message["client_key"], peer)
            except OSError as exc:  # a full or read-only state dir: say so, do not crash
                refused = f"cannot authorise the key: {exc}"
        if message is None or refused is not None:
            self.log("exchange refused", level="warning", peer=peer, reason=refused)
            return b'{"type":"denied"}\n'
        self.log("exchange answered", peer=peer)
        reply = {"v": PROTOCOL, "type": "record", "nonce": message["nonce"]}
        return signed(self._key, {**reply, "record": self.record.to_dict()})

    def _hello(self, raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
        """(the hello, None), or (None, why it is not one with a valid MAC)."""
        if len(raw) > MAX_MESSAGE:
            return None, "message too long"
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            return None, "not JSON"
        if (
            not isinstance(message, dict)
            or message.get("type") != "hello"
            or not is_version(message.get("v"), PROTOCOL)
            or set(message) != HELLO_KEYS
        ):
            return None, f"not a hello message (of protocol version {PROTOCOL})"
        if not sign.valid(self._key, message):
            return None, "bad mac (wrong or missing token)"
        return message, None

    def _fresh(self, message: dict[str, Any], challenge: str) -> str | None:
        """Why an authentic hello is still refused (a replay, a bad key, another target)."""
        nonce, client_key, answered = message["nonce"], message["client_key"], message["challenge"]
        # Signed for another connection's challenge: a hello captured off the wire and
        # replayed — to this worker, or to it restarted — would otherwise replace the
        # running launcher's key (tests/test_attacks.py::TestNetExchangeReplay).
        if not isinstance(answered, str) or not sign.same(answered, challenge):
            return "challenge is not the one sent on this connection (a replayed hello)"
        if not isinstance(nonce, str) or not NONCE.fullmatch(nonce):
            return "bad nonce"
        if not isinstance(client_key, str) or not is_public_key(client_key):
            return "client_key is not one OpenSSH public key"
        target = message["target"]
        if not isinstance(target, str) or not is_target(target, self.record):
            # A hello for another worker, relayed here by whoever holds that worker's
            # (stale) address: answering would pin this worker's key for the other.
            return f"addressed to {str(target)[:64]!r}, not to this worker"
        return None


class Connections:
    """Serve a NetServer from an event loop that calls `readers[fd]()` when fd is readable.

    Each connection is sent its own challenge when it is accepted, and answers one line
    (the hello that must carry that challenge), then closes. Nothing here ever blocks, so
    a peer that connects and says nothing (or trickles bytes) cannot stall the loop (the
    worker's PID 1, which also forwards signals). At most MAX_CONNECTIONS are open at
    once: a newcomer closes the oldest, and any open longer than CONNECTION_SECONDS.
    """

    def __init__(self, server: NetServer, listener: socket.socket, readers: Readers) -> None:
        self.server = server
        self.listener = listener
        self.readers = readers
        # fd → (socket, when accepted, bytes so far, peer, the challenge it was sent)
        self.open: dict[int, tuple[socket.socket, float, bytearray, str, str]] = {}
        listener.setblocking(False)
        readers[listener.fileno()] = self.accept

    def close(self, fd: int) -> None:
        conn = self.open.pop(fd)[0]
        self.readers.pop(fd, None)
        conn.close()

    def oldest(self) -> int:
        return min(self.open, key=lambda fd: self.open[fd][1])

    def accept(self) -> None:
        try:
            conn, addr = self.listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:  # out of fds: free one, or the loop would spin
            if exc.errno in (errno.EMFILE, errno.ENFILE) and self.open:
                self.close(self.oldest())
            return  # (or a peer that reset before we accepted)
        now = time.monotonic()
        for fd in [fd for fd, c in self.open.items() if now - c[1] > CONNECTION_SECONDS]:
            self.close(fd)
        if len(self.open) >= MAX_CONNECTIONS:
            self.close(self.oldest())
        conn.setblocking(False)
        challenge, line = new_challenge()
        try:  # a fresh socket's buffer takes one short line whole
            sent = conn.send(line)
        except OSError:
            sent = 0
        if sent != len(line):  # the peer is gone already
            conn.close()
            return
        fd = conn.fileno()
        self.open[fd] = (conn, now, bytearray(), str(addr[0]), challenge)
        self.readers[fd] = lambda: self.receive(fd)

    def receive(self, fd: int) -> None:
        if fd not in self.open:
            return
        conn, _, data, peer, challenge = self.open[fd]
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
                conn.send(self.server.answer(line, peer, challenge))
        self.close(fd)


def serve(net: NetExchange, log: Log, readers: Readers) -> Connections:
    """The worker's exchange as the hand-off describes it (worker/main.py): the listening
    socket's descriptor, the token, the record, and the authorized_keys file to write.

    The file holds the keys the worker authorized at its start (`base_keys`: a mounted
    key, the dir exchange's job key) and the key of the latest hello (an authentic one,
    made for its connection's challenge: never a replayed one), which replaces the one
    before: a restarted launcher comes with a new key each time, and appending them
    grew the file by a line per launch (tests/test_soak.py). The previous launcher is
    gone; a session already logged in is not touched (sshd reads the file at login)."""
    from mpi_bootstrap.system.files import atomic_write

    listener = socket.socket(fileno=net.fd)
    path = net.authorized_keys
    base = list(net.base_keys)

    def authorize(key: str, peer: str) -> None:
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            lines = []
        except ValueError as exc:  # not UTF-8: refuse this hello, keep serving
            raise OSError(f"{path} is not text: {exc}") from None
        wanted = [*base, key] if key not in base else base
        if lines != wanted:
            atomic_write(path, "\n".join(wanted) + "\n", 0o600)
            log(
                "key authorized",
                fingerprint=fingerprint(key),
                key_type=key.split(maxsplit=1)[0],
                origin=f"net exchange hello from {peer}",
            )

    server = NetServer(net.token, record_from(net.record), authorize, log)
    return Connections(server, listener, readers)
