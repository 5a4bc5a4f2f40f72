"""A user with uid 1000 for the tests that need one (tests/conftest.py `uid1000`), shared by
every session of the suite on the machine.

Where the machine has none, one is made (`mpiuser`, marked as ours in its comment) and
removed when the last session that uses it ends: two sessions at once (two clones tested
on one machine) must neither both make it nor remove it under each other. A lock file
serialises the look and the change; each session holds a shared lock on a second file
for as long as it uses the user, and one that ends removes the user only when it can
take that one alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import pwd
import subprocess
from collections.abc import Iterator

UID = 1000
NAME = "mpiuser"
MARK = "mpi-bootstrap tests"  # its comment (GECOS): a user this module made
MUTEX = "/run/mpib-uid1000.lock"
USERS = "/run/mpib-uid1000.users"


def _ours() -> bool:
    try:
        return pwd.getpwuid(UID).pw_gecos == MARK
    except KeyError:
        return False


@contextlib.contextmanager
def uid1000() -> Iterator[str]:
    """The name of the user with uid 1000, made first if there is none."""
    with open(MUTEX, "a") as mutex, open(USERS, "a") as users:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        try:
            try:
                name = pwd.getpwuid(UID).pw_name
            except KeyError:
                subprocess.run(
                    ["useradd", "-u", str(UID), "-M", "-s", "/bin/sh", "-c", MARK, NAME], check=True
                )
                name = NAME
            fcntl.flock(users, fcntl.LOCK_SH)
        finally:
            fcntl.flock(mutex, fcntl.LOCK_UN)
        try:
            yield name
        finally:
            fcntl.flock(mutex, fcntl.LOCK_EX)
            try:
                fcntl.flock(users, fcntl.LOCK_UN)
                try:  # alone: no other session uses it
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    if _ours():
                        subprocess.run(["userdel", NAME], check=False)
            finally:
                fcntl.flock(mutex, fcntl.LOCK_UN)
