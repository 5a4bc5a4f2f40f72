"""The data check's port on a worker: one TCP listener and one UDP socket on one port of
its data address, served by dataplane/probe.py's session from one poll() loop that never
blocks (select() fails once a descriptor's number reaches 1024). Standard library only.

It answers only the workers named in the session's `from=` line: before that line,
connections are accepted but not read (at most MAX_CONNS); after it, any other address's
are closed at once and its datagrams unanswered; an allowed connection is echoed (at most
MAX_ECHO bytes for PROBE_SECONDS) and closed once its echo cannot be sent whole; an allowed
datagram is answered with its size. So a stranger costs the check nothing (SECURITY.md 27,
tests/test_datacheck_attacks.py::TestDataCheckPort).
"""

from __future__ import annotations

import _socket
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Any

PROBE_SECONDS = 5.0  # a TCP connect to one peer: ARP gives up on an absent one in 3 s
# What one connection to the port may take: an honest probe sends its hello and reads it
# back, so more bytes, or a peer that leaves its echo unread, ends it.
MAX_ECHO = 4096  # bytes echoed per connection
MAX_CONNS = 64  # connections held at once (a probe's lasts a round trip)


def request(line: str) -> tuple[frozenset[str], list[str]]:
    """`from=ADDR,… TARGET …` → (the addresses probers come from, the targets)."""
    allowed: set[str] = set()
    targets = []
    for word in line.split():
        if word.startswith("from="):
            allowed.update(a for a in word[5:].split(",") if a)
        else:
            targets.append(word)
    return frozenset(allowed), targets


class Server:
    """The port's two sockets and stdin, served from one poll() loop that never blocks.

    Until the launcher's line names who may probe (`request`), connections are accepted
    but not read (at most MAX_CONNS, then the listener waits in the kernel's backlog);
    after it, a connection from anyone else is closed at once and their datagrams get no
    answer. An allowed connection is echoed up to MAX_ECHO bytes for PROBE_SECONDS, and
    closed the moment its echo cannot be sent whole (a peer that does not read)."""

    def __init__(
        self, tcp: _socket.socket, udp: _socket.socket, on_targets: Callable[[list[str]], None]
    ) -> None:
        self.tcp, self.udp, self.on_targets = tcp, udp, on_targets
        self.allowed: frozenset[str] | None = None  # until the launcher's line
        # fd → [socket, opened at, bytes echoed, the peer's address]
        self.conns: dict[int, list[Any]] = {}
        self.poll = select.poll()
        self.listening = False
        for sock in (tcp, udp):
            sock.setblocking(False)
        self.poll.register(0, select.POLLIN)  # stdin: a FIFO where PID 1 serves it
        self.poll.register(udp.fileno(), select.POLLIN)
        self.pending = b""

    def run(self, end: float) -> None:
        """Until stdin closes (the launcher is done) or `end` (monotonic)."""
        while (now := time.monotonic()) < end:
            self._expire(now)
            self._listen(self.allowed is not None or len(self.conns) < MAX_CONNS)
            due = [c[1] + PROBE_SECONDS for c in self.conns.values() if self.allowed is not None]
            wait = min([end, *due]) - now
            for fd, _ in self.poll.poll(max(0, int(wait * 1000) + 1)):
                if fd == 0:
                    if not self._stdin():
                        return
                elif fd == self.tcp.fileno():
                    self._accept()
                elif fd == self.udp.fileno():
                    self._datagrams()
                elif fd in self.conns:
                    self._echo(fd)

    def _listen(self, on: bool) -> None:
        if on != self.listening:
            (
                self.poll.register(self.tcp.fileno(), select.POLLIN)
                if on
                else self.poll.unregister(self.tcp.fileno())
            )
            self.listening = on

    def _stdin(self) -> bool:
        chunk = os.read(0, 65536)
        if not chunk:
            return False
        self.pending += chunk
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            allowed, targets = request(line.decode())
            if self.allowed is None:
                self.allowed = allowed
                for fd, conn in list(self.conns.items()):  # those accepted before it
                    if conn[3] in allowed:
                        self.poll.register(fd, select.POLLIN)
                        conn[1] = time.monotonic()
                    else:
                        self._close(fd)
            self.on_targets(targets)
        self.pending = self.pending[-65536:]
        return True

    def _accept(self) -> None:
        for _ in range(MAX_CONNS):
            try:
                fd, peer = self.tcp._accept()  # type: ignore[attr-defined]  # not in typeshed
            except OSError:  # EAGAIN: none left; or the peer already gave up
                return
            conn = _socket.socket(fileno=fd)
            conn.setblocking(False)
            address = peer[0].partition("%")[0]
            if self.allowed is None:  # held unread until the line says who may probe
                self.conns[fd] = [conn, time.monotonic(), 0, address]
                if len(self.conns) >= MAX_CONNS:
                    return  # the rest wait in the kernel's backlog (`_listen`)
            elif address in self.allowed:
                if len(self.conns) >= MAX_CONNS:  # the oldest goes
                    self._close(min(self.conns, key=lambda f: self.conns[f][1]))
                self.conns[fd] = [conn, time.monotonic(), 0, address]
                self.poll.register(fd, select.POLLIN)
            else:
                conn.close()

    def _datagrams(self) -> None:
        for _ in range(MAX_CONNS):
            try:
                data, peer = self.udp.recvfrom(65536)
            except OSError:
                return
            if self.allowed is not None and peer[0].partition("%")[0] in self.allowed:
                try:  # noqa: SIM105 - contextlib would add 5 ms to every start
                    self.udp.sendto(struct.pack("!I", len(data)), peer)  # the size only
                except OSError:
                    pass

    def _echo(self, fd: int) -> None:
        """Send back what arrived, whole or not at all; close when the connection is
        over, has had its MAX_ECHO bytes, or its peer does not take the echo."""
        conn = self.conns[fd]
        try:
            data = conn[0].recv(MAX_ECHO - conn[2] + 1)
            if data and conn[2] + len(data) <= MAX_ECHO and conn[0].send(data) == len(data):
                conn[2] += len(data)
                return
        except OSError:
            pass
        self._close(fd)

    def _expire(self, now: float) -> None:
        if self.allowed is not None:
            for fd in [f for f, c in self.conns.items() if now - c[1] > PROBE_SECONDS]:
                self._close(fd)

    def _close(self, fd: int) -> None:
        try:  # noqa: SIM105 - contextlib would add 5 ms to every start
            self.poll.unregister(fd)
        except KeyError:  # held unread: never registered
            pass
        self.conns.pop(fd)[0].close()
