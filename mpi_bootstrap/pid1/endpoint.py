"""Liveness's one UDP endpoint (core/liveness.py has the protocol): a non-blocking socket
bound to the control address, the one receive loop of the launcher's monitor (its arming
pings too) and the worker's watch, and the one way they send. Standard library only."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any

from mpi_bootstrap.core import liveness as lv

BURST = 64  # datagrams read per wake-up: a flood cannot hold the loop
Peer = tuple[str, int]
Handler = Callable[[str, dict[str, Any], Peer], None]  # (session id, message, sender)


class Endpoint:
    def __init__(self, bind: str, on: Handler) -> None:
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self.udp = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.udp.bind((bind, 0))
        self.udp.setblocking(False)
        self.on = on

    @property
    def port(self) -> int:
        return int(self.udp.getsockname()[1])

    def fileno(self) -> int:
        return self.udp.fileno()

    def read(self) -> None:
        """What has come, datagrams of our form handed on: at most BURST."""
        for _ in range(BURST):
            try:
                data, peer = self.udp.recvfrom(lv.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # an ICMP error from an earlier send: not ours to act on
            if (found := lv.session_of(data)) is not None:
                self.on(found[0], found[1], (peer[0], peer[1]))

    def send(self, key: bytes, sid: str, kind: str, n: int, to: Peer, **fields: Any) -> None:
        with contextlib.suppress(OSError):  # a full buffer, an ICMP error: sent again
            self.udp.sendto(lv.encode(key, sid, kind, n, **fields), to)

    def close(self) -> None:
        self.udp.close()
