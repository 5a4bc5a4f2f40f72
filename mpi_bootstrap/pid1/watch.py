"""The worker's side of liveness (core/liveness.py has the protocol), served from the
resident PID 1's loop: the claims of launchers, their pings, and a lost launcher
(docs/troubleshooting.md, "While ranks run"; docs/architecture.md, "One launch's sessions").

A claim, `claim KEY BOUND PID` on the control FIFO (pid1/control.py) from a preflight
session whose shell is PID, ends what earlier launches left below PID 1 but itself, its
sshd and that session (the shell, its parents and children), then answers on the
session's FIFO `control-PID.out`: its UDP port, boot id, and what it ended. KEY becomes
the current session's, BOUND the silence after which its launcher is lost; a claim with
the key already held ends nothing. Nothing here blocks: ending is a SIGTERM, then a
SIGKILL after END_S, on the loop's timer. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core.errors import ExitStatus
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Watch as WatchSpec
from mpi_bootstrap.pid1 import tree
from mpi_bootstrap.pid1.control import Control
from mpi_bootstrap.pid1.endpoint import Endpoint
from mpi_bootstrap.system.files import own_fifo

END_S = 3.0  # SIGTERM, then SIGKILL after this
DRAIN_S = 0.3  # between a session's end and its connection's: sshd sends what it said
KEEP_OLD = 4  # superseded sessions still answered
_PID = re.compile(r"[1-9][0-9]{0,9}")
_BOUND = re.compile(r"[0-9]{1,5}(\.[0-9]{1,3})?")


class _Ending:
    """Processes being ended, in waves: SIGTERM to a wave, SIGKILL to what is left of it
    after END_S; the next wave DRAIN_S after the last is gone (or past hope). `then` once
    the first is gone; done after the last. The ssh connections come last, so that each
    session's last words (the note of `WatchService.end_launch`) reach whoever opened it
    before its connection ends."""

    def __init__(
        self, waves: list[list[int]], reason: str, then: Callable[[int, list[str]], None]
    ) -> None:
        self.waves, self.reason = [w for w in waves if w], reason
        self.then: Callable[[int, list[str]], None] | None = then
        self.pids = [p for w in self.waves for p in w]
        self.names = sorted({tree.name(p) for p in self.pids})
        self.drain_at: float | None = None
        self._wave(time.monotonic())

    def _wave(self, now: float) -> None:
        self.current = self.waves.pop(0) if self.waves else []
        tree.signal_all(self.current, signal.SIGTERM)
        self.kill_at: float | None = now + END_S
        self.give_up_at = now + END_S + 2.0

    def step(self, now: float) -> bool:
        """True once finished (every process gone, or past hope)."""
        left = [p for p in self.current if not tree.gone(p)]
        if left and self.kill_at is not None and now >= self.kill_at:
            tree.signal_all(left, signal.SIGKILL)
            self.kill_at = None
        if left and now < self.give_up_at:
            return False
        if self.then is not None:  # what the launch ran is gone: said, answered
            self.then(len(self.pids), self.names)
            self.then = None
        if not self.waves:
            return True
        self.drain_at = self.drain_at or now + DRAIN_S
        if now >= self.drain_at:
            self.drain_at = None
            self._wave(now)
        return False


class WatchService:
    def __init__(
        self,
        spec: WatchSpec,
        log: Log,
        readers: MutableMapping[int, Callable[[], None]],
        control: Control,
        *,
        sshd: Callable[[], int],
        stop: Callable[[str, int], None],
    ) -> None:
        self.spec, self.log, self.sshd, self.stop_worker = spec, log, sshd, stop
        self.boot = secrets.token_hex(8)
        self.key: bytes | None = None  # this worker's key of the current session
        self.sid = ""
        self.bound = 0.0  # the current launcher's, from its claim
        self.old: dict[str, bytes] = {}  # superseded sessions: id → this worker's key
        self.last_n = 0
        self.armed = False
        self.heard = 0.0
        self.lost_at: float | None = None
        self.answered_old: dict[str, float] = {}
        self.endings: list[_Ending] = []
        self.last_tick = time.monotonic()
        self.udp = Endpoint(spec.bind, self.datagram)
        readers[self.udp.fileno()] = self.udp.read
        control.verbs["claim"] = self.on_claim
        self.state = control.state
        log("watch", port=self.udp.port, boot=self.boot, grace_s=spec.grace)

    # ------------------------------------------------------------ claims (the FIFO)

    def on_claim(self, words: list[str]) -> str | None:
        if (
            len(words) != 3
            or not lv.SESSION_KEY.fullmatch(words[0])
            or not _BOUND.fullmatch(words[1])
            or not _PID.fullmatch(words[2])
            or not float(words[1]) <= lv.MAX_BOUND
        ):
            return "not `claim KEY BOUND PID`"
        self.claim(words[0], float(words[1]), int(words[2]))
        return None

    def claim(self, key: str, bound: float, pid: int) -> None:
        reply = os.path.join(self.state, f"control-{pid}.out")
        try:
            fd = own_fifo(reply, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            self.log("claim refused", level="warning", pid=pid, error=str(exc))
            return
        finally:  # open, or never will be (its session gone): the name is done, as a probe's
            with contextlib.suppress(OSError):
                os.unlink(reply)
        table = tree.parents()
        if self.sshd() not in tree.ancestors(pid, table)[1:]:  # the sshd the agent started
            # Only an ssh session of this pod claims (the FIFO is in this pod's state
            # directory, which its PID 1 holds: system/files.py `hold`).
            self.log("claim refused", level="warning", pid=pid, error="not an ssh session")
            self.reply(fd, "refused: not an ssh session of this pod")
            return
        if not tree.holds(pid, os.path.join(self.state, "control")):
            # The PID is the line's word: the claiming session holds the FIFO open until
            # it is answered (core/remote.py `claim`). A writer outside this pod's PID
            # namespace named another session's PID, and its claim ended the healthy
            # launch (security review 5, finding 5a: tests/test_liveness.py).
            self.log("claim refused", level="warning", pid=pid, error="not the writer")
            self.reply(fd, "refused: that PID did not write the claim")
            return
        sid = lv.session_id(key)
        sweep(self.state)
        if sid == self.sid:
            # This launch's own claim again (a preflight retried, a later round): it ends
            # nothing. Its first claim came before any other session of it could start
            # here (the launch gate opens a worker after its claim), so whatever runs now
            # is this launch's (docs/architecture.md, "One launch's sessions").
            self.log("claimed", session=sid, requester=pid, again=True)
            self.answer(fd, 0, [])
            return
        reason = "earlier launch"
        if self.key is not None:
            self.old[self.sid] = self.key
            while len(self.old) > KEEP_OLD:
                self.old.pop(next(iter(self.old)))
            reason = "superseded"
        self.key, self.sid, self.last_n = lv.worker_key(key, self.spec.bind), sid, 0
        self.bound, self.armed, self.lost_at = bound, False, None
        self.log("claimed", session=sid, requester=pid)
        spared = {*tree.ancestors(pid, table), *tree.descendants(pid, table)}
        self.end_launch(reason, spared, lambda n, names: self.answer(fd, n, names))

    def answer(self, fd: int, ended: int, names: list[str]) -> None:
        c = lv.Claimed(
            self.spec.bind, self.udp.port, self.boot, self.spec.sshd_port, ended, tuple(names)
        )
        self.reply(fd, lv.claimed_text(c))

    def reply(self, fd: int, text: str) -> None:
        try:
            os.write(fd, f"{text}\n".encode())
        except OSError as exc:
            self.log("claim not answered", level="warning", error=str(exc))
        finally:
            os.close(fd)

    # ------------------------------------------------------------ ending a launch

    def end_launch(
        self, reason: str, spared: set[int], then: Callable[[int, list[str]], None] | None = None
    ) -> None:
        """End every process below PID 1 but sshd and `spared`; then `then(n, names)`."""
        me, sshd, table = os.getpid(), self.sshd(), tree.parents()
        pids = [p for p in tree.descendants(me, table) if p != sshd and p not in spared]
        note = lv.ended_note(socket.gethostname(), reason).encode()
        conns = [p for p in pids if tree.name(p) == "sshd"]  # ssh connections: last
        for pid in pids:  # each ssh session's shell says why to whoever opened it
            if pid not in conns and tree.name(table.get(pid, 0)) == "sshd":
                tree.say(pid, note)

        def done(n: int, names: list[str]) -> None:
            sweep(self.state)  # and what the sessions it ended left (test_soak)
            if n:
                self.log("ended launch", processes=n, names=names, reason=reason)
            if then is not None:
                then(n, names)

        self.endings.append(_Ending([[p for p in pids if p not in conns], conns], reason, done))

    # ------------------------------------------------------------ the launcher's datagrams

    def datagram(self, sid: str, msg: dict[str, Any], peer: tuple[str, int]) -> None:
        """Only a datagram signed with this worker's key counts (one signed for another
        worker, relayed here, does not: core/liveness.py `worker_key`)."""
        now = time.monotonic()
        if sid == self.sid and self.key is not None and lv.authentic(self.key, msg):
            if msg["n"] <= self.last_n:
                return  # older than the last one taken: a replay or a late duplicate
            self.last_n = msg["n"]
            if msg["t"] == "ping":
                self.heard_from(now)
                self.udp.send(self.key, sid, "pong", msg["n"], peer, b=self.boot)
            elif msg["t"] == "stop":
                self.armed, self.lost_at = False, None
                why = "job over" if msg.get("why") == "job over" else "worker lost"
                self.udp.send(self.key, sid, "stopped", msg["n"], peer)
                self.end_launch(why, set())
        elif (
            sid in self.old
            and msg["t"] == "ping"
            and lv.authentic(self.old[sid], msg)
            and now - self.answered_old.get(sid, -1.0) >= 1.0
        ):
            self.answered_old[sid] = now
            self.udp.send(self.old[sid], sid, "superseded", msg["n"], peer)

    def heard_from(self, now: float) -> None:
        if self.lost_at is not None:
            self.log("launcher back", silent_s=round(now - self.heard, 1))
        self.armed, self.heard, self.lost_at = True, now, None

    # ------------------------------------------------------------ the loop's timer

    def next_at(self) -> float | None:
        times = []
        if self.endings:
            times.append(time.monotonic() + 0.1)
        if self.armed and self.lost_at is None:
            # Woken at least this often, whatever else wakes the loop: `tick` takes a
            # turn it did not get for PAUSE_S for a stop of this pod's own. Woken only at
            # the bound, a silent launcher was taken each time for such a stop, never lost
            # (seen with the net and secret exchanges; dir's job-done poll hid it).
            times.append(min(self.heard + self.bound, time.monotonic() + lv.PAUSE_S / 2))
        if self.lost_at is not None:
            times.append(self.lost_at + self.spec.grace)
        return min(times) if times else None

    def tick(self, now: float) -> None:
        if now - self.last_tick > lv.PAUSE_S and self.armed:
            # This pod was stopped (or starved) itself: its silence is not the launcher's.
            self.heard = max(self.heard, now)
        self.last_tick = now
        self.endings = [e for e in self.endings if not e.step(now)]
        if self.armed and self.lost_at is None and now - self.heard >= self.bound:
            self.lost_at = now
            self.log(
                "launcher lost",
                level="warning",
                silent_s=round(now - self.heard, 1),
                grace_s=self.spec.grace,
            )
        if self.lost_at is not None and now - self.lost_at >= self.spec.grace:
            self.armed, self.lost_at = False, None
            self.end_launch("launcher lost", set())
            if self.spec.exit_on_loss:
                self.stop_worker(
                    "its launcher was lost (MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS)",
                    int(ExitStatus.WORKER_LOST),
                )

    def busy(self) -> bool:
        return bool(self.endings)


def sweep(directory: str) -> None:
    """The reply FIFOs of sessions gone before they removed their own (an ssh session
    ended mid-claim): `control-PID.out` whose PID is no live process of this pod's."""
    for name in os.listdir(directory):
        m = _REPLY.fullmatch(name)
        if m is not None and tree.gone(int(m[1])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


_REPLY = re.compile(r"control-([0-9]{1,10})\.out")
