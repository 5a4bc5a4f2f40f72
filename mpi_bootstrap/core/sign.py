"""Messages signed with a shared key, the one scheme of the agent: the net exchange's
(ssh/netx.py, under a key derived from the job's token) and liveness's (core/liveness.py,
under a key derived from the launch's session key for each worker).

A message is a JSON object; its `mac` is hex HMAC-SHA256(key, the canonical JSON of
every other field: sorted keys, no spaces). Checking never raises: compare_digest
refuses non-ASCII text (TypeError), and a message nested just below json's limits
cannot be dumped again (RecursionError) — both reachable by anyone who can send one
(tests/test_fuzz_exchange_regressions.py). Standard library only (the resident PID 1
signs and checks).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

MAC = "mac"


def derive(key: bytes, label: str) -> bytes:
    """A key of its own for `label` (a purpose, a worker): knowing it tells nothing of
    `key` nor of another label's."""
    return hmac.new(key, label.encode(), hashlib.sha256).digest()


def mac(key: bytes, message: Mapping[str, Any]) -> str:
    body = json.dumps(
        {k: v for k, v in message.items() if k != MAC}, sort_keys=True, separators=(",", ":")
    )
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def signed(key: bytes, message: Mapping[str, Any]) -> dict[str, Any]:
    return {**message, MAC: mac(key, message)}


def valid(key: bytes, message: Mapping[str, Any]) -> bool:
    """Is `message` signed with `key`? Never raises."""
    found = message.get(MAC)
    if not isinstance(found, str) or not found.isascii():
        return False
    try:
        expected = mac(key, message)
    except (RecursionError, TypeError, ValueError):
        return False
    return hmac.compare_digest(found, expected)


def same(a: str, b: str) -> bool:
    """Constant-time equality of two ASCII strings (a challenge echoed)."""
    return a.isascii() and b.isascii() and hmac.compare_digest(a, b)
