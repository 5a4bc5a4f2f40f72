"""Ending what a test started, all of it: a process, every descendant it has, and so the
PID namespace of any `unshare --pid --fork` among them (when a namespace's PID 1 dies,
the kernel kills everything left in it).

Killing only the process a test holds is not enough: `unshare --fork` without
`--kill-child` leaves its child (the namespace's PID 1) running when `unshare` is killed,
and a shell's children outlive it. tests/test_hygiene.py proves both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def children() -> dict[int, list[int]]:
    """Every process's children, by parent PID (a snapshot of /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(pids: Iterable[int]) -> list[int]:
    """`pids` and all their descendants, parents before children."""
    kids = children()
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop(0)
        if pid in out:
            continue
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def end(procs: Iterable[subprocess.Popen[Any]], timeout: float = 10) -> None:
    """Kill every process of `procs` that still runs, with all its descendants, and reap
    it. The tree is stopped first (SIGSTOP), again until no new process appears in it, so
    that nothing forks away between the look and the kill."""
    running = [p for p in procs if p.poll() is None]
    roots = [p.pid for p in running]
    seen: list[int] = []
    for _ in range(5):
        now = tree(roots)
        _signal_all([pid for pid in now if pid not in seen], signal.SIGSTOP)
        if set(now) <= set(seen):
            break
        seen += [pid for pid in now if pid not in seen]
    _signal_all(seen, signal.SIGKILL)
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=timeout)
