"""Before mpirun: every worker's sshd answers, and a real `ssh` session to each finds the
MPI's remote daemon and receives LD_LIBRARY_PATH — each as it arrives, one deadline
(launcher/pipeline.py `Each`). A failure is one line naming the host and the reason
(exit 69), and no rank starts. What a session runs and must show is remotecheck.py's;
one worker's session, with its retries, session.py's; here, what is said of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from mpi_bootstrap.core import failures
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
    "RemoteCheck",
    "check_output",
    "program_of",
    "program_problem",
    "ranks_path",
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
