"""The agent's secrets, out of its own process (core/env.py says which they are).

`MPI_BOOTSTRAP_TOKEN` enters once (core/config.py) and then leaves the process environment:
every process of the same user can read `/proc/<pid>/environ` of the agent without
ptrace — the ranks included (tests/test_attacks.py::TestTokenNotInEnviron). Removing a
variable (unsetenv) does not change `/proc/<pid>/environ`, which shows the memory the
kernel filled at exec, so that memory is overwritten too; and no child, and no image the
agent execs into, gets it. Standard library only.
"""

from __future__ import annotations

import ctypes
import os

from mpi_bootstrap.core.env import SECRET_VARIABLES


def scrub_process() -> int:
    """Remove the secrets from this process's environment, and blank them in the memory
    `/proc/self/environ` reads. Returns how many were blanked there."""
    for name in SECRET_VARIABLES:
        os.environ.pop(name, None)  # unsetenv: glibc's environ no longer points there
    try:
        with open("/proc/self/environ", "rb") as fh:
            block = fh.read()
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0
    # Fields after the command name (which may hold spaces): state is field 3, so field
    # N is at index N-3; env_start is field 50 (proc(5)).
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 49:
        return 0
    env_start = int(fields[47])
    blanked = 0
    offset = 0
    for entry in block.split(b"\0"):
        name = entry.split(b"=", 1)[0].decode("ascii", "replace")
        if name in SECRET_VARIABLES:
            ctypes.memset(env_start + offset, 0, len(entry))
            blanked += 1
        offset += len(entry) + 1
    return blanked
