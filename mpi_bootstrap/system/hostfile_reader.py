"""Reading a hostfile from disk: a settled state of the file, never a half-written one.

Parsing is pure and lives in `core.hostfile`; this is the I/O before it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

from mpi_bootstrap.core.errors import HostfileError
from mpi_bootstrap.core.hostfile import MAX_BYTES, Hostfile, parse
from mpi_bootstrap.system.retry import FILE, retry_until

# A hostfile someone is rewriting in place (`cat > hostfile`, a script appending line by
# line) must not be read half-written: a truncated name is still a valid name, and the
# job would wait for a host that does not exist. ConfigMap mounts are swapped atomically
# and have an old mtime, so this costs nothing in a pod.
QUIET_S = 0.1  # a file changed less than this long ago may still be being written
SETTLE_S = 5.0  # give up (exit 65) if it keeps changing this long


def read(path: str) -> Hostfile:
    """Read and parse `path`; every problem is a HostfileError naming file:line.

    The bytes parsed are a state the file was in for at least QUIET_S: the file is read
    again if it changed while being read or was changed just before.
    """
    looked_twice = False

    def settled() -> bytes | None:
        nonlocal looked_twice
        data, before, after = _read_once(path)
        if len(data) > MAX_BYTES:
            raise HostfileError(
                f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a hostfile"
            )
        if not stat.S_ISREG(before.st_mode):
            return data  # a pipe or a device has no size or mtime to compare
        age = time.time() - after.st_mtime
        if not _same(before, after) or len(data) != after.st_size:
            return None
        if not data and not looked_twice:
            # truncate(2) sets the size before the mtime: an empty file with an old
            # mtime may be one being rewritten this instant. Look again.
            looked_twice = True
            return None
        if not 0 <= age < QUIET_S:
            return data
        time.sleep(QUIET_S - age)  # until it has been quiet for QUIET_S
        with contextlib.suppress(OSError):
            if _same(after, os.stat(path)):
                return data
        return None

    data = retry_until(time.monotonic() + SETTLE_S, settled, every=FILE)
    if data is None:
        raise HostfileError(
            f"{path}: kept changing while being read for {SETTLE_S:g} s "
            "(write it to a temporary file, then rename it into place)"
        )
    return parse(data, path)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_ino, a.st_dev, a.st_size, a.st_mtime_ns) == (
        b.st_ino,
        b.st_dev,
        b.st_size,
        b.st_mtime_ns,
    )


def _read_once(path: str) -> tuple[bytes, os.stat_result, os.stat_result]:
    """(bytes, stat of the open file before reading, stat of the path after)."""
    try:
        with open(path, "rb") as fh:
            before = os.fstat(fh.fileno())
            data = fh.read(MAX_BYTES + 1)
        after = os.stat(path) if stat.S_ISREG(before.st_mode) else before
    except FileNotFoundError:
        raise HostfileError(f"{path}: hostfile not found") from None
    except IsADirectoryError:
        raise HostfileError(f"{path}: is a directory, not a hostfile") from None
    except PermissionError:
        raise HostfileError(f"{path}: hostfile not readable (permission denied)") from None
    except OSError as exc:
        raise HostfileError(f"{path}: cannot read hostfile: {exc.strerror or exc}") from None
    return data, before, after
