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

import contextlib
import dataclasses
import fcntl
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.spec import Spec, encode
from mpi_bootstrap.proc import children, signals
from mpi_bootstrap.proc.spawn import exec_error, resolve, start_main
from mpi_bootstrap.system import files


def exec_replace(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace the agent by argv (`--exec`). Returns only by raising ExecError."""
    path = resolve(argv[0], env.get("PATH"))
    if path is None:
        raise exec_error(argv[0])
    files.keep_held()  # its ssh reaches a held state directory through this PID's fds
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, list(argv), dict(env))
    except OSError as exc:
        raise exec_error(argv[0], exc) from None


def handoff(spec: Spec) -> NoReturn:
    """Re-exec into the resident supervisor, which then runs `spec.argv` (or adopts
    `spec.adopt`, a child already running: children survive exec). Returns only by
    raising."""
    path = resolve(spec.argv[0], spec.env.get("PATH"))
    if path is None:  # fail here, where the message can still name the plan's mpirun
        raise exec_error(spec.argv[0])
    spec = dataclasses.replace(spec, inherited=tuple(sorted(signals.inherited())))
    files.keep_held()  # the state directory stays this pod's (files.hold)
    fd = os.memfd_create("mpi-bootstrap-plan", 0)  # not CLOEXEC: the new image reads it
    os.write(fd, encode(spec))
    os.lseek(fd, 0, os.SEEK_SET)
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import sys; sys.path.insert(0, {package_parent!r}); "
        "from mpi_bootstrap.pid1.resident import main; sys.exit(main())"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    adopted = (
        children.handing_off(spec.adopt) if spec.adopt is not None else contextlib.nullcontext()
    )
    try:
        with adopted:
            # The resident process's own environment carries no secret: it stays readable in
            # /proc/1/environ for the whole job (system/environ.py); what it needs is in the spec.
            os.execve(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", code, "--plan-fd", str(fd)],
                public(os.environ),
            )
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.HANDLED)
        os.close(fd)
        raise
    raise AssertionError("unreachable: execve returned")


@dataclasses.dataclass(frozen=True)
class Started:
    """The job's main child, started here for the resident to adopt (`handoff`)."""

    pid: int
    stderr_fd: int | None  # the read end of its stderr pipe (the explainer's tee)
    tty: bool  # it was given the terminal


def start(argv: Sequence[str], env: Mapping[str, str], *, group: bool) -> Started:
    """Start argv as the resident would run it (spawn.start_main: its stderr piped, its
    own group with `group` or on a terminal, the terminal given), registered until it
    is handed off: if the agent gives up first, children.end_pending ends it (its whole
    group if it leads one). Signals wait (blocked) from before the start until it is
    registered, so none can leave it unaccounted for; the caller's mask is restored."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    try:
        pid, err, tty = start_main(argv, env, group=group, pipe_stderr=True, starter=_registered)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if err is not None:  # (always, with pipe_stderr)
        os.set_inheritable(err, True)  # the resident's, after the exec
        # Nobody reads it until the hand-off, which waits for the launch gate's checks:
        # room for what mpirun says meanwhile (Open MPI: a setpgid warning per host past
        # ~250 hosts), so that it never waits on a full pipe.
        with contextlib.suppress(OSError):
            fcntl.fcntl(err, fcntl.F_SETPIPE_SZ, 1 << 20)
    return Started(pid, err, tty)


def start_and_handoff(spec: Spec) -> NoReturn:
    """Start `spec.argv` here (`start`), then hand it over running (`adopt`): its start
    overlaps the exec and the resident's imports instead of waiting for them. Signals are
    blocked from before the start: one that arrives meanwhile waits for the resident,
    which forwards it to argv, instead of meeting the agent's early handlers."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    started = None
    try:
        started = start(spec.argv, spec.env, group=spec.group)
        adopt(started, spec)
    except BaseException:
        if started is not None and started.stderr_fd is not None:
            os.close(started.stderr_fd)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.HANDLED)
        raise


def adopt(started: Started, spec: Spec) -> NoReturn:
    """Hand `started`, running, over to the resident supervisor (`handoff`)."""
    handoff(
        dataclasses.replace(spec, adopt=started.pid, stderr_fd=started.stderr_fd, tty=started.tty)
    )


def _registered(
    argv: Sequence[str], env: Mapping[str, str], *, new_group: bool, stderr: tuple[int, int] | None
) -> int:
    """spawn.start, the child registered until handed off (children.spawn)."""
    return children.spawn(argv, env, group=new_group, stderr=stderr)
