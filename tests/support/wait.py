"""Waiting in tests without fixed sleeps: poll a condition until it holds (`wait_until`),
or for a window in which it must keep holding (`holds_for`), and fail at once, saying
what was awaited, when it does not."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05  # the longest pause between two looks at a condition

What = str | Callable[[], str]  # a callable is asked only on failure (e.g. a log so far)


def _say(what: What) -> str:
    return what() if callable(what) else what


def wait_until(pred: Callable[[], T], timeout: float, what: What, *, interval: float = POLL_S) -> T:
    """Call `pred` until it returns something truthy, and return that; after `timeout`
    seconds, fail naming `what`. An exception from `pred` (an AssertionError that the
    process awaited has died, say) ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {_say(what)}")
        time.sleep(min(interval, left))


def holds_for(
    pred: Callable[[], object], seconds: float, what: What, *, interval: float = POLL_S
) -> None:
    """Check `pred` over a window of `seconds` (a negative check: something must NOT
    happen meanwhile); fail as soon as it is falsy, naming `what` and when."""
    start = time.monotonic()
    end = start + seconds
    while True:
        if not pred():
            raise AssertionError(
                f"{_say(what)}: stopped holding after "
                f"{time.monotonic() - start:.2f} s of {seconds:g} s"
            )
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(interval, left))
