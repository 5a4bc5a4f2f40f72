"""Every claimed worker's watch armed before any rank starts (core/liveness.py).

A worker's watch ends what a lost launcher's launch left on it (its ranks: the GPU
holders) once its launcher's pings stop; but it counts silence only after a first ping,
since a launcher still awaiting other workers (the pipelined launch) may not ping for
minutes after its claim. The resident PID 1's monitor pings from the hand-over on, after
the ranks were let go: a launcher lost in between (cut off the moment the gate opened, its
pod frozen during the hand-over) left every rank running with no watch to end them
(`make chaos`, a launcher cut off 3 s into a 16-worker launch: all 16 workers' ranks left).
So the launcher pings each worker, and again each RESEND_S with the next counter (the
watch takes each counter once; the monitor then counts on from ARM_N), until each has
answered or ARM_S passed, before it lets any rank start. A worker that does not answer is
said; the monitor will find it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time

from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core.errors import some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Monitor

ARM_S = 1.0  # at most this long for every answer
RESEND_S = 0.1


def arm(spec: Monitor | None, log: Log) -> None:
    """Ping every worker of `spec` (each once more every RESEND_S) until each answered
    or ARM_S passed."""
    if spec is None:
        return
    family = socket.AF_INET6 if ":" in spec.bind else socket.AF_INET
    started = time.monotonic()
    todo = {p.address: p.name for p in spec.peers}
    sid = lv.session_id(spec.key)
    n = 0
    with socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as udp:
        udp.bind((spec.bind, 0))
        udp.setblocking(False)
        while todo and n < lv.ARM_N and (left := started + ARM_S - time.monotonic()) > 0:
            n += 1
            ping = lv.encode(spec.key, "ping", n)
            for p in spec.peers:
                if p.address in todo:
                    with contextlib.suppress(OSError):  # a full buffer: sent again
                        udp.sendto(ping, (p.address, p.port))
            until = time.monotonic() + min(RESEND_S, left)
            while todo and (wait := until - time.monotonic()) > 0:
                if select.select([udp], [], [], wait)[0]:
                    _answer(udp, sid, spec.key, todo)
    if todo:
        log("watch not armed", level="warning", workers=len(todo), hosts=some(list(todo.values())))
    else:
        log(
            "watches armed", workers=len(spec.peers), elapsed_s=round(time.monotonic() - started, 3)
        )


def _answer(udp: socket.socket, sid: str, key: str, todo: dict[str, str]) -> None:
    """Each pong of this session that has come: its worker is armed."""
    while True:
        try:
            data, peer = udp.recvfrom(lv.MAX_DATAGRAM + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            continue  # an ICMP error for an earlier ping
        found = lv.session_of(data)
        if found is None or found[0] != sid:
            continue
        if found[1]["t"] == "pong" and lv.authentic(key, found[1]):
            todo.pop(peer[0], None)
