"""The one shape of a log call in the agent: `log(event, level="info", **keys)`.

A log line is `line`'s: a JSON object (the call's keys, then event, role, level and a
UTC timestamp), or one readable line for a person at a terminal. Before the hand-off
system/log.py writes them to stderr (and structlog's console renderer the readable
ones); in the resident PID 1, pid1/output.py. Every module takes a `Log` and never
cares which. Both drop levels below the configured one by `LEVELS` and hide secrets
with `redact`.
"""

from __future__ import annotations

import json
import time
from collections.abc import MutableMapping
from typing import Any, Protocol

from mpi_bootstrap.core.env import looks_secret, secret_value
from mpi_bootstrap.core.errors import printable

# The numbers are the logging module's (DEBUG=10 … ERROR=40).
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_JSON = json.JSONEncoder(default=str)  # json.dumps(default=str) makes one a line: 4,096 a DNS wait


class Log(Protocol):
    def __call__(self, event: str, /, level: str = "info", **keys: Any) -> None: ...


def redact(keys: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of every key that names a secret, and every text value that
    looks like a credential (in place; returned): the rule that also keeps such a
    variable from the ranks (core/env.py looks_secret, secret_value)."""
    for key, value in list(keys.items()):
        if key == "event":  # the agent's own words ("token exposed"), never a secret
            continue
        if looks_secret(key) or (isinstance(value, str) and secret_value(value)):
            keys[key] = "[redacted]"
    return keys


def line(
    event: str, level: str, role: str, keys: MutableMapping[str, Any], *, console: bool = False
) -> str:
    """One log line, newline included; `keys` are redacted in place first."""
    redact(keys)
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    if console:  # for a person: what others said is escaped (core/errors.py printable)
        pairs = " ".join(f"{k}={v}" for k, v in sorted({**keys, "role": role}.items()))
        return printable(f"{stamp} [{level:<9}] {event:<30} {pairs}", lines=False) + "\n"
    record = {**keys, "event": event, "role": role, "level": level, "timestamp": stamp}
    return _JSON.encode(record) + "\n"
