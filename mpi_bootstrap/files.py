"""Files the agent writes: always atomically, never half-written, never through a symlink."""

from __future__ import annotations

import contextlib
import os
import tempfile


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never half.

    The temporary file lives in the same directory (same filesystem, so rename is atomic)
    and is removed if anything fails.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # mkstemp: O_EXCL with a random name, so a planted file or symlink is never followed.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
