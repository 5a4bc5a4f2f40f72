"""Auditing what the agent leaves on disk: every path under a directory against a table
of the modes it must have, and the private key material there (so that outputs can be
searched for it)."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

_TEMP = re.compile(r"^\..+\.tmp$|^\.job-key\.")  # files.atomic_write / DirExchange.job_key


def walk(root: Path, *, itself: bool) -> dict[str, os.stat_result]:
    """Every path under `root` (lstat, so a symlink is seen as one); `.` is root itself."""
    found = {".": os.lstat(root)} if itself else {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            found[str(path.relative_to(root))] = os.lstat(path)
    return found


def mode_problems(
    root: Path, table: Mapping[str, int], required: set[str], fifos: frozenset[str] = frozenset()
) -> list[str]:
    """What is wrong under `root`: a `required` path missing, a temporary file left, a
    path that is not a plain file or directory (or one of the named `fifos`), owned by
    another uid, writable by group or others, a private key not 0600, or a mode other than
    `table` gives (patterns → mode; `.` is root itself, checked only when the table lists it)."""
    problems = []
    entries = walk(root, itself="." in table)  # the exchange dir itself is the operator's
    for missing in sorted(required - set(entries)):
        problems.append(f"{root}/{missing}: expected, not written")
    for rel, st in sorted(entries.items()):
        where, mode = f"{root}/{rel}", stat.S_IMODE(st.st_mode)
        if _TEMP.match(os.path.basename(rel)):
            problems.append(f"{where}: temporary file left behind")
            continue
        fifo = stat.S_ISFIFO(st.st_mode) and rel in fifos
        if stat.S_ISLNK(st.st_mode) or not (
            stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or fifo
        ):
            problems.append(f"{where}: not a plain file or directory")
            continue
        if st.st_uid != os.geteuid():
            problems.append(f"{where}: owned by uid {st.st_uid}, not {os.geteuid()}")
        if mode & 0o022:
            problems.append(f"{where}: writable by group or others ({mode:04o})")
        if (
            stat.S_ISREG(st.st_mode)
            and b"PRIVATE KEY" in (root / rel).read_bytes()
            and mode != 0o600
        ):
            problems.append(f"{where}: holds a private key but is {mode:04o}, not 0600")
        expected = next((m for pat, m in table.items() if fnmatch.fnmatchcase(rel, pat)), None)
        if expected is None:
            problems.append(f"{where}: no entry in the mode table (mode {mode:04o})")
        elif mode != expected:
            problems.append(f"{where}: mode {mode:04o}, expected {expected:04o}")
    return problems


def private_key_lines(roots: list[Path]) -> tuple[int, set[str]]:
    """(number of private key files, their base64 body lines) under `roots`."""
    count, lines = 0, set()
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
                count += 1
                lines |= {
                    ln.strip()
                    for ln in path.read_text().splitlines()
                    if not ln.startswith("-----") and len(ln.strip()) >= 16
                }
    return count, lines
