"""The data check's session protocol as the launcher speaks it (ssh/datacheck.py), for
tests that drive a session themselves: the probe program run by Python, or a session
served by a worker's PID 1."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def results(p: subprocess.Popen[str], targets: list[str]) -> list[dict[str, Any]]:
    """Send `targets` (one line), read one line per target, then the `done` line; the
    results by peer."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(" ".join(targets) + "\n")
    p.stdin.flush()
    out = [json.loads(p.stdout.readline()) for _ in targets]
    assert json.loads(p.stdout.readline()) == {"done": len(targets)}
    return sorted(out, key=lambda r: str(r["peer"]))
