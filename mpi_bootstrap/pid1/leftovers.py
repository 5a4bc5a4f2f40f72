"""After the main child: what is left below PID 1 gets SIGTERM, SIGKILL after the grace,
and is given up on if it survives even that (a process in uninterruptible sleep). The
supervisor's "end leftovers" step, its own small state. Standard library only."""

from __future__ import annotations

import os
import signal

from mpi_bootstrap.core.log import Log
from mpi_bootstrap.pid1 import tree

KILL_WAIT_S = 2.0  # after SIGKILL: how long before the survivors are given up on


class Leftovers:
    def __init__(self, grace: float, log: Log) -> None:
        self.grace, self.log = grace, log
        self.deadline: float | None = None  # when the next signal goes (the step's timer)
        self.killed = False
        self.abandoned = False  # they survived SIGKILL: the job ends without them

    def step(self, now: float) -> None:
        """SIGTERM at once, SIGKILL once the grace is over, give up after that."""
        if self.deadline is None:
            n = _signal_below(signal.SIGTERM)
            self.log("terminating leftovers", processes=n, grace_s=self.grace)
            self.deadline = now + self.grace
        elif now >= self.deadline:
            if self.killed:
                self.log("leftovers survive SIGKILL", level="warning")
                self.abandoned = True
                return
            n = _signal_below(signal.SIGKILL)
            self.log("killing leftovers", level="warning", processes=n)
            self.killed = True
            self.deadline = now + KILL_WAIT_S


def _signal_below(signum: int) -> int:
    """Signal every process below us (the main child is gone: these are leftovers)."""
    return tree.signal_all(tree.descendants(os.getpid()), signum)
