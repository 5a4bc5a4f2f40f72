"""Files the agent writes: always atomically, never half-written, never through a symlink."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile

from mpi_bootstrap.errors import ConfigError, WriteError


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


def state_dir(path: str, setting: str = "MPI_BOOTSTRAP_STATE_DIR") -> None:
    """The agent's private directory: created 0700, or an existing one made 0700 — only
    if it is a real directory owned by this user. Someone else's directory (or a symlink
    to one) is refused: its owner could swap the ssh config the agent writes there, and
    ssh runs what that config says (ProxyCommand) as this user."""
    try:
        with contextlib.suppress(FileExistsError):  # not a directory: said below
            os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise WriteError(f"{setting}: cannot create {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError([f"{setting}: {path} is not a directory"
                           + (" (a symlink)" if stat.S_ISLNK(st.st_mode) else "")])
    if st.st_uid != os.geteuid():
        raise ConfigError([f"{setting}: {path} belongs to uid {st.st_uid}, not to this "
                           f"user ({os.geteuid()})"])
    try:
        os.chmod(path, 0o700)
    except OSError as exc:
        raise WriteError(f"{setting}: cannot make {path} private: "
                         f"{exc.strerror or exc}") from None
