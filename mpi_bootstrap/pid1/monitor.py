"""The launcher's side of liveness (core/liveness.py has the protocol), served from the
resident PID 1's loop while mpirun runs.

Every PING_S each worker gets a ping; its pong is the only thing that counts as a sign
of life (a counter newer than the last one taken, from that worker's address, signed
with this launch's key). A worker silent for `suspect_after` is confirmed: pings every
CONFIRM_PING_S, and one TCP connection to its sshd's port, whose fate says what kind of
silence it is — refused (the pod or its agent is gone), accepted (its kernel answers,
its agent does not: frozen or hung), nothing (cut off, its node down). Still silent at
the bound: lost. The supervisor then ends mpirun and exits WORKER_LOST naming the pod,
and the other workers are told to end the launch (`stop`).

When mpirun exits non-zero by itself (Open MPI 4 ends in a second when a daemon's
connection is reset), the workers are asked once more (VERIFY_S): one that does not
answer is named as lost, instead of mpirun's words about daemons. When the job ends,
every worker is told (`stop`, job over), so none of them mistakes the silence that
follows for a lost launcher.

A pause of this process itself (the pod stopped, the node starved: its loop did not run
for PAUSE_S) restarts every worker's silence from the moment it runs again. Standard
library only; nothing here blocks.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import time
from collections.abc import Callable, MutableMapping

from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Monitor as MonitorSpec
from mpi_bootstrap.core.spec import Peer

VERIFY_S = 2.0  # after mpirun failed by itself: how long the workers have to answer
STOP_S = 1.0  # how long `stop` is sent again to a worker that has not acknowledged it
STOP_EVERY_S = 0.2
BURST = 64


class _Probe:
    """One non-blocking TCP connection to a worker's sshd port: what kind of silence."""

    def __init__(self, address: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock: socket.socket | None = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.seen: str | None = None
        code = self.sock.connect_ex((address, port))
        if code not in (0, errno.EINPROGRESS):
            self._done(code)
        elif code == 0:
            self._done(0)

    def _done(self, code: int) -> None:
        self.seen = (
            lv.FROZEN if code == 0 else lv.REFUSED if code == errno.ECONNREFUSED else lv.NO_ANSWER
        )
        self.close()

    def result(self) -> str | None:
        """What the connection found, or None while it is still trying."""
        if self.seen is None and self.sock is not None:
            _, writable, _ = select.select([], [self.sock], [], 0)
            if writable:
                self._done(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
        return self.seen

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _Watched:
    def __init__(self, peer: Peer, now: float) -> None:
        self.peer, self.heard, self.n = peer, now, 0
        self.probe: _Probe | None = None
        self.lost: str | None = None
        self.acked = False


Lost = tuple[Peer, str, float]  # the worker, what was seen, seconds silent


class MonitorService:
    def __init__(
        self,
        spec: MonitorSpec,
        log: Log,
        readers: MutableMapping[int, Callable[[], None]],
        on_lost: Callable[[list[Lost]], None],
    ) -> None:
        self.spec, self.log, self.on_lost = spec, log, on_lost
        self.timing = lv.Timing(spec.bound)
        now = time.monotonic()
        self.watched = [_Watched(p, now) for p in spec.peers]
        self.by_address = {w.peer.address: w for w in self.watched}
        self.udp = socket.socket(
            socket.AF_INET6 if ":" in spec.bind else socket.AF_INET,
            socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
        )
        self.udp.bind((spec.bind, 0))
        self.udp.setblocking(False)
        readers[self.udp.fileno()] = self.on_datagram
        self.n = lv.ARM_N  # the launcher's arming ping came first (launcher/arming.py)
        self.state = "watching"
        self.next_ping = now
        self.last_tick = now
        self.until = 0.0  # the end of verifying or stopping
        self.why = "job over"
        log(
            "monitor", workers=len(self.watched), bound_s=spec.bound, port=self.udp.getsockname()[1]
        )

    # ------------------------------------------------------------ sending

    def _send(self, w: _Watched, kind: str, **fields: str) -> None:
        self.n += 1
        with contextlib.suppress(OSError):  # a full buffer or an ICMP error: try again
            self.udp.sendto(
                lv.encode(self.spec.key, kind, self.n, **fields), (w.peer.address, w.peer.port)
            )

    def _ping_all(self, now: float) -> None:
        for w in self.watched:
            if w.lost is None:
                self._send(w, "ping")
        fast = self.state == "verifying" or any(w.probe for w in self.watched)
        self.next_ping = now + (lv.CONFIRM_PING_S if fast else lv.PING_S)

    # ------------------------------------------------------------ receiving

    def on_datagram(self) -> None:
        for _ in range(BURST):
            try:
                data, peer = self.udp.recvfrom(lv.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # ICMP unreachable for an earlier ping: the probe says more
            self.datagram(data, peer[0])

    def datagram(self, data: bytes, address: str) -> None:
        found = lv.session_of(data)
        w = self.by_address.get(address)
        if found is None or w is None or found[0] != lv.session_id(self.spec.key):
            return
        msg = found[1]
        if not lv.authentic(self.spec.key, msg) or msg["n"] <= w.n:
            return
        w.n = msg["n"]
        now = time.monotonic()
        if msg["t"] == "stopped":
            w.acked = True
        elif msg["t"] == "superseded":
            self._lose(w, lv.SUPERSEDED, now)
        elif msg["t"] == "pong" and msg.get("b") != w.peer.boot:
            self._lose(w, lv.RESTARTED, now)
        elif msg["t"] == "pong":
            if w.probe is not None:
                self.log("worker answers again", host=w.peer.name, silent_s=round(now - w.heard, 1))
                w.probe.close()
                w.probe = None
            w.heard = now

    def _lose(self, w: _Watched, seen: str, now: float) -> None:
        if w.lost is None and self.state in ("watching", "verifying"):
            w.lost = seen
            if self.state == "watching":
                self._report([w], now)

    def _report(self, lost: list[_Watched], now: float) -> None:
        self.on_lost([(w.peer, str(w.lost), round(now - w.heard, 1)) for w in lost])
        self.stop("worker lost", now)

    # ------------------------------------------------------------ the loop

    def next_at(self) -> float | None:
        if self.state == "done":
            return None
        if self.state != "watching":
            return min(self.next_ping, self.until)
        live = [w for w in self.watched if w.lost is None]
        due = [
            w.heard + (self.timing.bound if w.probe else self.timing.suspect_after) for w in live
        ]
        return min([self.next_ping, *due])

    def tick(self, now: float) -> None:
        if now - self.last_tick > lv.PAUSE_S:  # this pod was stopped or starved itself
            self.log("monitor paused", paused_s=round(now - self.last_tick, 1))
            for w in self.watched:
                w.heard = max(w.heard, now)
        self.last_tick = now
        if self.state == "watching":
            self._watch(now)
        elif self.state == "verifying":
            self._verify(now)
        elif self.state == "stopping" and (
            now >= self.until or all(w.acked for w in self.watched if w.lost is None)
        ):
            self.state = "done"
        if self.state != "done" and now >= self.next_ping:
            self._send_due(now)

    def _send_due(self, now: float) -> None:
        if self.state != "stopping":
            self._ping_all(now)
            return
        for w in self.watched:
            if w.lost is None and not w.acked:
                self._send(w, "stop", why=self.why)
        self.next_ping = now + STOP_EVERY_S

    def _verify(self, now: float) -> None:
        """The round after mpirun's own failure: a worker silent for its first half is
        probed (sshd logs every connection: only the silent are), and who has not
        answered by its end is lost."""
        began = self.until - VERIFY_S
        if now < self.until:
            for w in self.watched:
                if w.heard < began and w.probe is None and now >= began + VERIFY_S / 2:
                    w.probe = _Probe(w.peer.address, w.peer.sshd_port)
            return
        lost = [w for w in self.watched if w.heard < began]
        for w in lost:
            w.lost = w.lost or (w.probe.result() if w.probe else None) or lv.NO_ANSWER
        if lost:
            self._report(lost, now)
        else:
            self.stop("job ended", now)

    def _watch(self, now: float) -> None:
        lost = []
        for w in self.watched:
            silent = now - w.heard
            if w.lost is not None:
                continue
            if w.probe is None and silent >= self.timing.suspect_after:
                self.log(
                    "worker silent", level="warning", host=w.peer.name, silent_s=round(silent, 1)
                )
                w.probe = _Probe(w.peer.address, w.peer.sshd_port)
                self.next_ping = now
            elif w.probe is not None and silent >= self.timing.bound:
                w.lost = w.probe.result() or lv.NO_ANSWER
                w.probe.close()
                lost.append(w)
        if lost:
            self._report(lost, now)

    def main_exited(self, code: int, *, verify: bool | None = None) -> None:
        """mpirun has ended with `code`: a failure (or `verify`) makes every worker answer
        once more."""
        now = time.monotonic()
        if self.state != "watching":
            return
        if not (code != 0 if verify is None else verify):
            self.stop("job over", now)
            return
        self.state, self.until, self.next_ping = "verifying", now + VERIFY_S, now

    def stop(self, why: str, now: float) -> None:
        """Tell every worker still there that this launch is over (`why`)."""
        self.state, self.why, self.until, self.next_ping = "stopping", why, now + STOP_S, now
        for w in self.watched:
            if w.probe is not None:
                w.probe.close()

    def busy(self) -> bool:
        return self.state in ("verifying", "stopping")
