"""Writing the termination message (core/termination.py) where the kubelet reads it.

Never blocks, never fails the exit: every error is swallowed (the exit code and stderr
are the same with or without the file). Standard library only (the resident writes it).

- No link is followed at any component of the path (`openat` one directory at a time
  from `/`, O_NOFOLLOW): why, SECURITY.md promise 33 (tests/test_termlog.py).
- An existing file (the kubelet's bind mount) is written in place: opened without
  blocking, only as a regular file with one name, one pwrite of at most 4 KiB, then a
  truncate to its end (it never reads empty).
- A missing one is created only where the path was set, in the directory opened above,
  atomically; the default path is used only where it exists.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from mpi_bootstrap.core.termination import LIMIT

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def write(path: str, text: str, *, create: bool) -> bool:
    """Write `text` (cut to LIMIT bytes) to `path`; whether it was written."""
    data = text.encode("utf-8", "replace")[:LIMIT]
    try:
        parent, name = _open_parent(path)
    except (OSError, ValueError):  # a link or a missing directory on the way; a NUL
        return False
    try:
        return _write_in(parent, name, data, create)
    finally:
        os.close(parent)


def _open_parent(path: str) -> tuple[int, str]:
    """The directory that holds `path`, opened through no link, and the file's name."""
    if not path.startswith("/"):
        raise ValueError(path)
    *dirs, name = [part for part in path.split("/") if part]
    if name in (".", ".."):
        raise ValueError(path)
    fd = os.open("/", _DIR)
    try:
        for part in dirs:
            below = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _write_in(parent: int, name: str, data: bytes, create: bool) -> bool:
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except FileNotFoundError:
        return create and _create(parent, name, data)
    except OSError:  # a symlink (ELOOP), a FIFO with no reader (ENXIO), a directory
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _create(parent: int, name: str, data: bytes) -> bool:
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=parent,
        )
    except OSError:
        return False
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        return False
    return True
