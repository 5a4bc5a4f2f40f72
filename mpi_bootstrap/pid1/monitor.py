"""The launcher's side of liveness (core/liveness.py has the protocol), served from the
resident PID 1's loop while mpirun runs: a ping to each worker every PING_S, and only its
pong (a newer counter, from its address, signed with this launch's key) is a sign of
life; what is seen and done when: docs/troubleshooting.md, "While ranks run". A pause of
this process itself (its loop did not run for PAUSE_S) restarts every worker's silence.
Standard library only; nothing here blocks.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core.errors import some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Monitor as MonitorSpec
from mpi_bootstrap.core.spec import Peer
from mpi_bootstrap.pid1.endpoint import Endpoint

VERIFY_S = 2.0  # after mpirun failed by itself: how long the workers have to answer
STOP_S = 1.0  # how long `stop` is sent again to a worker that has not acknowledged it
STOP_EVERY_S = 0.2
ARM_S = 1.0  # arming (`arm`): at most this long for every answer
RESEND_S = 0.1


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
    def __init__(self, peer: Peer, key: str, now: float) -> None:
        self.peer, self.heard, self.n = peer, now, 0
        self.key = lv.worker_key(key, peer.address)  # its datagrams' both ways
        self.sent = lv.ARM_N  # its counter: the arming pings (`arm`) came first
        self.probe: _Probe | None = None
        self.lost: str | None = None
        self.acked = False
        self.pinged = 0.0  # when its last ping (counter `sent`) went


class _RoundTrips:
    """How long pongs took, by the ms (a pong answers its ping's counter), said when the
    launch ends: what the workers' PID 1 answered with, whatever else it served."""

    def __init__(self) -> None:
        self.by_ms = [0] * 1001  # the last: a second or more

    def add(self, seconds: float) -> None:
        self.by_ms[min(int(seconds * 1000), 1000)] += 1

    def quantile(self, q: float) -> int:
        need, seen = q * sum(self.by_ms), 0
        for ms, count in enumerate(self.by_ms):
            seen += count
            if seen >= need:
                return ms
        return 1000

    def count(self) -> int:
        return sum(self.by_ms)


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
        self.watched = [_Watched(p, spec.key, now) for p in spec.peers]
        self.by_address = {w.peer.address: w for w in self.watched}
        self.sid = lv.session_id(spec.key)
        self.udp = Endpoint(spec.bind, self.datagram)
        readers[self.udp.fileno()] = self.udp.read
        self.state = "watching"
        self.next_ping = now
        self.last_tick = now
        self.until = 0.0  # the end of verifying or stopping
        self.why = "job over"
        self.trips = _RoundTrips()
        log("monitor", workers=len(self.watched), bound_s=spec.bound, port=self.udp.port)

    # ------------------------------------------------------------ sending

    def _send(self, w: _Watched, kind: str, **fields: str) -> None:
        w.sent += 1
        w.pinged = time.monotonic()
        self.udp.send(w.key, self.sid, kind, w.sent, (w.peer.address, w.peer.port), **fields)

    def _ping_all(self, now: float) -> None:
        for w in self.watched:
            if w.lost is None:
                self._send(w, "ping")
        fast = self.state == "verifying" or any(w.probe for w in self.watched)
        self.next_ping = now + (lv.CONFIRM_PING_S if fast else lv.PING_S)

    # ------------------------------------------------------------ receiving

    def datagram(self, sid: str, msg: dict[str, Any], peer: tuple[str, int]) -> None:
        """Taken only from the worker whose key it verifies under (by its address: a
        datagram of another worker re-sent from this one's address fails), newer than its
        last: core/liveness.py."""
        w = self.by_address.get(peer[0])
        if w is None or sid != self.sid or not lv.authentic(w.key, msg) or msg["n"] <= w.n:
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
            if msg["n"] == w.sent:
                self.trips.add(now - w.pinged)
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
        if n := self.trips.count():
            p50, p99 = self.trips.quantile(0.5), self.trips.quantile(0.99)
            self.log("liveness round trips", pongs=n, p50_ms=p50, p99_ms=p99)

    def busy(self) -> bool:
        return self.state in ("verifying", "stopping")


def arm(spec: MonitorSpec | None, log: Log) -> None:
    """Every worker's watch armed before any rank starts: a watch counts its launcher's
    silence only after a first ping (a launcher still awaiting other workers may not
    ping for minutes after its claim), and the resident pings only after the hand-over,
    once the ranks were let go: a launcher lost in between (cut off the moment the gate
    opened) left every rank running (`make chaos`: a launcher cut off 3 s into a
    16-worker launch, all 16 workers' ranks left). So the launcher pings each worker,
    again each RESEND_S with the next counter (1 to ARM_N: the monitor counts on from
    there), until each answered or ARM_S passed. One that did not is said; the monitor
    will find it."""
    if spec is None:
        return
    started = time.monotonic()
    mon = MonitorService(spec, _quiet, {}, lambda _lost: None)
    todo = {w.peer.address: w for w in mon.watched}
    try:
        for n in range(1, lv.ARM_N + 1):
            if not todo or (left := started + ARM_S - time.monotonic()) <= 0:
                break
            for w in todo.values():
                mon.udp.send(w.key, mon.sid, "ping", n, (w.peer.address, w.peer.port))
            until = time.monotonic() + min(RESEND_S, left)
            while todo and (wait := until - time.monotonic()) > 0:
                if select.select([mon.udp], [], [], wait)[0]:
                    mon.udp.read()
                    todo = {a: w for a, w in todo.items() if w.n == 0}
    finally:
        mon.udp.close()
    if todo:
        names = [w.peer.name for w in todo.values()]
        log("watch not armed", level="warning", workers=len(todo), hosts=some(names))
    else:
        elapsed = round(time.monotonic() - started, 3)
        log("watches armed", workers=len(spec.peers), elapsed_s=elapsed)


def _quiet(event: str, /, level: str = "info", **keys: Any) -> None:
    """The arming round's monitor says nothing of its own: `arm` says what it did."""
