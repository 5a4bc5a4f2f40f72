"""Which signals PID 1 handles and forwards, and the dispositions a child starts with:
docs/pid1.md, "Signals" and "The child starts clean". A PID 1 without a handler drops a
signal (the kernel ignores default-action signals for init), so each forwarded one has one.
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
