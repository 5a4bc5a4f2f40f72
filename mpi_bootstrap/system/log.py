"""Logs as data, before the hand-off: JSON lines on stderr (core/log.py's `line`, the
same the resident PID 1 writes), or structlog's console renderer for a person at a
terminal (`console`, or `auto` on a TTY), imported only then (60–90 ms of CPU). Secrets
never reach a log line (core/log.py `redact`): docs/configuration.md, its last paragraph.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import MutableMapping
from typing import Any, TextIO

from mpi_bootstrap.core.errors import printable
from mpi_bootstrap.core.log import LEVELS, Log, line, redact

_log: Log | None = None


def configure(
    fmt: str = "auto", level: str = "info", role: str = "launcher", stream: TextIO | None = None
) -> Log:
    """Set (and return) the process's Log."""
    global _log  # noqa: PLW0603 - one log per process, configured once by cli.py
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    _log = _json_lines(out, level, role) if fmt == "json" else _console(out, level, role)
    return _log


def get() -> Log:
    """The agent's Log (core/log.py's call shape), as configured."""
    return _log if _log is not None else configure()


def _json_lines(out: TextIO, level: str, role: str) -> Log:
    floor = LEVELS[level]
    lock = threading.Lock()  # preflight's threads log too: whole lines only

    def log(event: str, /, level: str = "info", **keys: Any) -> None:
        if LEVELS[level] < floor:
            return
        text = line(event, level, role, keys)
        with lock:
            out.write(text)
            out.flush()

    return log


def _escaped(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Every text value printable (core/errors.py), on the event's one line: a peer's words
    in a log line must not drive the terminal, nor start a line of their own that reads as
    the agent's; the renderer's own colours come after this."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = printable(value, lines=False)
    return event_dict


def _console(out: TextIO, level: str, role: str) -> Log:
    import structlog

    def add_role(
        _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        # Not a context variable: those stay in the thread that bound them, and lines
        # logged from the fan-out's threads (preflight retry) came without a role.
        event_dict.setdefault("role", role)
        return event_dict

    structlog.configure(
        processors=[
            add_role,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            lambda _logger, _method, event_dict: redact(event_dict),
            _escaped,
            structlog.dev.ConsoleRenderer(colors=out.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logger = structlog.get_logger("mpi_bootstrap")

    def log(event: str, /, level: str = "info", **keys: Any) -> None:
        getattr(logger, level)(event, **keys)

    return log
