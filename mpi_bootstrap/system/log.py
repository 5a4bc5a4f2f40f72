"""Logs as data: structlog, JSON lines on stderr when not a TTY, console on a TTY.

stdout is reserved for `--explain` output. Secrets never reach a log line: a processor
replaces the value of any key that names one, and the agent never passes key material
or tokens as values under other names.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from mpi_bootstrap.core.log import LEVELS, Log, redact


def _redact(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]
            ) -> MutableMapping[str, Any]:
    return redact(event_dict)


def configure(fmt: str = "auto", level: str = "info", role: str = "launcher",
              stream: TextIO | None = None) -> None:
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: Any = (structlog.processors.JSONRenderer() if fmt == "json"
                     else structlog.dev.ConsoleRenderer(colors=out.isatty()))
    def add_role(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]
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
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get() -> Log:
    """The agent's Log (core/log.py's call shape), written by structlog."""
    logger = structlog.get_logger("mpi_bootstrap")

    def log(event: str, /, level: str = "info", **keys: Any) -> None:
        getattr(logger, level)(event, **keys)

    return log
