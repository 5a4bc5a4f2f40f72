"""A test that fails on purpose with processes still running, for tests/test_hygiene.py,
which runs it in a pytest session of its own (its name keeps the suite from collecting
it). It writes every PID it made to the file MPIB_LEAKY_PIDS names: the agent as PID 1
of its own namespace with a child there, and a shell with two children in the
background. After its session, none may be left."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.support import proctree
from tests.support.pid1 import agent_argv, agent_pid
from tests.support.wait import wait_until


def _kids(pid: int, n: int) -> list[int]:
    def found() -> list[int]:
        kids = proctree.tree([pid])[1:]
        return kids if len(kids) >= n else []

    return wait_until(found, 10, f"{n} children of {pid}")


def test_fails_with_processes_running(started: list[subprocess.Popen[Any]], root: None) -> None:
    """Starts a PID namespace and a shell with background children, then fails."""
    ns = subprocess.Popen(agent_argv("sleep", "300"), stderr=subprocess.DEVNULL)
    started.append(ns)
    shell = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"])
    started.append(shell)
    pids = [ns.pid, *_kids(agent_pid(ns), 1), agent_pid(ns), shell.pid, *_kids(shell.pid, 2)]
    Path(os.environ["MPIB_LEAKY_PIDS"]).write_text(" ".join(map(str, pids)))
    raise AssertionError("fails on purpose, with its processes running")
