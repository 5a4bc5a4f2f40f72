"""Which signals PID 1 handles and forwards, and the dispositions a child starts with.

PID 1 forwards every catchable signal to its child, except SIGCHLD (its own: it reaps)
and the synchronous faults (a SIGSEGV in PID 1 is PID 1's bug, not the job's). That
includes the job-control signals TSTP, TTIN, TTOU and CONT, as dumb-init does; unlike
dumb-init, PID 1 does not then stop itself (the kernel never stops a namespace's init).
A PID 1 without a handler for a signal drops it (the kernel ignores default-action
signals for init), so every forwarded signal has one.

A child starts with the default disposition for every signal and an empty mask — as
with tini and dumb-init — except the signals the agent itself was started with ignored
(as tini keeps them). CPython ignores SIGPIPE and SIGXFSZ itself before any of our code
runs, so whether they were inherited ignored cannot be known: a child always gets them
at their default (`yes | head -1` then ends quietly, and `set -o pipefail` sees 141).
"""

from __future__ import annotations

import signal

TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
FAULTS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS}
)
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})
CATCHABLE = frozenset(signal.valid_signals()) - UNCATCHABLE
FORWARDED = CATCHABLE - FAULTS - {signal.SIGCHLD}
HANDLED = FORWARDED | {signal.SIGCHLD}
PYTHON_IGNORES = frozenset({signal.SIGPIPE, signal.SIGXFSZ})

_inherited: frozenset[int] = frozenset()


def read_ignored() -> frozenset[int]:
    """The signals this process ignores now (`SigIgn` of /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            line = next(ln for ln in fh if ln.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return frozenset()
    mask = int(line.split()[1], 16)
    return frozenset(n for n in range(1, 65) if mask >> (n - 1) & 1) & CATCHABLE


def remember_inherited(ignored: frozenset[int] | None = None) -> frozenset[int]:
    """Record which signals the agent was started with ignored: `ignored` (what an earlier
    image of the agent recorded, passed on through the hand-off), else what this process
    ignores now, less what CPython ignores by itself. Call it before ignoring anything."""
    global _inherited  # noqa: PLW0603 - one fact about this process, set once at start
    _inherited = frozenset(ignored) if ignored is not None else read_ignored() - PYTHON_IGNORES
    return _inherited


def inherited() -> frozenset[int]:
    return _inherited


def child_defaults() -> frozenset[int]:
    """posix_spawn's setsigdef: every catchable signal, except those inherited ignored."""
    return CATCHABLE - _inherited


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
