"""Before mpirun: every worker's sshd answers, and a real `ssh` session to each finds the
MPI's remote daemon and receives LD_LIBRARY_PATH — checked in parallel, one deadline.
A failure is one line naming the host and the reason (exit 69), and mpirun never starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence

from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.launcher.mpi import HYDRA, INTEL, ORTE, MPIInfo
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh import sshd
from mpi_bootstrap.system import parallel

MAX_PARALLEL = 32


def daemon_names(mpi: MPIInfo) -> tuple[str, ...]:
    """The program mpirun starts on every worker over ssh."""
    if mpi.runtime == ORTE:
        return ("orted",)
    if mpi.runtime == HYDRA:
        return ("hydra_bstrap_proxy", "hydra_pmi_proxy") if mpi.vendor == INTEL else (
            "hydra_pmi_proxy",)
    return ("prted",)


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

    def script(self) -> str:
        """A POSIX sh script: where is the daemon, what LD_LIBRARY_PATH arrived, and where
        the program resolves with the ranks' PATH."""
        bindir = os.path.join(self.mpi.prefix, "bin")  # where mpirun really is
        # Open MPI with --prefix runs PREFIX/bin/orted; hydra runs its proxy from mpiexec's
        # own directory; otherwise the non-interactive PATH must find it (mpi-operator #488).
        dirs = [d for d in dict.fromkeys([f"{self.prefix}/bin" if self.prefix else "",
                                          bindir]) if d]
        checks = []
        for name in daemon_names(self.mpi):
            paths = " ".join(shlex.quote(f"{d}/{name}") for d in dirs)
            checks.append(
                f'found=""; for p in {paths}; do [ -x "$p" ] && found="$p" && break; done; '
                f'[ -n "$found" ] || found=$(command -v {shlex.quote(name)} 2>/dev/null); '
                f'echo "DAEMON {name} ${{found:-missing}}"')
        checks += ['echo "LD $LD_LIBRARY_PATH"', 'echo "PATH $PATH"']
        if self.program and "/" not in self.program:
            # The file execvp would run (`command -v` would name a shell builtin instead).
            path = shlex.quote(self.ranks_path) if self.ranks_path else '"$PATH"'
            prog = shlex.quote(self.program)
            checks.append(
                f'found=""; P={path}; old="$IFS"; IFS=:; for d in $P; do d="${{d:-.}}"; '
                f'if [ -f "$d/"{prog} ] && [ -x "$d/"{prog} ]; then found="$d/"{prog}; '
                'break; fi; done; IFS="$old"; echo "PROGRAM ${found:-missing}"')
        elif self.program and self.program.startswith("/"):
            quoted = shlex.quote(self.program)
            checks.append(f'if [ -x {quoted} ]; then echo "PROGRAM "{quoted}; '
                          'else echo "PROGRAM missing"; fi')
        return "; ".join(checks)


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


def explain_ssh_failure(host: str, output: str, code: int) -> str:
    """ssh's own words → one line a person can act on."""
    low = output.lower()
    if "host key verification failed" in low or "host identification has changed" in low:
        return (f"host key mismatch for {host}: the sshd answering there is not the one "
                "the worker published (a stale address, or someone else's sshd)")
    if "permission denied" in low:
        return f"{host}: the worker's sshd refused the job's key (Permission denied)"
    if "connection refused" in low:
        return f"{host}: connection refused: no sshd on that port"
    if "could not resolve hostname" in low:
        return f"{host}: ssh could not resolve the name"
    if "timed out" in low or "no route to host" in low:
        return f"{host}: ssh could not connect ({output.strip().splitlines()[-1]})"
    last = output.strip().splitlines()[-1] if output.strip() else f"ssh exited {code}"
    return f"{host}: ssh failed: {last}"


# ssh's words for "nobody (or a dying sshd) answered": worth another try before the
# deadline. A wrong host key, a refused key or a missing daemon are not.
TRANSIENT = ("connection refused", "connection reset", "connection closed",
             "kex_exchange_identification")
RETRY_DELAY = 0.3


def transient(code: int, output: str) -> bool:
    """ssh itself failed (255) to connect, in a way a moment may cure."""
    low = output.lower()
    return code == 255 and any(t in low for t in TRANSIENT) and "permission denied" not in low


def check_output(host: str, output: str, check: RemoteCheck) -> str | None:
    """None if the session is fit for mpirun, else the reason."""
    lines: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith(("LD", "PATH", "PROGRAM")):
            key, _, value = line.partition(" ")
            lines[key] = value
    path = lines.get("PATH", "?")
    for line in output.splitlines():
        if line.startswith("DAEMON ") and line.endswith(" missing"):
            name = line.split()[1]
            return (f"{host}: {name} not found by a non-interactive ssh session "
                    f"(PATH={path}); install {check.mpi.vendor} there or use an image with it")
    if "DAEMON" not in output:
        return f"{host}: the remote shell did not run the check (output: {output[:200]!r})"
    if check.want_ld and check.want_ld not in lines.get("LD", ""):
        return (f"{host}: LD_LIBRARY_PATH did not arrive in the ssh session (got "
                f"{lines.get('LD', '')!r}); the worker's sshd must AcceptEnv it")
    return program_problem(host, lines.get("PROGRAM"), check)


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
        return (f"{host}: the program {check.program!r} is {found} there but "
                f"{check.expected} on the launcher ({where}); install it at the same path "
                "on every pod, or name it by its full path")
    return None


def _parallel(items: Sequence[str], fn: Callable[[str], str | None]) -> dict[str, str]:
    """Run fn on every item at once (bounded); collect the failures."""
    results = parallel.map_all(fn, items, MAX_PARALLEL)
    return {item: result for item, result in zip(items, results, strict=True) if result}


def wait_sshd(targets: Mapping[str, tuple[str, int]], deadline: float,
              log: Callable[..., None]) -> None:
    """Every worker's sshd answers with an SSH banner before `deadline` (monotonic)."""
    def one(name: str) -> str | None:
        address, port = targets[name]
        while True:
            if sshd.answers(address, port, timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
                return None
            if time.monotonic() >= deadline:
                return f"{name}: no sshd answers on {address}:{port}"
            time.sleep(0.1)

    failures = _parallel(sorted(targets), one)
    if failures:
        first = failures[sorted(failures)[0]]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise PeerUnavailableError(f"worker unreachable: {first}{more}",
                                   details="\n".join(failures.values()))
    log("sshd ready", workers=len(targets))


def run(hosts: Sequence[str], ssh_command: Sequence[str], check: RemoteCheck, *,
        env: Mapping[str, str], deadline: float, log: Callable[..., None]) -> None:
    """ssh to every host in parallel; raise PeerUnavailableError naming the first failure."""
    script = check.script()
    started = time.monotonic()

    def one(host: str) -> str | None:
        delay = RETRY_DELAY
        refused_since: float | None = None
        while True:
            timeout = max(1.0, deadline - time.monotonic())
            code, output = children.capture([*ssh_command, host, script], env=env,
                                            timeout=timeout)
            if code == 0:
                return check_output(host, output, check)
            reason = explain_ssh_failure(host, output, code)
            now = time.monotonic()
            if "connection refused" in output.lower():
                refused_since = refused_since or now
                if check.refused_patience is not None and \
                        now - refused_since >= check.refused_patience:
                    return f"{reason} (port {_port(output)}); {check.refused_hint}"
            else:
                refused_since = None
            if not transient(code, output) or now + delay >= deadline:
                return reason
            # The worker's supervisor restarts a dead sshd within a second: try again.
            if delay == RETRY_DELAY:
                log("preflight retry", level="warning", host=host, reason=reason)
            time.sleep(delay)
            delay = min(2.0, delay * 2)

    failures = _parallel(list(hosts), one)
    if failures:
        first = failures[next(h for h in hosts if h in failures)]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise PeerUnavailableError(f"preflight: {first}{more}",
                                   details="\n".join(failures.values()) if more else "")
    log("preflight ok", workers=len(hosts), elapsed_s=round(time.monotonic() - started, 3))


def _port(output: str) -> str:
    """The port of ssh's `connect to host H port P: Connection refused`."""
    m = re.search(r"port (\d{1,5}): Connection refused", output)
    return m.group(1) if m else "?"
