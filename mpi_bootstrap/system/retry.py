"""One way to wait for something: `retry_until(deadline, attempt)`.

Every poll loop in the agent is this: try, and if it is not there yet, sleep and try
again until a monotonic deadline. The pauses are named for what is being waited on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

LOCAL = 0.01  # state on this machine: a child's socket or exit, a lock (milliseconds)
FILE = 0.05  # a file being rewritten by someone else
PEER = 0.1  # another pod: its record, its sshd's banner
NETWORK = 0.2  # a request to another pod that failed: do not hammer it


def retry_until(
    deadline: float,
    attempt: Callable[[], R | None],
    *,
    every: float,
    backoff: float = 1.0,
    most: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> R | None:
    """attempt() until it returns something other than None; None once the monotonic
    `deadline` has passed (attempt() always runs at least once). The pause starts at
    `every` and is multiplied by `backoff` after each try, up to `most`; it never
    sleeps past the deadline. Exceptions from attempt() end the wait."""
    pause = every
    while True:
        result = attempt()
        if result is not None:
            return result
        left = deadline - clock()
        if left <= 0:
            return None
        sleep(min(pause, left))
        pause = min(most, pause * backoff)
