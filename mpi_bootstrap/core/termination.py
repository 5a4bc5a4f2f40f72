"""The termination message: why the agent exited non-zero, in the few lines Kubernetes
shows as the container's `Last State: Terminated … Message` (at most 4096 bytes of
`terminationMessagePath`). Pure: the text; system/termlog.py writes it. Nothing secret
goes in: docs/troubleshooting.md, "The termination message"."""

from __future__ import annotations

import signal

from mpi_bootstrap.core.errors import MEANINGS, WORKER_FIXES, ExitStatus, shown

LIMIT = 4096  # bytes: what the kubelet reads
DEFAULT_PATH = "/dev/termination-log"

# mpirun's own code, passed through
MPIRUN_FIX = "a rank or mpirun itself failed: the launcher's log has mpirun's and the ranks' output"
SIGNAL_FIX = (
    "the pod was told to stop (deleted, evicted, preempted, or the job "
    "cancelled or restarted): the pod's events say by whom"
)


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code - int(ExitStatus.SIGNAL_BASE)).name
    except ValueError:
        return f"signal {code - int(ExitStatus.SIGNAL_BASE)}"


def meaning(code: int, role: str, signaled: bool = True) -> tuple[str, str]:
    """(what exit `code` means, what to do) for `role`. A code above 128 is a signal only
    when the process `signaled` died of it: mpirun's own 205 is no signal 77."""
    if code in MEANINGS:
        what, fix = MEANINGS[code]
        return what, WORKER_FIXES.get(code, fix) if role == "worker" else fix
    if code > int(ExitStatus.SIGNAL_BASE) and signaled:
        return f"ended by {signal_name(code)}", SIGNAL_FIX
    if role == "launcher":
        return "mpirun's own exit code", MPIRUN_FIX
    return f"exit {code}", "the pod's log says what happened"


def text(
    *,
    role: str,
    code: int,
    phase: str,
    error: str,
    host: str | None = None,
    fix: str | None = None,
    signaled: bool = True,
) -> str:
    """The message: at most LIMIT bytes of printable text, the fix kept whole."""
    what, default_fix = meaning(code, role, signaled)
    who = f"mpi-bootstrap {shown(role, 20)}" if role else "mpi-bootstrap (no role)"
    head = [f"{who}: exit {code} ({what})", f"phase: {shown(phase, 60)}"]
    if host:
        head.append(f"host: {shown(host, 253)}")
    tail = f"fix: {shown(fix or default_fix, 1000)}\n"
    said = shown(error, LIMIT)  # printable ASCII, and "…" when cut
    while True:
        out = "\n".join([*head, f"error: {said}", tail])
        excess = len(out.encode()) - LIMIT
        if excess <= 0:
            return out
        said = said[: max(0, len(said) - excess - 3)] + "…"
