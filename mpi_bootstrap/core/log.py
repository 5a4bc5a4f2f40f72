"""The one shape of a log call in the agent: `log(event, level="info", **keys)`.

Before the hand-off it writes structlog events (system/log.py), in the resident PID 1
JSON lines of the same keys (pid1/output.py); every module takes a `Log` and never
cares which.
"""

from __future__ import annotations

from typing import Any, Protocol


class Log(Protocol):
    def __call__(self, event: str, /, level: str = "info", **keys: Any) -> None: ...


def silent(event: str, /, level: str = "info", **keys: Any) -> None:
    """A Log that says nothing (tests, and callers with nobody to tell)."""
