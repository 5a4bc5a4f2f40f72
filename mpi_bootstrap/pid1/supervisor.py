"""The resident supervisor: PID 1 of the pod (or a child subreaper) for the whole job. It
runs one main child (mpirun, or the worker's sshd) in a loop that reads as tini's (see
`Supervisor.run`; docs/pid1.md), and is the only caller of waitpid(-1), so no exit status
is ever lost to another waiter — the classic bug of Python inits where `subprocess`
reads 0 for a child someone else reaped. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mpi_bootstrap.core.errors import ExitStatus, printable, signal_exit_status
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.pid1.leftovers import Leftovers
from mpi_bootstrap.pid1.output import Output, Tee
from mpi_bootstrap.pid1.restart import RestartPolicy, Restarts
from mpi_bootstrap.pid1.verdict import Verdict
from mpi_bootstrap.pid1.wakeup import Wakeup
from mpi_bootstrap.proc import signals
from mpi_bootstrap.proc.spawn import exit_code, start_main

DRAIN_SECONDS = 1.0  # after the last child: how long to wait for the stderr pipe's end
END_MAIN_SECONDS = 5.0  # a main child ended by a duty (a lost worker): SIGKILL after this


class Duty(Protocol):
    """Something PID 1 does beside its main child, on its loop's timer: `tick` runs on
    every turn of the loop, `next_at` says when it must run again at the latest, and the
    job is not finished while it is `busy`."""

    def next_at(self) -> float | None: ...
    def tick(self, now: float) -> None: ...
    def busy(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Settings:
    grace: float = 10.0  # after the main child: SIGTERM what is left, SIGKILL after this
    group: bool = False  # forward signals to the main child's whole process group
    restart: RestartPolicy | None = None  # a service: restart it when it dies
    explain_failure: bool = False  # tee the child's stderr, explain a known failure


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        log: Log,
        output: Output,
        readers: Mapping[int, Callable[[], None]] | None = None,
    ) -> None:
        self.settings = settings
        self.log = log
        self.output = output
        # Extra file descriptors served in the same loop (the worker's net exchange).
        self.readers = dict(readers or {})
        self.wakeup = Wakeup()
        self.argv: Sequence[str] = ()
        self.env: Mapping[str, str] = {}
        self.main = 0  # PID of the main child
        self.tty = False  # the main child's group holds the terminal
        self.arrived: list[int] = []  # signals read in the last wait
        self.ready: list[int] = []  # readable descriptors of the last wait
        self.stop_signal = 0  # the terminating signal that ends the job, if any
        self.stopping = False
        self.main_status: int | None = None  # the main child's last wait status
        self.restarts = Restarts(settings.restart) if settings.restart else None
        self.verdict = Verdict()  # the exit code, and why (the termination message's)
        self.duties: list[Duty] = []
        self.on_exit: list[Callable[[int], None]] = []  # told the main child's exit code
        self.kill_main_at: float | None = None
        self.none_left = False  # no child is left to reap
        self.leftovers = Leftovers(settings.grace, log)
        self.drain_deadline: float | None = None
        self.reaped_others = 0
        self.tee: Tee | None = None  # the main child's stderr (with `explain`)

    # ------------------------------------------------------------ set-up

    def install(self) -> None:
        self.wakeup.install()

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        adopt: int | None = None,
        *,
        stderr_fd: int | None = None,
        tty: bool = False,
    ) -> int:
        """Run argv (or adopt `adopt`, a child already started: the worker's sshd, the
        launcher's mpirun, whose stderr pipe is `stderr_fd` and which holds the terminal
        if `tty`) until it and every descendant are gone; return the exit code."""
        self.argv, self.env = argv, env
        if adopt is None:
            early = self.terminated_before_start()
            if early is not None:
                return early
            self.start_child()
        else:
            self.adopt(adopt, stderr_fd, tty)
        while not self.finished():
            self.wait_for_event()
            self.forward_signals()
            self.serve_readers()
            self.run_duties()
            self.reap_children()
            self.keep_service_alive()
            self.end_leftovers()
        self.drain_child_output()
        return self.final_code()

    def terminated_before_start(self) -> int | None:
        """A terminating signal that arrived during the hand-off: do not start the job."""
        for signum in self.wakeup.read():
            if signum in signals.TERMINATING:
                self.log("signal before start", signal=signals.name(signum))
                return 0 if self.settings.restart else signal_exit_status(signum)
        return None

    def adopt(self, pid: int, stderr_fd: int | None, tty: bool) -> None:
        """Take over a child the agent started before its exec (children survive it)."""
        self.main, self.tty = pid, tty
        if stderr_fd is not None:
            os.set_inheritable(stderr_fd, False)
            os.set_blocking(stderr_fd, False)
            self.tee = Tee(stderr_fd, self.output)
        self.log("child adopted", pid=pid, program=self.argv[0])

    def start_child(self, **note: Any) -> None:
        """Start the main child as PID 1 runs it (proc/spawn.py start_main)."""
        self.main, err, self.tty = start_main(
            self.argv,
            self.env,
            group=self.settings.group,
            pipe_stderr=self.settings.explain_failure,
        )
        if err is not None:
            self.tee = Tee(err, self.output)
        self.log("child started", pid=self.main, program=self.argv[0], **note)

    # ------------------------------------------------------------ the loop's steps

    def finished(self) -> bool:
        """The main child has ended for good, no descendant is left (or they survived
        SIGKILL), and its stderr has reached its end (or the drain deadline passed)."""
        if (
            self.main_status is None
            or not (self.none_left or self.leftovers.abandoned)
            or any(d.busy() for d in self.duties)
        ):
            return False
        return (
            self.tee is None
            or not self.tee.open
            or (self.drain_deadline is not None and time.monotonic() >= self.drain_deadline)
        )

    def wait_for_event(self) -> None:
        restart = self.restarts.at if self.restarts else None
        timers = [
            t
            for t in (
                restart,
                self.leftovers.deadline,
                self.drain_deadline,
                self.kill_main_at,
                *(d.next_at() for d in self.duties),
            )
            if t is not None
        ]
        timeout = max(0.0, min(timers) - time.monotonic()) if timers else None
        tee = [self.tee.fd] if self.tee is not None and self.tee.open else []
        fds = [self.wakeup.fd, *self.readers, *tee]
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            ready = []
        self.ready = ready
        self.arrived = self.wakeup.read() if self.wakeup.fd in ready else []

    def forward_signals(self) -> None:
        for signum in self.arrived:
            if signum == signal.SIGCHLD:
                continue
            if signum in signals.TERMINATING:
                self.stopping = True
                self.stop_signal = self.stop_signal or signum
                self.cancel_restart()
            if self.main_status is None:
                self.forward(signum)

    def forward(self, signum: int) -> None:
        try:
            if self.settings.group:
                os.killpg(self.main, signum)
            else:
                os.kill(self.main, signum)
        except ProcessLookupError:
            return
        self.log(
            "signal forwarded",
            signal=signals.name(signum),
            pid=self.main,
            group=self.settings.group,
        )

    def serve_readers(self) -> None:
        for fd in self.ready:
            if self.tee is not None and fd == self.tee.fd:
                self.tee.read()
            elif fd in self.readers:
                try:
                    self.readers[fd]()
                except Exception as exc:  # PID 1 must outlive a bad reader
                    self.readers.pop(fd, None)
                    self.log("reader failed", level="error", fd=fd, error=repr(exc))

    def run_duties(self) -> None:
        now = time.monotonic()
        for duty in self.duties:
            duty.tick(now)
        if self.kill_main_at is not None and now >= self.kill_main_at:
            self.kill_main_at = None
            if self.main_status is None:
                self.log("killing", level="warning", pid=self.main)
                self.signal_main(signal.SIGKILL)

    def request_stop(self, why: str, code: int = 0) -> None:
        """End the service for good (a worker: its job is done, or its launcher lost):
        SIGTERM to it; the agent then exits `code`."""
        if self.stopping:
            return
        self.log("stopping", reason=why)
        if code:
            self.verdict.ended_by(code, why, "", "")
        self.stopping = True
        self.cancel_restart()
        if self.main_status is None:
            self.forward(signal.SIGTERM)

    def end_main(self, code: int, reason: str, fix: str, host: str) -> None:
        """A duty ends the job (a worker was lost): SIGTERM to the main child and its
        group, SIGKILL after END_MAIN_SECONDS (mpirun may wait on a daemon that will
        never answer); the agent then exits `code`, saying `reason` and `fix`."""
        self.verdict.ended_by(code, reason, fix, host)
        if self.main_status is None and self.kill_main_at is None:
            self.signal_main(signal.SIGTERM)
            self.kill_main_at = time.monotonic() + min(self.settings.grace, END_MAIN_SECONDS)

    def signal_main(self, signum: int) -> None:
        """The main child, and its process group if it leads one."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(self.main) == self.main:
                os.killpg(self.main, signum)
            else:
                os.kill(self.main, signum)

    def reap_children(self) -> None:
        """Collect every dead child (WNOHANG until none is ready, or none is left)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.none_left = True
                return
            if pid == 0:
                self.none_left = False
                return
            if pid == self.main and self.main_status is None:
                self.main_ended(status)
            else:
                self.reaped_others += 1
                self.log("reaped", level="debug", pid=pid, code=exit_code(status))

    def main_ended(self, status: int) -> None:
        code = exit_code(status)
        self.log("child exited", pid=self.main, code=code)
        if self.restarts is not None and not self.stopping:
            delay = self.restarts.died(time.monotonic())
            deaths, window = len(self.restarts.deaths), self.restarts.policy.window
            if delay is not None:
                self.log(
                    "restarting",
                    program=self.argv[0],
                    in_s=round(delay, 2),
                    deaths_in_window=deaths,
                )
                return
            self.log(
                "giving up",
                level="error",
                program=self.argv[0],
                reason=f"{self.argv[0]} died {deaths} times in {window:g} s; exiting "
                "so that Kubernetes restarts the pod",
            )
            self.verdict.reason = (
                f"{self.argv[0]} keeps dying ({deaths} times in {window:g} s, last exit {code})"
            )
            self.output.write(
                f"mpi-bootstrap: {printable(self.verdict.reason, lines=False)}; "
                "giving up so that Kubernetes restarts the pod\n".encode()
            )
        self.main_status = status
        self.verdict.signaled = os.WIFSIGNALED(status)
        self.kill_main_at = None
        for hook in self.on_exit:
            hook(code)

    def cancel_restart(self) -> None:
        if self.restarts is not None:
            self.restarts.at = None

    def keep_service_alive(self) -> None:
        if self.restarts is not None and self.restarts.due(time.monotonic()):
            self.start_child(restarted=True)

    def end_leftovers(self) -> None:
        """After the main child: what is left ended (leftovers.py); once none is left, a
        last moment for its stderr to reach its end."""
        if self.main_status is None:
            return
        now = time.monotonic()
        if self.none_left or self.leftovers.abandoned:
            if self.tee is not None and self.tee.open and self.drain_deadline is None:
                self.drain_deadline = now + DRAIN_SECONDS
            return
        self.leftovers.step(now)

    # ------------------------------------------------------------ the end

    def drain_child_output(self) -> None:
        """What mpirun wrote last is not lost: read the pipe to its end (its writers are
        gone) before the explanation and the exit."""
        if self.tee is not None:
            self.tee.drain()

    def final_code(self) -> int:
        """The agent's exit code: the main child's, or the verdict's (pid1/verdict.py)."""
        if self.reaped_others:
            self.log("reaped others", count=self.reaped_others)
        if self.restarts is not None:
            if self.restarts.given_up:
                return int(ExitStatus.PEER_UNAVAILABLE)
            return self.verdict.code or 0  # 0: stopped as asked (its job done)
        if self.verdict.code is not None and not self.stop_signal:
            return self.verdict.code
        code = exit_code(self.main_status if self.main_status is not None else 0)
        if self.settings.explain_failure and not self.stop_signal:
            code = self.verdict.read(
                code,
                bytes(self.tee.tail) if self.tee else b"",
                self.terminating_signal_arrived,
                self.output,
                self.log,
            )
        if self.stop_signal and code not in (0, signal_exit_status(self.stop_signal)):
            # mpirun chose its own code (MPICH: 255) for a job we were told to end; the
            # orchestrator must see that it was ended by the signal: 128+N, like tini.
            self.log(
                "stopped by signal",
                signal=signals.name(self.stop_signal),
                child_code=code,
                code=signal_exit_status(self.stop_signal),
            )
            return signal_exit_status(self.stop_signal)
        return code

    # ------------------------------------------------------------ helpers

    def terminating_signal_arrived(self) -> bool:
        """For the explainer, between chunks of its work: has TERM/INT/HUP/QUIT come?"""
        arrived = self.wakeup.read()
        self.arrived.extend(arrived)
        return any(s in signals.TERMINATING for s in arrived)
