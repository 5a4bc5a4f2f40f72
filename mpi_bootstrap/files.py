"""Files the agent writes: always atomically, never half-written, never through a symlink."""

from __future__ import annotations

import contextlib
import os
import tempfile

from mpi_bootstrap.errors import WriteError


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never half.

    The temporary file lives in the same directory (same filesystem, so rename is atomic)
    and is removed if anything fails (a full disk, a signal): no half-written file is
    ever left behind. Failures are WriteError (exit 73) naming the path.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        # mkstemp: O_EXCL with a random name, so a planted file or symlink is never followed.
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    except OSError as exc:
        raise WriteError.of(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError.of(path, exc) from None
        raise


def private_dir(path: str, what: str) -> None:
    """Create `path` 0700 (or make an existing one 0700); WriteError if that fails."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise WriteError(f"{what}: cannot create {path}: {exc.strerror or exc}") from None
