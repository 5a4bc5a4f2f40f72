"""Leaving the full interpreter: `--exec` (the agent becomes mpirun), or the hand-off
to the lean resident supervisor (resident.py).

The launcher and the worker prepare everything with structlog, dnspython and paramiko
loaded, then exec `python -I -S … mpi_bootstrap.pid1.resident --plan-fd N`, so the
process that stays resident for the whole job imports only the standard library. The
spec travels in a memfd (the environment can be large); signals are blocked across the
exec so none is lost (a blocked signal stays pending; an unhandled one would be dropped
by the kernel for a PID 1), and the supervisor unblocks them once its handlers exist.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from mpi_bootstrap.core.env import public
from mpi_bootstrap.proc import children, signals
from mpi_bootstrap.proc.spawn import exec_error, resolve


def exec_replace(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace the agent by argv (`--exec`). Returns only by raising ExecError."""
    path = resolve(argv[0], env.get("PATH"))
    if path is None:
        raise exec_error(argv[0])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, list(argv), dict(env))
    except OSError as exc:
        raise exec_error(argv[0], exc) from None


def handoff(argv: Sequence[str], env: Mapping[str, str], *, grace: float, group: bool,
            role: str, log_level: str, log_format: str = "json", **extra: Any) -> None:
    """Re-exec into the resident supervisor, which then runs argv (or adopts
    `extra["adopt"]`, a child already running: children survive exec)."""
    path = resolve(argv[0], env.get("PATH"))
    if path is None:  # fail here, where the message can still name the plan's mpirun
        raise exec_error(argv[0])
    if "adopt" in extra:
        children.handed_off(int(extra["adopt"]))
    spec = {"argv": list(argv), "env": dict(env), "grace": grace, "group": group,
            "role": role, "log_level": log_level, "log_format": log_format,
            "inherited": sorted(signals.inherited()), **extra}
    fd = os.memfd_create("mpi-bootstrap-plan", 0)  # not CLOEXEC: the new image reads it
    os.write(fd, json.dumps(spec).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from mpi_bootstrap.pid1.resident import main; sys.exit(main())")
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    try:
        # The resident process's own environment carries no secret: it stays readable
        # in /proc/1/environ for the whole job (system/environ.py); what it needs is in the spec.
        os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", code,
                                   "--plan-fd", str(fd)], public(os.environ))
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.HANDLED)
        os.close(fd)
        raise
