"""Before mpirun: every worker's sshd answers, and a real `ssh` session to each finds the
MPI's remote daemon and receives LD_LIBRARY_PATH — checked in parallel, one deadline.
A failure is one line naming the host and the reason (exit 69), and mpirun never starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from mpi_bootstrap.core import failures, liveness, remote
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, shown, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher.mpi import MPIInfo
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh import sshd
from mpi_bootstrap.system import parallel
from mpi_bootstrap.system.retry import PEER, retry_until


@dataclasses.dataclass(frozen=True)
class RemoteCheck:
    """What one ssh session on a worker must show before mpirun may start."""

    mpi: MPIInfo
    prefix: str | None  # Open MPI's --prefix: where its daemon is looked for
    want_ld: str | None  # the LD_LIBRARY_PATH the session must receive
    program: str | None = None  # the user's program: bare name or absolute path
    ranks_path: str | None = None  # the PATH the ranks get (None: the session's own)
    expected: str | None = None  # where `program` resolves on the launcher, if it does
    # Consecutive refused connections tolerated before failing with `refused_hint`
    # (None: until the deadline — a worker's sshd may be restarting, or still coming).
    refused_patience: float | None = None
    refused_hint: str = ""
    # A command the same session runs once the check has printed its report (the data
    # check's program): the session is then kept open and handed over (`run`'s result).
    then: str | None = None
    # This launch's session key: the session first claims the worker with it
    # (core/remote.py `claim`, core/liveness.py); None: no claim.
    claim: str | None = dataclasses.field(default=None, repr=False)

    def script(self) -> str:
        """Where is the daemon, what LD_LIBRARY_PATH arrived, and where the program
        resolves with the ranks' PATH (core/remote.py); then `then`, after a marker."""
        # Open MPI with --prefix runs PREFIX/bin/orted; hydra runs its proxy from mpiexec's
        # own directory; otherwise the non-interactive PATH must find it (mpi-operator #488).
        bindir = os.path.join(self.mpi.prefix, "bin")  # where mpirun really is
        dirs = [d for d in dict.fromkeys([f"{self.prefix}/bin" if self.prefix else "",
                                          bindir]) if d]
        check = remote.script(self.mpi.runtime.daemons, dirs, self.program, self.ranks_path)
        if self.claim:
            check = f"{remote.claim()}; {check}"
        return f"{check}; echo {END}; {self.then}" if self.then else check

    def stdin(self) -> bytes:
        """What the session reads first: the claim's key (never on a command line)."""
        return liveness.claim_line(self.claim).encode() if self.claim else b""


END = "END-OF-CHECK"  # between the check's report and what the session runs `then`


def program_of(argv: Sequence[str], program_index: int) -> str | None:
    """The user's program as mpirun will start it, if one can be told (the first of an
    MPMD command line); relative paths are left alone (mpirun's working directory)."""
    if program_index >= len(argv):
        return None
    program = argv[program_index]
    return program if "/" not in program or program.startswith("/") else None


def ranks_path(env: Mapping[str, str], forwarded: Sequence[str], prefix: str | None
               ) -> str | None:
    """The PATH the ranks get: the launcher's, forwarded by name — with Open MPI's
    --prefix, PREFIX/bin put first (mpirun(1)); None when PATH is not forwarded."""
    if "PATH" not in forwarded or "PATH" not in env:
        return None
    return f"{prefix}/bin:{env['PATH']}" if prefix else env["PATH"]


RETRY_DELAY = 0.3
# ssh's words for its failures are core/failures.py's (the one table of them).
transient, unreached = failures.transient, failures.unreached


def check_output(host: str, output: str, check: RemoteCheck) -> str | None:
    """None if the session is fit for mpirun, else the reason."""
    report = remote.parse(output)  # what the worker's shell printed: shown escaped
    if report.missing:
        return (f"{host}: {shown(report.missing[0])} not found by a non-interactive ssh "
                f"session (PATH={shown(report.path, 400)}); install {check.mpi.vendor} there "
                "or use an image with it")
    if not report.ran:
        return f"{host}: the remote shell did not run the check (output: {output[:200]!r})"
    if check.want_ld and check.want_ld not in report.ld:
        return (f"{host}: LD_LIBRARY_PATH did not arrive in the ssh session (got "
                f"{report.ld!r}); the worker's sshd must AcceptEnv it")
    return program_problem(host, report.program, check)


def program_problem(host: str, found: str | None, check: RemoteCheck) -> str | None:
    """The program the ranks start must be there, and the same one as on the launcher: a
    bare `python3` that leaves the image's venv on some host fails late and obscurely."""
    if not check.program or found is None:
        return None
    where = f"with the PATH the ranks get ({check.ranks_path})" if check.ranks_path else \
        "with the ssh session's PATH"
    if found == "missing":
        return (f"{host}: the program {check.program!r} is not found there {where}; "
                "install it at the same path on every pod, or name it by its full path")
    if check.expected and found != check.expected:
        return (f"{host}: the program {check.program!r} is {shown(found, 400)} there but "
                f"{check.expected} on the launcher ({where}); install it at the same path "
                "on every pod, or name it by its full path")
    return None


def _failures(items: Sequence[str], fn: Callable[[str], str | None]) -> dict[str, str]:
    """Run fn on every item at once (bounded); the failures, in the order of `items`."""
    results = parallel.map_all(fn, items, parallel.SSH_AT_ONCE)
    return {item: result for item, result in zip(items, results, strict=True) if result}


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
    return f"{name}: no sshd answers on {address}:{port}"


def _unreachable(failed: Mapping[str, str]) -> PeerUnavailableError:
    return PeerUnavailableError(f"worker unreachable: {some(list(failed.values()))}",
                                details="\n".join(failed.values()), phase="sshd wait",
                                host=next(iter(failed), None))


def wait_sshd(targets: Mapping[str, tuple[str, int]], deadline: float, log: Log) -> None:
    """Every worker's sshd answers with an SSH banner before `deadline` (monotonic)."""
    failed = _failures(sorted(targets), lambda name: banner(name, targets[name], deadline))
    if failed:
        raise _unreachable(failed)
    log("sshd ready", workers=len(targets))


class _Session:
    """One worker's preflight: ssh until the check passes, fails for good, or time is up.
    A refused connection is retried (a worker's supervisor restarts a dead sshd within a
    second), with backoff, unless refusals are all there has been for too long."""

    def __init__(self, host: str, argv: list[str], check: RemoteCheck, env: Mapping[str, str],
                 log: Log, *, expect_sshd: bool = False) -> None:
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

    def session(self, deadline: float) -> tuple[int, str]:
        """One ssh session: (exit code, what it printed). With `check.then`, the session
        is kept once the check has reported (code 0) rather than awaited."""
        quick = ["-o", f"ConnectTimeout={BANNER_S}", "-o", "ConnectionAttempts=1"] if \
            self.expect_sshd and not self.awaited else []
        argv = [*self.argv, *quick, self.host, self.check.script()]
        timeout = max(1.0, deadline - time.monotonic())
        if not self.check.then:
            return children.capture(argv, env=self.env, timeout=timeout,
                                    stdin=self.check.stdin())
        child = children.open_piped(argv, self.env)
        with contextlib.suppress(OSError):  # a session that ended at once: said below
            child.stdin.write(self.check.stdin())  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
        lines = children.Lines(child)
        report: list[str] = []
        end = time.monotonic() + timeout  # for the whole report, as capture's timeout
        while (line := lines.next(end)) is not None:
            if line == END:
                self.kept = lines
                return 0, "\n".join(report)
            report.append(line)
        timed_out = not lines.eof
        code, err = children.close_piped(child, 1.0)
        output = "\n".join([*report, lines.rest(), err])
        return (124, f"{output}\n(timed out after {timeout:g} s)") if timed_out else \
            (code, output)

    def release(self) -> None:
        """End the kept session, if any."""
        if self.kept is not None:
            children.close_piped(self.kept.child, 1.0)
            self.kept = None

    def attempt(self, deadline: float) -> bool | None:
        """True when done (passed, or `final` says why not); None to try again."""
        code, output = self.session(deadline)
        if code == 0:
            self.final = check_output(self.host, output, self.check)
            if self.final is not None:
                self.release()
            elif self.check.claim:
                self.claimed = claimed(self.host, remote.parse(output).claim, self.log)
            return True
        self.reason = failures.explain_ssh(self.host, output, code)
        self.unreached = unreached(code, output)
        now = time.monotonic()
        if not failures.refused(output):
            self.refused_since = None
        else:
            self.refused_since = self.refused_since or now
            if self.check.refused_patience is not None and \
                    now - self.refused_since >= self.check.refused_patience:
                self.final = (f"{self.reason} (port {failures.refused_port(output)}); "
                              f"{self.check.refused_hint}")
                self.not_set_up = True
                return True
        if not transient(code, output):
            self.final = self.reason
            return True
        self.tries += 1
        if self.tries == 1:  # said once per host
            self.log("preflight retry", level="warning", host=self.host, reason=self.reason)
        return None


def run(hosts: Sequence[str], ssh_command: Sequence[str], check: RemoteCheck, *,
        env: Mapping[str, str], deadline: float, log: Log,
        targets: Mapping[str, tuple[str, int]] | None = None,
        passed: Callable[[str], None] | None = None,
        then: Mapping[str, str] | None = None) -> Passed:
    """ssh to every host in parallel; raise PeerUnavailableError naming the first failure
    (NotSetUpError when the workers' sshd was never set up). With `targets`, a host whose
    first ssh finds no SSH server (`unreached`) has its sshd awaited (its banner) in the
    same step, then is tried again: "no sshd answers on ADDRESS:PORT" if it never does.
    A worker publishes its record once its sshd listens, so the first ssh normally just
    works, and sshd is spared a connection (a fork and an exec) that only said hello.
    With `check.then`, the sessions still running it, by host (the caller ends them);
    none are left running on a failure. `passed(host)` as soon as a host has passed (the
    launch gate lets mpirun's ssh through to it: its connection is there to reuse).
    `then`: a host's own `check.then` (its data check's session), by host."""
    started = time.monotonic()
    endpoints = dict(targets or {})
    sessions = {h: _Session(h, list(ssh_command),
                            dataclasses.replace(check, then=then[h]) if then and h in then
                            else check, env, log, expect_sshd=h in endpoints)
                for h in hosts}
    unreachable: dict[str, str] = {}

    def attempt(host: str) -> bool | None:
        s = sessions[host]
        done = s.attempt(deadline)
        if not s.expect_sshd or s.awaited or not s.unreached:
            return done
        s.awaited = True  # once: after that, ssh's own retries take it from here
        why = banner(host, endpoints[host], deadline)
        if why is not None:
            unreachable[host] = why
            return True
        s.final, s.not_set_up = None, False  # it answers now: what ssh said is history
        return None

    def one(host: str) -> str | None:
        s = sessions[host]
        done = retry_until(deadline, lambda: attempt(host), every=RETRY_DELAY,
                           backoff=2.0, most=2.0)
        if host in unreachable:
            return unreachable[host]
        if done and s.final is None and passed is not None:
            passed(host)
        return s.final if done else s.reason

    try:
        _raise_failures(list(hosts), sessions, unreachable, _failures(list(hosts), one))
    except BaseException:
        _release(sessions.values())
        raise
    log("preflight ok", workers=len(hosts), elapsed_s=round(time.monotonic() - started, 3))
    return Passed({h: s.kept for h, s in sessions.items() if s.kept is not None},
                  {h: s.claimed for h, s in sessions.items() if s.claimed is not None})


@dataclasses.dataclass(frozen=True)
class Passed:
    """What preflight leaves for what follows: the sessions still running `check.then`
    (the caller ends them) and the workers' answers to the claim, by host."""

    opened: Mapping[str, children.Lines]
    claims: Mapping[str, liveness.Claimed]


def claimed(host: str, said: str | None, log: Log) -> liveness.Claimed | None:
    """The worker's answer to the claim, logged: what an earlier launch had left there."""
    answer = liveness.parse_claimed(said or "none")
    if isinstance(answer, str):
        log("not claimed", level="warning" if answer != "none" else "debug", host=host,
            said=shown(answer), reason="no liveness for this worker (its agent does not "
            "serve claims: `mpi-bootstrap worker` with an sshd of OpenSSH 8.7 or later)")
        return None
    if answer.ended:
        log("earlier launch cleared", host=host, processes=answer.ended,
            names=list(answer.names))
    return answer


def _raise_failures(hosts: list[str], sessions: Mapping[str, _Session],
                    unreachable: Mapping[str, str], failed: Mapping[str, str]) -> None:
    if unreachable:
        raise _unreachable({h: unreachable[h] for h in hosts if h in unreachable})
    if failed:
        first = next(iter(failed))  # in the order of `hosts`
        error = NotSetUpError if sessions[first].not_set_up else PeerUnavailableError
        raise error(f"preflight: {some(list(failed.values()))}",
                    details="\n".join(failed.values()) if len(failed) > 1 else "",
                    phase="preflight", host=first)


def _release(sessions: Iterable[_Session]) -> None:
    """End every kept session (all at once)."""
    sessions = list(sessions)
    children.close_all([s.kept.child for s in sessions if s.kept is not None], 1.0)
    for s in sessions:
        s.kept = None
