"""A worker's preflight session prints what it likes (a compromised worker, a login
shell gone wrong): what the launcher reads of it is bounded, and past the bound that
worker fails its check, 69, "report too long" (SECURITY.md, promise 1). Before, a session
that printed 300 MiB took the launcher from 34 to 855 MiB and the launch went on.
Each case runs in a fresh interpreter: its peak memory (VmHWM) is the launcher's own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

# The session as the launcher runs it (launcher/session.py), through an `ssh` stand-in
# whose login shell floods stdout or stderr with 300 MiB before the check's script runs.
PROGRAM = """
import json, sys, time
from mpi_bootstrap.launcher import remotecheck, session
from tests.support.machine import MPIS
stream, then = sys.argv[1], sys.argv[2] or None
flood = "head -c 314572800 /dev/zero | tr '\\\\0' A" + (" >&2" if stream == "stderr" else "")
ssh = ["sh", "-c", flood + '; exec sh -c "$2"', "ssh"]
check = remotecheck.RemoteCheck(mpi=MPIS["openmpi4"], prefix=None, want_ld=None, then=then)
s = session.Session("w0", ssh, check, {"PATH": "/usr/bin:/bin"}, lambda *a, **k: None)
why = s.until_done(time.monotonic() + 60, None, None)
session.release([s])
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so it would report
# the pytest worker this was forked from (285 MiB in CI), not this interpreter.
hwm = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
peak = int(hwm) >> 10
print(json.dumps({"why": why, "peak_mib": peak}))
"""


@pytest.mark.parametrize(("stream", "then"), [("stdout", ""), ("stdout", "cat"), ("stderr", "")])
def test_a_flooding_session_fails_its_worker_within_the_budget(stream: str, then: str) -> None:
    """300 MiB on the session's stdout (the report's stream; `then`: a session kept for
    the data check) or its stderr: the worker fails, named, "report too long" (or its
    check fails on what little was kept), and the launcher's peak memory stays under
    100 MiB."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, stream, then],
        check=False,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["why"] and said["why"].startswith("w0: "), said
    if stream == "stdout":
        assert "report too long" in said["why"], said
    assert said["peak_mib"] < 100, said
