"""The one shape of a log call in the agent: `log(event, level="info", **keys)`.

Before the hand-off it writes structlog events (system/log.py), in the resident PID 1
JSON lines of the same keys (pid1/output.py); every module takes a `Log` and never
cares which. Both drop levels below the configured one by `LEVELS` and hide secrets
with `redact`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Protocol

# The numbers are the logging module's (DEBUG=10 … ERROR=40).
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
SECRET_WORDS = ("token", "secret", "password", "private_key", "privkey")


class Log(Protocol):
    def __call__(self, event: str, /, level: str = "info", **keys: Any) -> None: ...


def redact(keys: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of every key that names a secret (in place; returned)."""
    for key in list(keys):
        if any(word in key.lower() for word in SECRET_WORDS):
            keys[key] = "[redacted]"
    return keys
