"""What one worker's preflight session must show before any rank may start there: the
check it runs (core/remote.py's script, and the claim before it), and how its report is
judged — the MPI's daemon found, LD_LIBRARY_PATH arrived, the program the same as on the
launcher. Pure."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core import liveness, remote
from mpi_bootstrap.core.errors import shown
from mpi_bootstrap.launcher.mpi import MPIInfo

END = "END-OF-CHECK"  # between the check's report and what the session runs `then`


@dataclasses.dataclass(frozen=True)
class RemoteCheck:
    """What one ssh session on a worker must show before mpirun may start."""

    mpi: MPIInfo
    prefix: str | None  # Open MPI's --prefix: where its daemon is looked for
    want_ld: str | None  # the LD_LIBRARY_PATH the session must receive
    program: str | None = None  # the user's program: bare name or absolute path
    ranks_path: str | None = None  # the PATH the ranks get (None: the session's own)
    expected: str | None = None  # where `program` resolves on the launcher, if it does
    node: str | None = None  # sysfs: report the node too (an NCCL job: NCCL_* in its env)
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
    bound: float = 0.0  # the liveness bound the claim carries (the launcher's)

    def script(self) -> str:
        """Where is the daemon, what LD_LIBRARY_PATH arrived, and where the program
        resolves with the ranks' PATH (core/remote.py); then `then`, after a marker."""
        # Open MPI with --prefix runs PREFIX/bin/orted; hydra runs its proxy from mpiexec's
        # own directory; otherwise the non-interactive PATH must find it (mpi-operator #488).
        bindir = os.path.join(self.mpi.prefix, "bin")  # where mpirun really is
        dirs = [
            d for d in dict.fromkeys([f"{self.prefix}/bin" if self.prefix else "", bindir]) if d
        ]
        check = remote.script(self.mpi.runtime.daemons, dirs, self.program, self.ranks_path)
        check += f"; {remote.node(self.node)}" if self.node else ""
        if self.claim:
            check = f"{remote.claim()}; {check}"
        return f"{check}; echo {END}; {self.then}" if self.then else check

    def stdin(self) -> bytes:
        """What the session reads first: the claim's key and bound (never on a command
        line)."""
        return liveness.claim_line(self.claim, self.bound).encode() if self.claim else b""


def program_of(argv: Sequence[str], program_index: int) -> str | None:
    """The user's program as mpirun will start it, if one can be told (the first of an
    MPMD command line); relative paths are left alone (mpirun's working directory)."""
    if program_index >= len(argv):
        return None
    program = argv[program_index]
    return program if "/" not in program or program.startswith("/") else None


def ranks_path(env: Mapping[str, str], forwarded: Sequence[str], prefix: str | None) -> str | None:
    """The PATH the ranks get: the launcher's, forwarded by name — with Open MPI's
    --prefix, PREFIX/bin put first (mpirun(1)); None when PATH is not forwarded."""
    if "PATH" not in forwarded or "PATH" not in env:
        return None
    return f"{prefix}/bin:{env['PATH']}" if prefix else env["PATH"]


def check_output(host: str, output: str, check: RemoteCheck) -> str | None:
    """None if the session is fit for mpirun, else the reason."""
    report = remote.parse(output)  # what the worker's shell printed: shown escaped
    if report.missing:
        return (
            f"{host}: {shown(report.missing[0])} not found by a non-interactive ssh "
            f"session (PATH={shown(report.path, 400)}); install {check.mpi.vendor} there "
            "or use an image with it"
        )
    if not report.ran:
        return f"{host}: the remote shell did not run the check (output: {output[:200]!r})"
    if report.unparsed:
        return f"{host}: its node report does not parse ({report.unparsed})"
    if check.want_ld and check.want_ld not in report.ld:
        return (
            f"{host}: LD_LIBRARY_PATH did not arrive in the ssh session (got "
            f"{report.ld!r}); the worker's sshd must AcceptEnv it"
        )
    return program_problem(host, report.program, check)


def program_problem(host: str, found: str | None, check: RemoteCheck) -> str | None:
    """The program the ranks start must be there, and the same one as on the launcher: a
    bare `python3` that leaves the image's venv on some host fails late and obscurely."""
    if not check.program or found is None:
        return None
    where = (
        f"with the PATH the ranks get ({check.ranks_path})"
        if check.ranks_path
        else "with the ssh session's PATH"
    )
    if found == "missing":
        return (
            f"{host}: the program {check.program!r} is not found there {where}; "
            "install it at the same path on every pod, or name it by its full path"
        )
    if check.expected and found != check.expected:
        return (
            f"{host}: the program {check.program!r} is {shown(found, 400)} there but "
            f"{check.expected} on the launcher ({where}); install it at the same path "
            "on every pod, or name it by its full path"
        )
    return None
