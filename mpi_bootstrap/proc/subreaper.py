"""The child-subreaper flag (prctl PR_SET_CHILD_SUBREAPER): when the agent is not PID 1
(`shareProcessNamespace: true`, a test, a shell), an orphan of its descendants re-parents
to the agent, not the host's init, so it is still reaped and ended with the leftovers. Set
before the first child starts (cli.py; why: docs/pid1.md, "Reaping and the end"); it
survives execve and is not inherited. Standard library only (the resident imports it).
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
