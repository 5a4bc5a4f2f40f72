"""The child-subreaper flag (prctl PR_SET_CHILD_SUBREAPER): when the agent is not PID 1
(a pod with `shareProcessNamespace: true`, a test, a shell), an orphan of any of its
descendants re-parents to the agent instead of the host's init, so it is still reaped,
and ended with the job's other leftovers.

The flag is set before the agent's first child starts (cli.py): the launcher starts
mpirun before its hand-off to the resident supervisor, and an orphan made in mpirun's
first instant would otherwise be gone to init already. It survives execve (the hand-off),
and is not inherited by children. Standard library only (the resident imports it).
"""

from __future__ import annotations

import ctypes

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def become() -> bool:
    """Set the flag; False where the kernel or libc refuses it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def is_set() -> bool:
    """Whether this process is a child subreaper now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return bool(flag.value)
