"""Before mpirun: every worker's sshd answers, and a real `ssh` session to each finds the
MPI's remote daemon and receives LD_LIBRARY_PATH, one deadline. One worker's preflight
is its session (`Session`), tried again until the check passes, fails for good, or time
is up; launcher/pipeline.py `Each` runs one per worker as each arrives. A failure is one
line naming the host and the reason (exit 69), and no rank starts. Also the wait for an
sshd's banner, where a worker's record says it listens (`wait_sshd`: no preflight)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping

from mpi_bootstrap.core import failures, liveness, remote
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, shown, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher.remotecheck import END, RemoteCheck, check_output
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh import sshd
from mpi_bootstrap.system import parallel
from mpi_bootstrap.system.retry import PEER, retry_until

RETRY_DELAY = 0.3
# What one preflight session may print: its report is a few KiB (a GID table of every
# RDMA port included). Past it the worker fails, and nothing more of it is read.
REPORT_LIMIT = 1 << 20
TOO_LONG = -1  # session()'s code for a session ended at REPORT_LIMIT
STDOUT = -2  # subprocess.STDOUT: ssh's own errors come in order with the report
# ssh's words for its failures are core/failures.py's (the one table of them).
transient, unreached = failures.transient, failures.unreached


# How long one try to reach a worker's sshd may take (its banner; preflight's first ssh
# to a worker with a record, as ConnectTimeout): a gone pod's SYNs are never answered.
BANNER_S = 2


def banner(name: str, target: tuple[str, int], deadline: float) -> str | None:
    """None once the worker's sshd answers with an SSH banner, else why not by `deadline`."""
    address, port = target

    def answers() -> bool | None:
        left = deadline - time.monotonic()
        return sshd.answers(address, port, timeout=min(BANNER_S, max(0.1, left))) or None

    if retry_until(deadline, answers, every=PEER):
        return None
    return f"{name}: no sshd answers on {f'[{address}]' if ':' in address else address}:{port}"


class Session:
    """One worker's preflight: ssh until the check passes, fails for good, or time is up.
    A refused connection is retried (a worker's supervisor restarts a dead sshd within a
    second), with backoff, unless refusals are all there has been for too long."""

    def __init__(
        self,
        host: str,
        argv: list[str],
        check: RemoteCheck,
        env: Mapping[str, str],
        log: Log,
        *,
        expect_sshd: bool = False,
    ) -> None:
        self.host, self.argv, self.check, self.env, self.log = host, argv, check, env, log
        self.refused_since: float | None = None
        self.reason: str | None = None  # the last failure, when the deadline ends the wait
        self.final: str | None = None  # a failure no retry cures
        self.not_set_up = False  # only refusals, for longer than check.refused_patience
        self.tries = 0
        self.unreached = False  # the last try found no SSH server (`unreached`)
        # A record says its sshd listens: the first ssh is given BANNER_S to reach it,
        # then its banner is waited for (`awaited`) before ssh is tried again.
        self.expect_sshd = expect_sshd
        self.awaited = False
        self.kept: children.Lines | None = None  # the session running `check.then`, once it passed
        self.claimed: liveness.Claimed | None = None  # the worker's answer to the claim
        self.report: remote.Report | None = None  # what its check reported, once passed
        self.unreachable: str | None = None  # its sshd never answered: why

    def session(self, deadline: float) -> tuple[int, str]:
        """One ssh session: (exit code, what it printed, stderr with stdout). With
        `check.then`, the session is kept once the check has reported (code 0) rather
        than awaited. What it prints is read up to REPORT_LIMIT bytes: past that the
        session is ended and the worker fails (TOO_LONG; a worker's login shell printed
        300 MiB into the launcher's memory: tests/test_report_budget.py)."""
        quick = (
            ["-o", f"ConnectTimeout={BANNER_S}", "-o", "ConnectionAttempts=1"]
            if self.expect_sshd and not self.awaited
            else []
        )
        argv = [*self.argv, *quick, self.host, self.check.script()]
        timeout = max(1.0, deadline - time.monotonic())
        # stderr with stdout, but where the session is kept: its stdout then carries the
        # data check's lines (ssh/datacheck.py), and its stderr the ssh's last words.
        child = children.open_piped(argv, self.env, stderr=-1 if self.check.then else STDOUT)
        with contextlib.suppress(OSError):  # a session that ended at once: said below
            child.stdin.write(self.check.stdin())  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            if not self.check.then:  # the input is all there is: the remote side reads EOF
                child.stdin.close()  # type: ignore[union-attr]
        lines = children.Lines(child, limit=REPORT_LIMIT)
        report: list[str] = []
        size, end = 0, time.monotonic() + timeout  # for the whole report
        while (line := lines.next(end)) is not None:
            if self.check.then and line == END:
                self.kept = lines
                return 0, "\n".join(report)
            report.append(line)
            size += len(line) + 1
            if size > REPORT_LIMIT:
                children.kill_piped(child)
                return TOO_LONG, (
                    f"{self.host}: report too long: its ssh session printed over "
                    f"{REPORT_LIMIT >> 10} KiB (its first line: {shown(report[0], 200)})"
                )
        timed_out = not lines.eof
        code, err = children.close_piped(child, 1.0)
        output = "\n".join([*report, lines.rest(), err])
        return (124, f"{output}\n(timed out after {timeout:g} s)") if timed_out else (code, output)

    def release(self) -> None:
        """End the kept session, if any."""
        if self.kept is not None:
            children.close_piped(self.kept.child, 1.0)
            self.kept = None

    def until_done(
        self,
        deadline: float,
        endpoint: tuple[str, int] | None,
        passed: Callable[[str], None] | None,
    ) -> str | None:
        """Try until it passes (then `passed(host)`: the launch gate may let mpirun's ssh
        through), fails for good, or the deadline comes; None, or why not. A host whose
        first ssh finds no SSH server (`unreached`) has its sshd awaited (its banner, at
        `endpoint`) once, then is tried again: "no sshd answers on ADDRESS:PORT" if never."""

        def attempt() -> bool | None:
            done = self.attempt(deadline)
            if endpoint is None or self.awaited or not self.unreached:
                return done
            self.awaited = True  # once: after that, ssh's own retries take it from here
            self.unreachable = banner(self.host, endpoint, deadline)
            if self.unreachable is not None:
                return True
            self.final, self.not_set_up = None, False  # it answers now: history
            return None

        done = retry_until(deadline, attempt, every=RETRY_DELAY, backoff=2.0, most=2.0)
        if self.unreachable is not None:
            return self.unreachable
        if done and self.final is None and passed is not None:
            passed(self.host)
        return self.final if done else self.reason

    def attempt(self, deadline: float) -> bool | None:
        """True when done (passed, or `final` says why not); None to try again."""
        code, output = self.session(deadline)
        if code == TOO_LONG:
            self.final = output
            return True
        if code == 0:
            self.final = check_output(self.host, output, self.check)
            self.report = remote.parse(output)
            if self.final is not None:
                self.release()
            elif self.check.claim:
                self.claimed = claimed(self.host, self.report.claim, self.log)
            return True
        self.reason = failures.explain_ssh(self.host, output, code)
        self.unreached = unreached(code, output)
        now = time.monotonic()
        if not failures.refused(output):
            self.refused_since = None
        else:
            self.refused_since = self.refused_since or now
            if (
                self.check.refused_patience is not None
                and now - self.refused_since >= self.check.refused_patience
            ):
                self.final = (
                    f"{self.reason} (port {failures.refused_port(output)}); "
                    f"{self.check.refused_hint}"
                )
                self.not_set_up = True
                return True
        if not transient(code, output):
            self.final = self.reason
            return True
        self.tries += 1
        if self.tries == 1:  # said once per host
            self.log("preflight retry", level="warning", host=self.host, reason=self.reason)
        return None


def claimed(host: str, said: str | None, log: Log) -> liveness.Claimed | None:
    """The worker's answer to the claim, logged: what an earlier launch had left there."""
    answer = liveness.parse_claimed(said or "none")
    if isinstance(answer, str):
        log(
            "not claimed",
            level="warning" if answer != "none" else "debug",
            host=host,
            said=shown(answer),
            reason="no liveness for this worker (its agent does not "
            "serve claims: `mpi-bootstrap worker` with an sshd of OpenSSH 8.7 or later)",
        )
        return None
    if answer.ended:
        log("earlier launch cleared", host=host, processes=answer.ended, names=list(answer.names))
    return answer


def _unreachable(failed: Mapping[str, str]) -> PeerUnavailableError:
    return PeerUnavailableError(
        f"worker unreachable: {some(list(failed.values()))}",
        details="\n".join(failed.values()),
        phase="sshd wait",
        host=next(iter(failed), None),
    )


def wait_sshd(targets: Mapping[str, tuple[str, int]], deadline: float, log: Log) -> None:
    """Every worker's sshd answers with an SSH banner before `deadline` (monotonic)."""
    names = sorted(targets)
    whys = parallel.map_all(lambda n: banner(n, targets[n], deadline), names, parallel.SSH_AT_ONCE)
    if failed := {n: why for n, why in zip(names, whys, strict=True) if why}:
        raise _unreachable(failed)
    log("sshd ready", workers=len(targets))


def failure(session: Session, why: str) -> PeerUnavailableError:
    """A worker's preflight that did not pass (`why`): its sshd never answered, nothing
    set it up (NotSetUpError), or what its check found."""
    if session.unreachable is not None:
        return _unreachable({session.host: session.unreachable})
    error = NotSetUpError if session.not_set_up else PeerUnavailableError
    return error(f"preflight: {why}", phase="preflight", host=session.host)


def release(sessions: Iterable[Session]) -> None:
    """End every kept session (all at once)."""
    sessions = list(sessions)
    children.close_all([s.kept.child for s in sessions if s.kept is not None], 1.0)
    for s in sessions:
        s.kept = None
