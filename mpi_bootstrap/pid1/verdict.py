"""How the job ended: the agent's exit code and, when known, why, what to do, and the
pod at fault — what the resident PID 1 prints, returns and writes to the termination
message (core/termination.py). Standard library only."""

from __future__ import annotations

from collections.abc import Callable

from mpi_bootstrap.core.errors import MEANINGS, ExitStatus
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.pid1.output import Output


class Verdict:
    def __init__(self) -> None:
        self.code: int | None = None  # the agent's own code, when not the main child's
        self.reason, self.fix, self.host = "", "", ""
        self.signaled = False  # the main child died of a signal (not a code above 128)

    def ended_by(self, code: int, reason: str, fix: str, host: str) -> None:
        """The agent ended the job itself (a lost worker): the first word stands."""
        if self.code is None:
            self.code, self.reason, self.fix, self.host = code, reason, fix, host

    def read(
        self, code: int, tail: bytes, stop: Callable[[], bool], output: Output, log: Log
    ) -> int:
        """The main child ended with `code`, having said `tail`: explain a known failure
        (core/failures.py) and return the agent's code. A 0 stays 0, unless mpirun said
        it lost a worker: Open MPI 5 then exits 0 although the ranks there are gone."""
        # Imported once the job has ended: the explainer's tables (the MPIs' runtimes,
        # liveness and with it hashlib's OpenSSL) kept the resident PID 1 about 5 MiB
        # larger for the whole job (docs/benchmarks.md, "PID 1's memory").
        from mpi_bootstrap.core import failures

        found = failures.explain(tail.decode("utf-8", "replace"), stop=stop)
        if found is None or (code == 0 and found.signature != failures.WORKER_LOST):
            return code
        log("mpirun failure explained", signature=found.signature, code=code)
        if code == 0:
            lost = int(ExitStatus.WORKER_LOST)
            self.ended_by(
                lost, f"mpirun exited 0, but: {found.cause}", MEANINGS[lost][1], found.host or ""
            )
            output.write(
                f"mpi-bootstrap: mpirun exited 0, but it lost a worker: "
                f"{found.cause}.\n  What to do: {found.fix}.\n  Exit {lost}.\n".encode()
            )
            return lost
        self.reason, self.fix, self.host = (
            f"likely cause: {found.cause}",
            found.fix,
            found.host or "",
        )
        output.write(found.text(code).encode())
        return code
