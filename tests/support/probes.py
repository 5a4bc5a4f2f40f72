"""The data check's session protocol as the launcher speaks it (ssh/datacheck.py), for
tests that drive a session themselves: the probe program run by Python, or a session
served by a worker's PID 1. A session answers probes only from the addresses its line
names (`from=`), and only once that line has come: sessions that probe each other are
each sent their line before any answer is awaited, as the launcher does."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

LOOPBACK = ("127.0.0.1",)


def ask(p: subprocess.Popen[str], targets: list[str], allowed: Sequence[str] = LOOPBACK) -> None:
    """Send the session its line: who may probe it, then `targets`."""
    assert p.stdin is not None
    p.stdin.write(" ".join([f"from={','.join(allowed)}", *targets]) + "\n")
    p.stdin.flush()


def answers(p: subprocess.Popen[str], n: int) -> list[dict[str, Any]]:
    """Its `n` results, then the `done` line; the results by peer."""
    assert p.stdout is not None
    out = [json.loads(p.stdout.readline()) for _ in range(n)]
    assert json.loads(p.stdout.readline()) == {"done": n}
    return sorted(out, key=lambda r: str(r["peer"]))


def results(
    p: subprocess.Popen[str], targets: list[str], allowed: Sequence[str] = LOOPBACK
) -> list[dict[str, Any]]:
    """`ask`, then its `answers`."""
    ask(p, targets, allowed)
    return answers(p, len(targets))
