"""When PID 1 runs on a terminal (`kubectl run -it`, `docker run -it`): the main child gets
a process group of its own and the terminal, as tini does. Then ^C reaches it once, from
the kernel — not a second time through PID 1 — and it can read the terminal without
being stopped by SIGTTIN (tests/test_pid1_conformance.py::TestTerminal)."""

from __future__ import annotations

import contextlib
import os
import signal


def is_ours() -> bool:
    """Is stdin a terminal whose foreground process group is ours?"""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def give(child: int) -> None:
    """Make the child's group the terminal's foreground. SIGTTOU is blocked meanwhile (we
    may already be in the background). A child that read the terminal before this (and
    was stopped by SIGTTIN) is continued: the race tini's comment describes."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(0, child)
    except OSError:
        return
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child, signal.SIGCONT)
