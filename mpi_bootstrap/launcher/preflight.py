"""Before mpirun: every worker's sshd answers, and a real `ssh` session to each finds the
MPI's remote daemon and receives LD_LIBRARY_PATH — checked in parallel, one deadline.
A failure is one line naming the host and the reason (exit 69), and mpirun never starts.
What a session runs and must show is remotecheck.py's; one worker's session, with its
retries, session.py's; here, all of them at once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from mpi_bootstrap.core import failures, liveness
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher.remotecheck import (
    RemoteCheck,
    check_output,
    program_of,
    program_problem,
    ranks_path,
)
from mpi_bootstrap.launcher.session import Session, banner
from mpi_bootstrap.proc import children
from mpi_bootstrap.system import parallel

__all__ = [
    "Passed",
    "RemoteCheck",
    "check_output",
    "program_of",
    "program_problem",
    "ranks_path",
    "run",
    "transient",
    "wait_sshd",
]
# ssh's words for its failures are core/failures.py's (the one table of them).
transient = failures.transient


def _failures(items: Sequence[str], fn: Callable[[str], str | None]) -> dict[str, str]:
    """Run fn on every item at once (bounded); the failures, in the order of `items`."""
    results = parallel.map_all(fn, items, parallel.SSH_AT_ONCE)
    return {item: result for item, result in zip(items, results, strict=True) if result}


def _unreachable(failed: Mapping[str, str]) -> PeerUnavailableError:
    return PeerUnavailableError(
        f"worker unreachable: {some(list(failed.values()))}",
        details="\n".join(failed.values()),
        phase="sshd wait",
        host=next(iter(failed), None),
    )


def wait_sshd(targets: Mapping[str, tuple[str, int]], deadline: float, log: Log) -> None:
    """Every worker's sshd answers with an SSH banner before `deadline` (monotonic)."""
    failed = _failures(sorted(targets), lambda name: banner(name, targets[name], deadline))
    if failed:
        raise _unreachable(failed)
    log("sshd ready", workers=len(targets))


def run(
    hosts: Sequence[str],
    ssh_command: Sequence[str],
    check: RemoteCheck,
    *,
    env: Mapping[str, str],
    deadline: float,
    log: Log,
    targets: Mapping[str, tuple[str, int]] | None = None,
    passed: Callable[[str], None] | None = None,
    then: Mapping[str, str] | None = None,
) -> Passed:
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
    sessions = {
        h: Session(
            h,
            list(ssh_command),
            dataclasses.replace(check, then=then[h]) if then and h in then else check,
            env,
            log,
            expect_sshd=h in endpoints,
        )
        for h in hosts
    }

    def one(host: str) -> str | None:
        return sessions[host].until_done(deadline, endpoints.get(host), passed)

    try:
        raise_failures(list(hosts), sessions, _failures(list(hosts), one))
    except BaseException:
        release(sessions.values())
        raise
    log("preflight ok", workers=len(hosts), elapsed_s=round(time.monotonic() - started, 3))
    return Passed(
        {h: s.kept for h, s in sessions.items() if s.kept is not None},
        {h: s.claimed for h, s in sessions.items() if s.claimed is not None},
    )


@dataclasses.dataclass(frozen=True)
class Passed:
    """What preflight leaves for what follows: the sessions still running `check.then`
    (the caller ends them) and the workers' answers to the claim, by host."""

    opened: Mapping[str, children.Lines]
    claims: Mapping[str, liveness.Claimed]


def raise_failures(
    hosts: list[str], sessions: Mapping[str, Session], failed: Mapping[str, str]
) -> None:
    unreachable = {h: s.unreachable for h, s in sessions.items() if s.unreachable is not None}
    if unreachable:
        raise _unreachable({h: unreachable[h] for h in hosts if h in unreachable})
    if failed:
        first = next(iter(failed))  # in the order of `hosts`
        error = NotSetUpError if sessions[first].not_set_up else PeerUnavailableError
        raise error(
            f"preflight: {some(list(failed.values()))}",
            details="\n".join(failed.values()) if len(failed) > 1 else "",
            phase="preflight",
            host=first,
        )


def release(sessions: Iterable[Session]) -> None:
    """End every kept session (all at once)."""
    sessions = list(sessions)
    children.close_all([s.kept.child for s in sessions if s.kept is not None], 1.0)
    for s in sessions:
        s.kept = None
