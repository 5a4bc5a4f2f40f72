"""Starting a program: posix_spawn with default dispositions, and what its end means.

Standard library only (the resident supervisor uses it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mpi_bootstrap.core.errors import ExecError, ExitStatus, signal_exit_status
from mpi_bootstrap.proc import signals, terminal

MAX_FD = 1 << 20  # fork_call's copy closes every descriptor from 3 below this


def resolve(program: str, path: str | None) -> str | None:
    """`program` found the way execvp would, on `path`."""
    if "/" in program:
        return program
    for directory in (path or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def exit_code(status: int) -> int:
    """A wait status as a shell reports it (death by signal N → 128+N)."""
    return shell_code(os.waitstatus_to_exitcode(status))


def shell_code(returncode: int) -> int:
    """A returncode (−N for signal N, as waitstatus_to_exitcode and Popen give it) as a
    shell reports it."""
    return signal_exit_status(-returncode) if returncode < 0 else returncode


def exec_error(program: str, exc: OSError | None = None) -> ExecError:
    """127 for a program that is not there, 126 for one that cannot be executed."""
    if exc is None or isinstance(exc, FileNotFoundError):
        return ExecError(f"{program}: command not found", ExitStatus.NOT_FOUND)
    return ExecError(f"{program}: not executable ({exc.strerror})", ExitStatus.NOT_EXECUTABLE)


def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    new_group: bool = False,
    stderr: tuple[int, int] | None = None,
) -> int:
    """Start argv; return its PID. Every signal at its default (but those the agent
    inherited ignored: signals.py) and an empty mask. `new_group`: it leads a process
    group of its own. `stderr`: a pipe (read end, write end) to become its stderr."""
    path = resolve(argv[0], env.get("PATH"))
    if path is None:
        raise exec_error(argv[0])
    kwargs: dict[str, Any] = {"setsigdef": signals.child_defaults(), "setsigmask": ()}
    if stderr is not None:
        kwargs["file_actions"] = [
            (os.POSIX_SPAWN_DUP2, stderr[1], 2),
            (os.POSIX_SPAWN_CLOSE, stderr[0]),
        ]
    if new_group:
        kwargs["setpgroup"] = 0
    with _inherited_ignored():
        try:
            return os.posix_spawn(path, list(argv), dict(env), **kwargs)
        except OSError as exc:
            raise exec_error(argv[0], exc) from None


Starter = Callable[..., int]  # start's call shape: (argv, env, *, new_group, stderr) -> PID


def start_main(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    group: bool,
    pipe_stderr: bool,
    starter: Starter = start,
) -> tuple[int, int | None, bool]:
    """Start the job's main child as PID 1 runs it: a process group of its own with
    `group` or on a terminal, which it is then given (proc/terminal.py); with
    `pipe_stderr` its stderr a pipe, whose read end (close-on-exec, non-blocking) is
    returned for the failure explainer's tee. Returns (PID, that read end, on a terminal)."""
    tty = terminal.is_ours()
    pipe = os.pipe2(os.O_CLOEXEC) if pipe_stderr else None
    try:
        pid = starter(argv, env, new_group=group or tty, stderr=pipe)
    except BaseException:
        if pipe is not None:
            os.close(pipe[0])
        raise
    finally:
        if pipe is not None:
            os.close(pipe[1])
    if tty:
        terminal.give(pid)
    if pipe is None:
        return pid, None, tty
    os.set_blocking(pipe[0], False)
    return pid, pipe[0], tty


@contextlib.contextmanager
def _inherited_ignored() -> Iterator[None]:
    """The signals the agent inherited ignored, ignored for the moment of the spawn.

    PID 1 has a handler for them (to forward them), and a handler cannot survive exec:
    the child would get them at their default. So, as tini's child keeps them: block
    them (a blocked signal is kept pending, never dropped), ignore them, spawn, put the
    handlers back, unblock. Signal dispositions belong to the main thread's code.
    """
    wanted = [s for s in signals.inherited() if signal.getsignal(s) not in (signal.SIG_IGN, None)]
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in wanted}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def fork_call(fn: Callable[[], int]) -> int:
    """Run `fn` in a forked copy of this process; its PID. For the resident supervisor:
    a fork of a running interpreter costs about a millisecond of CPU, a new interpreter
    16 ms. The copy starts as any child does (every signal at its default but those
    inherited ignored, an empty mask, no wakeup descriptor), keeps only descriptors 0, 1
    and 2, and ends with fn's code (70 if it raised) without this process's exit
    handlers or buffers. Call it from a single-threaded process."""
    # Blocked across the fork: a signal that reached the copy before its handlers are
    # reset would go through the shared wakeup pipe, to be read as the parent's own.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals.HANDLED)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid
    code = int(ExitStatus.INTERNAL)
    try:
        signal.set_wakeup_fd(-1)
        for s in signals.child_defaults():
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.closerange(3, MAX_FD)
        code = fn()
    except BaseException:  # the copy must never return into the parent's code
        code = int(ExitStatus.INTERNAL)
    finally:
        os._exit(code)
