"""The process tree below PID 1, read from /proc: whom to signal when leftovers are ended
(supervisor.py) and when a launch is ended on a worker (watch.py). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable


def _stat(pid: int | str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _fields(stat: bytes) -> list[bytes]:
    """The fields after the command name (which may hold spaces and parentheses): the
    state is [0], the parent's PID [1]."""
    return stat[stat.rfind(b")") + 2 :].split()


def parents() -> dict[int, int]:
    """Every process's parent, by PID."""
    out: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            fields = _fields(stat)
            if len(fields) > 1:
                out[int(entry)] = int(fields[1])
    return out


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """PIDs below `root` in the process tree (deepest last)."""
    children: dict[int, list[int]] = {}
    for pid, parent in (parents() if table is None else table).items():
        children.setdefault(parent, []).append(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def ancestors(pid: int, table: dict[int, int]) -> list[int]:
    """`pid` and its parents, up to (not including) PID 1 or a process not in `table`."""
    out: list[int] = []
    while pid in table and pid > 1 and pid not in out:
        out.append(pid)
        pid = table[pid]
    return out


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for its parent."""
    stat = _stat(pid)
    return stat is None or _fields(stat)[:1] == [b"Z"]


def name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return fh.read().strip().decode("ascii", "replace") or "?"
    except OSError:
        return "?"


def signal_all(pids: Iterable[int], signum: int) -> int:
    """Send `signum` to each; how many were still there."""
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            sent += 1
    return sent


def say(pid: int, text: bytes) -> None:
    """Write `text` on `pid`'s stderr where it is a pipe (an ssh session's channel), if it
    can be done at once: never blocks, never fails. Never on anything else: a process
    could point its stderr at a file that only this PID 1 may write."""
    with contextlib.suppress(OSError):
        fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, text)
        finally:
            os.close(fd)


def holds(pid: int, path: str) -> bool:
    """Whether process `pid` has the file at `path` open for writing (its /proc fd links
    and their flags): the kernel's word on who wrote to a FIFO, where the writer's own
    line names a PID."""
    try:
        want = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                flags = int(next(ln for ln in fh if ln.startswith("flags:")).split()[1], 8)
            if flags & (os.O_WRONLY | os.O_RDWR):
                return True
    return False
