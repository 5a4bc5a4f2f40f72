"""A worker lost while the job ran: what the launcher's PID 1 says and does about it
(monitor.py notices, the supervisor ends mpirun). Standard library only."""

from __future__ import annotations

from mpi_bootstrap.core import failures
from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core.errors import MEANINGS, ExitStatus, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Monitor
from mpi_bootstrap.pid1.monitor import Lost, MonitorService
from mpi_bootstrap.pid1.supervisor import Supervisor


def describe(lost: list[Lost], total: int) -> str:
    """One line naming the lost worker(s), what was seen, and since when."""
    peer, seen, silent = lost[0]
    first = (
        f"{peer.name} ({peer.address}) lost while the job ran: {lv.SEEN[seen]}; "
        f"no answer for {silent:g} s"
    )
    if len(lost) == total > 1:
        return (
            f"every worker ({total}) lost at once, which points at this launcher's "
            f"own network (cut off?); the first: {first}"
        )
    if len(lost) > 1:
        return f"{first}; also lost: {some([p.name for p, _, _ in lost[1:]], shown=5)}"
    return first


def monitor(spec: Monitor, sup: Supervisor, log: Log) -> MonitorService:
    """Watch the spec's workers beside mpirun: a lost one ends mpirun (exit 75)."""
    code = int(ExitStatus.WORKER_LOST)

    def lost(found: list[Lost]) -> None:
        for peer, seen, silent in found:
            log(
                "worker lost",
                level="error",
                host=peer.name,
                address=peer.address,
                seen=lv.SEEN[seen],
                silent_s=silent,
            )
        reason = describe(found, len(spec.peers))
        ending = "mpirun has ended" if sup.main_status is not None else "ending mpirun"
        sup.output.write(f"mpi-bootstrap: worker {reason}; {ending} (exit {code})\n".encode())
        sup.end_main(code, f"worker {reason}", MEANINGS[code][1], found[0][0].name)

    def exited(code: int) -> None:
        # Open MPI 5 exits 0 after losing a daemon (pid1/verdict.py): mpirun's own words
        # then make every worker answer once more too, so the one gone is named by what
        # the agent saw of it, as after any other failure.
        said = bytes(sup.tee.tail).decode("utf-8", "replace") if sup.tee else ""
        found = failures.explain(said) if code == 0 else None
        service.main_exited(
            code, verify=code != 0 or getattr(found, "signature", "") == failures.WORKER_LOST
        )

    service = MonitorService(spec, log, sup.readers, lost)
    sup.duties.append(service)
    sup.on_exit.append(exited)
    return service
