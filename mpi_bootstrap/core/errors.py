"""The one exit-code table, and the exceptions that carry a code to `cli.main`.

Every failure the agent knows about is raised as a `BootstrapError` subclass; `cli.main`
is the only place that turns one into a process exit status (docs/troubleshooting.md,
"Exit codes").
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Exit codes of the agent. mpirun's own code and 128+N pass through unchanged."""

    OK = 0
    PROBLEMS_FOUND = 1  # doctor: at least one check failed (each finding says what to do)
    CONFIG = 64  # EX_USAGE: a flag or variable is wrong
    HOSTFILE = 65  # EX_DATAERR: the hostfile cannot be used
    DNS_TIMEOUT = 68  # EX_NOHOST: a host did not resolve before the deadline
    PEER_UNAVAILABLE = 69  # EX_UNAVAILABLE: a worker is not reachable
    INTERNAL = 70  # EX_SOFTWARE: a bug in the agent
    # EX_TEMPFAIL: a worker was lost while the job ran (launcher), or the launcher was
    # (a worker told to exit then): nothing the job did; run it again. Its own code, so a
    # Job's podFailurePolicy (onExitCodes) or a Volcano policy can tell it from the
    # program's failures (docs/troubleshooting.md "A lost worker").
    WORKER_LOST = 75
    CANT_CREATE = 73  # EX_CANTCREAT: a file or directory the agent needs cannot be written
    NOT_EXECUTABLE = 126  # the program exists but cannot be executed
    NOT_FOUND = 127  # the program does not exist
    SIGNAL_BASE = 128  # 128+N: killed by (or stopped for) signal N


# Each code's meaning and its one-line fix: the termination message (core/termination.py)
# and docs/troubleshooting.md say the same. mpirun's own code and 128+N: termination.py.
MEANINGS: dict[int, tuple[str, str]] = {
    ExitStatus.PROBLEMS_FOUND: ("doctor: a check failed", "each finding above says what to do"),
    ExitStatus.CONFIG: (
        "bad configuration",
        "correct the flag or variable named (mpi-bootstrap --help lists them); "
        "`mpi-bootstrap --explain` checks a configuration without running anything",
    ),
    ExitStatus.HOSTFILE: (
        "the hostfile cannot be used",
        "fix the hostfile at the file:line named (MPI Operator writes it from the "
        "MPIJob's worker replicas)",
    ),
    ExitStatus.DNS_TIMEOUT: (
        "a host did not resolve",
        "check that the worker pods run and that the job's headless Service exists "
        "(MPI_BOOTSTRAP_CLUSTER_DOMAIN if the cluster's is not cluster.local); "
        "`mpi-bootstrap doctor` asks each nameserver",
    ),
    ExitStatus.PEER_UNAVAILABLE: (
        "a worker is unavailable",
        "look at the named worker: its pod's log (is `mpi-bootstrap worker` its "
        "entrypoint, with the launcher's exchange settings?), its sshd and MPI install; "
        "`mpi-bootstrap doctor` in the launcher pod checks each; no rank started",
    ),
    ExitStatus.INTERNAL: (
        "internal error",
        "a bug in mpi-bootstrap: please report it with the pod's log",
    ),
    ExitStatus.WORKER_LOST: (
        "a worker was lost while the job ran",
        "look at the named pod and its node (kubectl describe pod: evicted, OOM-killed, "
        "node not ready); the job ended so its GPUs are free: run it again (a "
        "podFailurePolicy can retry exit 75 without counting it as the program's failure)",
    ),
    ExitStatus.CANT_CREATE: (
        "a file or directory cannot be written",
        "give the agent a writable directory with free space (an emptyDir) at the path "
        "named: MPI_BOOTSTRAP_STATE_DIR, or the exchange volume",
    ),
    ExitStatus.NOT_EXECUTABLE: (
        "the program is not executable",
        "make it executable (chmod +x) or fix its path",
    ),
    ExitStatus.NOT_FOUND: (
        "the program was not found",
        "install mpirun in the image or put it on PATH (or MPI_BOOTSTRAP_MPIRUN)",
    ),
}
# The worker's own: its 69 is its own sshd's, not a peer's; its 75, its launcher lost.
WORKER_FIXES: dict[int, str] = {
    ExitStatus.PEER_UNAVAILABLE: (
        "the worker's log has sshd's own messages: check the image's sshd "
        "(MPI_BOOTSTRAP_SSHD), the state directory and the port (MPI_BOOTSTRAP_SSHD_PORT)"
    ),
    ExitStatus.WORKER_LOST: (
        "its launcher was lost and MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS is set: look at the "
        "launcher pod; what the launch started here was ended"
    ),
}


class BootstrapError(Exception):
    """A failure with a known cause: one line for the user, and the exit status; with the
    phase it happened in and the host at fault, where there is one (the termination
    message, core/termination.py)."""

    status: ExitStatus = ExitStatus.INTERNAL
    phase: str = "agent"

    def __init__(
        self, message: str, *, details: str = "", phase: str | None = None, host: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        # Multi-line context (e.g. the DNS dump) printed after the one-line message.
        self.details = details
        if phase is not None:
            self.phase = phase
        self.host = host


class ConfigError(BootstrapError):
    """One or more settings are invalid; `problems` lists every one of them."""

    status = ExitStatus.CONFIG
    phase = "configuration"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"bad configuration: {self.problems[0]}"
        else:
            message = f"bad configuration ({len(self.problems)} problems)"
        super().__init__(
            message,
            details="\n".join(f"  - {p}" for p in self.problems) if len(self.problems) > 1 else "",
        )


class HostfileError(BootstrapError):
    """The hostfile is missing, unreadable or malformed; the message names file:line."""

    status = ExitStatus.HOSTFILE
    phase = "hostfile"


class DNSTimeoutError(BootstrapError):
    """Some hosts did not resolve before the deadline."""

    status = ExitStatus.DNS_TIMEOUT
    phase = "DNS wait"


class PeerUnavailableError(BootstrapError):
    """A worker cannot be reached (no sshd, refused, wrong key)."""

    status = ExitStatus.PEER_UNAVAILABLE
    phase = "worker checks"


class NotSetUpError(PeerUnavailableError):
    """Every worker refused ssh and no exchange is set up: nothing started the workers'
    sshd. The message says what to do; DNS and the Service are beside the point."""


class WriteError(BootstrapError, OSError):
    """A file or directory cannot be written (read-only, full, not ours). Also an OSError,
    so code that tolerates a failed write (the supervisor's bookkeeping) still does."""

    status = ExitStatus.CANT_CREATE
    phase = "writing files"

    @classmethod
    def of(cls, path: str, exc: OSError) -> WriteError:
        return cls(
            f"cannot write {path}: {exc.strerror or exc} (the directory must be "
            "writable, ours, and have free space)"
        )


class ExecError(BootstrapError):
    """A program could not be started: not found (127) or not executable (126)."""

    phase = "starting the program"

    def __init__(self, message: str, status: ExitStatus) -> None:
        super().__init__(message)
        self.status = status


def signal_exit_status(signum: int) -> int:
    """The shell convention for a process ended by signal `signum`."""
    return int(ExitStatus.SIGNAL_BASE) + signum


def some(items: list[str], shown: int = 1) -> str:
    """`a, b and 3 more`: the first `shown` items, and how many are not shown."""
    head = ", ".join(items[:shown])
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


def printable(text: str, *, lines: bool = True) -> str:
    """`text` safe for a person's terminal: every character that is not printable
    (str.isprintable: C0 and C1 controls, DEL, bidi overrides, line separators) written
    as Python escapes it (ESC as the four characters `\\x1b`), but tabs and — with
    `lines` — newlines. A peer, a record, a nameserver or mpirun may say anything; what
    the agent prints for people (stderr's messages, `doctor`, `--explain`, the console
    log) must not move the cursor, erase a line, retitle the window (ANSI CSI, OSC) or
    overwrite with `\\r` and `\\b` what the agent said (tests/test_printable.py).
    Output copied through (mpirun's, the ranks') is the user's, and not escaped."""
    if text.isprintable():
        return text
    keep = "\t\n" if lines else "\t"
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


def shown(text: str, limit: int = 120) -> str:
    """A peer's words (a worker's report, what its shell printed), safe to print in one
    line: non-printable and non-ASCII characters escaped, at most `limit` of them."""
    out = "".join(c if " " <= c < "\x7f" else ascii(c)[1:-1] for c in text[:limit])
    return out + ("…" if len(text) > limit else "")
