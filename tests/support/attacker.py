"""The unprivileged user in a pod, as the attack tests play it (tests/test_attacks*.py):
uid 1000, with no group, made with setpriv; the `base` fixture (tests/conftest.py) gives
it a directory it can reach."""

from __future__ import annotations

import subprocess

ATTACKER = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups"]


def as_attacker(script: str) -> None:
    """Run `script` (sh) as uid 1000, the unprivileged user in the pod."""
    done = subprocess.run(
        [*ATTACKER, "sh", "-ec", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, f"the attack's own steps failed: {done.stderr}"
