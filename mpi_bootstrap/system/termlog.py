"""Writing the termination message (core/termination.py) where the kubelet reads it.

Never blocks, never fails the exit: every error is swallowed (the exit code and stderr
are the same with or without the file). Standard library only (the resident writes it).

- The file exists (the kubelet bind-mounts /dev/termination-log into every container):
  it is written in place, since a bind mount cannot be renamed over: opened without
  following a symlink and without blocking (O_NONBLOCK: a FIFO with no reader fails at
  once instead of waiting), only if it is a regular file, then one pwrite of at most
  4 KiB at offset 0 and a truncate to its end (the file never reads empty; the kubelet
  reads it once the container has exited, when nothing writes any more).
- It does not exist: created only when the path was set (`MPI_BOOTSTRAP_TERMINATION_LOG`,
  `--termination-log`), in its existing directory, atomically (a temporary file renamed
  over). The default path is used only where it exists: the agent puts nothing in a
  container's /dev that the runtime did not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from mpi_bootstrap.core.termination import LIMIT


def write(path: str, text: str, *, create: bool) -> bool:
    """Write `text` (cut to LIMIT bytes) to `path`; whether it was written."""
    if not path:
        return False
    data = text.encode("utf-8", "replace")[:LIMIT]
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return create and _create(path, data)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _create(path: str, data: bytes) -> bool:
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return False
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
