"""ssh/netserver.py, the worker's net exchange server, in a loop like the supervisor's on
loopback: silent peers never stall a real hello nor hold more than MAX_CONNECTIONS, a
hello ended by end of stream is answered, an oversized message is denied. (Its parsers
fuzzed: tests/test_fuzz_netserver.py.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mpi_bootstrap.core import records
from mpi_bootstrap.ssh import netserver
from mpi_bootstrap.ssh import netx as exchange

pytestmark = pytest.mark.timeout(60)


class NetLoop:
    """The worker's net exchange served by a loop like the supervisor's, on loopback."""

    TOKEN = "unit-test-token-0123456789abcdef"  # noqa: S105 - a test token

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.readers: dict[int, Callable[[], None]] = {}
        self.authorized: list[str] = []
        record = records.Record("w", ("127.0.0.1",), 2222, "ssh-ed25519 " + "A" * 68, "root")
        server = netserver.NetServer(
            self.TOKEN, record, lambda key, _peer: self.authorized.append(key), lambda *a, **k: None
        )
        netserver.Connections(server, self.listener, self.readers)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import select

        while not self.stop.is_set():
            ready, _, _ = select.select(list(self.readers), [], [], 0.05)
            for fd in ready:
                if fd in self.readers:
                    self.readers[fd]()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.listener.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


@pytest.fixture
def net() -> Iterator[NetLoop]:
    loop = NetLoop()
    yield loop
    loop.close()


class TestNetServer:
    """The exchange never blocks its loop: silent peers are evicted, a hello without a
    newline is answered at end of stream, an oversized message is denied."""

    KEY = "ssh-ed25519 " + "B" * 68

    def test_silent_peers_do_not_stall_a_real_hello(self, net: NetLoop) -> None:
        """40 silent connections neither delay a real hello past 1 s nor stay open beyond
        MAX_CONNECTIONS: idle peers cannot lock the launcher out of a worker."""
        silent = [net.connect() for _ in range(40)]
        t0 = time.monotonic()
        record = exchange.fetch(
            "127.0.0.1", net.port, net.TOKEN, self.KEY, target="w", deadline=time.monotonic() + 5
        )
        assert record.host == "w"
        assert time.monotonic() - t0 < 1.0
        assert net.authorized == [self.KEY]
        # at most MAX_CONNECTIONS stay open on the server side
        assert len(net.readers) <= netserver.MAX_CONNECTIONS + 1  # + the listener
        for s in silent:
            s.close()

    def test_hello_without_newline_then_eof(self, net: NetLoop) -> None:
        """A hello ended by end of stream instead of a newline is still answered with the record."""
        with net.connect() as s:
            challenge = exchange.read_challenge(s.recv(65536).rstrip(b"\n"), "w")
            hello, nonce = exchange.make_hello(net.TOKEN, self.KEY, "w", challenge)
            s.sendall(hello.rstrip(b"\n"))
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(65536)
        assert exchange.read_reply(reply, net.TOKEN, nonce, "w").port == 2222

    def test_oversized_message_denied(self, net: NetLoop) -> None:
        """A message over MAX_MESSAGE is answered `denied` and authorises no key."""
        with net.connect() as s:
            assert json.loads(s.recv(65536))["type"] == "challenge"
            s.sendall(b"x" * (records.MAX_MESSAGE + 4096))
            reply = s.recv(65536)
        assert json.loads(reply) == {"type": "denied"}
        assert net.authorized == []
