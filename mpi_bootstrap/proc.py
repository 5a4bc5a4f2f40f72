"""The one module that starts processes and collects their exit status.

Nothing else in the agent calls subprocess, fork, exec or waitpid: a reaping PID 1 that
lets two modules wait on children loses exit statuses (FIELD-NOTES §4).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from types import FrameType

from mpi_bootstrap.errors import ExecError, ExitStatus, signal_exit_status

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)


def _exec_error(argv0: str, exc: OSError) -> ExecError:
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return ExecError(f"{argv0}: command not found", ExitStatus.NOT_FOUND)
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.ENOEXEC):
        return ExecError(f"{argv0}: not executable ({exc.strerror})",
                         ExitStatus.NOT_EXECUTABLE)
    return ExecError(f"{argv0}: cannot execute ({exc.strerror})", ExitStatus.NOT_EXECUTABLE)


def exit_code(returncode: int) -> int:
    """A Popen returncode as a shell would report it (−N → 128+N)."""
    return signal_exit_status(-returncode) if returncode < 0 else returncode


def capture(argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 20.0) -> tuple[int, str]:
    """Run argv to completion; return (exit code, stdout and stderr together)."""
    try:
        done = subprocess.run(list(argv), env=None if env is None else dict(env),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except OSError as exc:
        raise _exec_error(argv[0], exc) from None
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode("utf-8", "replace") if exc.output else ""
        return 124, out + f"\n(timed out after {timeout:g} s)"
    return exit_code(done.returncode), done.stdout.decode("utf-8", "replace")


def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start argv, forward the catchable signals to it, return its exit code."""
    try:
        child = subprocess.Popen(list(argv), env=dict(env))
    except OSError as exc:
        raise _exec_error(argv[0], exc) from None

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        return exit_code(child.wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def which(name: str, path: str | None) -> str | None:
    """`name` resolved like execvp would, on `path` (a PATH value)."""
    if "/" in name:
        return name
    for directory in (path or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
