"""Children started before the hand-off (sshd being checked, `mpirun --version`,
preflight's ssh), and the agent's own early signal handling.

Every child started here is registered until it is reaped: if the agent gives up or is
interrupted before the hand-off, end_pending() stops them (whole process groups), so
none outlives the agent as an orphan. Once it has run, nothing new is started (threads
of an interrupted fan-out would otherwise start the next ssh).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from mpi_bootstrap.proc import signals
from mpi_bootstrap.proc.spawn import exec_error, exit_code, shell_code, start
from mpi_bootstrap.system.retry import LOCAL, retry_until

if TYPE_CHECKING:
    import subprocess

# PID → whether it leads its own process group.
_pending: dict[int, bool] = {}
_stopping = False


class Interrupted(Exception):
    """A terminating signal arrived before the supervisor existed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def install_early_handlers() -> None:
    """Before any slow step: TERM/INT/HUP/QUIT end the agent (128+N); then the signals
    the entry point blocked (entry.py) are let in.

    A PID 1 drops signals it has no handler for, so without this a SIGTERM during the
    DNS wait would be lost and the pod would sit out its grace period. USR1 and USR2 are
    ignored; other signals have nothing to reach yet. SIGCHLD keeps its default:
    `capture` waits on its own child, and nothing else is ours to reap yet.
    """
    for s in signals.TERMINATING:
        signal.signal(s, _raise)
    for s in (signal.SIGUSR1, signal.SIGUSR2):  # would end a non-PID-1 agent; no use yet
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.TERMINATING)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    group: bool,
    stderr: tuple[int, int] | None = None,
) -> int:
    """Start argv (see spawn.start) and register it until it is reaped (or handed off);
    return its PID."""
    if _stopping:
        raise Interrupted(signal.SIGTERM)
    pid = start(argv, env, new_group=group, stderr=stderr)
    _pending[pid] = group
    return pid


def exited(pid: int, *, wait: bool = False) -> int | None:
    """The exit code of our child `pid` if it has ended (reaping it), else None."""
    try:
        done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
    except ChildProcessError:
        _pending.pop(pid, None)
        return None
    if done != pid:
        return None
    _pending.pop(pid, None)
    return exit_code(status)


def handed_off(pid: int) -> None:
    """`pid` now belongs to the resident supervisor (it survives the exec)."""
    _pending.pop(pid, None)


@contextlib.contextmanager
def handing_off(pid: int) -> Iterator[None]:
    """`pid` belongs to the resident supervisor once the exec inside this block succeeds
    (children survive it); if the block raises, it is ours to stop again."""
    group = _pending.pop(pid, False)
    try:
        yield
    except BaseException:
        _pending[pid] = group
        raise


def _signal(pid: int, group: bool, signum: int) -> bool:
    """Signal our child (its group if it leads one); False if it is already gone."""
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _gone(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # reaped already (by the thread that ran it)
        return True


def end(pid: int, grace: float, *, patience: float = 0.0) -> int | None:
    """End our child `pid`: given `patience` s to exit by itself, then SIGTERM, then
    SIGKILL after `grace` s (to its whole group, if it leads one, and to what is left of
    that group once it has gone); its exit code, None if it was gone already. For
    mpirun started beside the launch gate's checks: what it started (gates, ssh) goes
    with it."""
    group = _pending.pop(pid, False)
    code: list[int | None] = [None]

    def ended() -> bool | None:
        code[0] = exited(pid)
        return True if code[0] is not None else None

    if (
        not retry_until(time.monotonic() + patience, ended, every=LOCAL)
        and _signal(pid, False, signal.SIGTERM)
        and not retry_until(time.monotonic() + grace, ended, every=LOCAL)
    ):
        _signal(pid, group, signal.SIGKILL)
        code[0] = exited(pid, wait=True)
    if group:
        _signal(pid, True, signal.SIGKILL)
    return code[0]


def end_pending(grace: float = 1.0) -> int:
    """SIGTERM every child still pending, SIGKILL what is left after `grace` s; reap them.
    Returns how many were signalled. Only PIDs this process started are touched."""
    global _stopping  # noqa: PLW0603 - one flag for the whole (exiting) process
    _stopping = True
    count = 0
    deadline = time.monotonic() + grace
    while _pending:
        batch = dict(_pending)
        alive = {pid: g for pid, g in batch.items() if _signal(pid, g, signal.SIGTERM)}
        count += len(alive)

        def all_gone() -> bool | None:
            nonlocal alive
            alive = {pid: g for pid, g in alive.items() if not _gone(pid)}
            return None if alive else True

        retry_until(deadline, all_gone, every=LOCAL)
        for pid, g in alive.items():
            _signal(pid, g, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for pid in batch:  # a thread may have added one meanwhile: next round
            _pending.pop(pid, None)
    return count


def end_adopted(grace: float = 1.0) -> int:
    """After end_pending, as the agent exits without a hand-off: the orphans that
    re-parented to it (a subreaper: proc/subreaper.py), ssh's ControlMaster daemons above
    all, would outlive it (ControlPersist) under the host's init. They are ours now:
    registered like the children it started, and ended the same way (end_pending).
    Returns how many were signalled."""
    for pid in _children():
        _pending.setdefault(pid, False)  # not group leaders of ours: the process alone
    return end_pending(grace)


def _children() -> list[int]:
    """This process's children now (every thread's), from /proc."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with (
                contextlib.suppress(OSError),
                open(f"/proc/self/task/{task}/children", encoding="ascii") as fh,
            ):
                found.update(int(p) for p in fh.read().split())
    return sorted(found)


def capture(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 20.0,
    stdin: bytes = b"",
) -> tuple[int, str]:
    """Run argv to completion, `stdin` its input; return (exit code, stdout and stderr
    together).

    The child leads its own session, so a timeout ends it with everything it started
    (a wrapper script's children would otherwise hold the pipe open past the timeout).
    """
    import subprocess

    child = open_piped(
        argv, env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    with child:
        try:
            out, _ = child.communicate(stdin or None, timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal(child.pid, True, signal.SIGKILL)
            try:
                out, _ = child.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:  # a grandchild left the group and the pipe
                out = b""
            return 124, out.decode("utf-8", "replace") + f"\n(timed out after {timeout:g} s)"
        except BaseException:  # Interrupted: the child goes with us
            _signal(child.pid, True, signal.SIGKILL)
            raise
        finally:
            _pending.pop(child.pid, None)
    return shell_code(child.returncode), out.decode("utf-8", "replace")


def open_piped(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *, stdin: int = -1, stderr: int = -1
) -> subprocess.Popen[bytes]:
    """Start argv in its own session with its stdout (and by default stdin and stderr:
    -1 is subprocess.PIPE) on pipes, registered like any pending child; `capture` and
    `close_piped` end it."""
    import subprocess

    if _stopping:
        raise Interrupted(signal.SIGTERM)
    try:
        child = subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
            restore_signals=True,
        )
    except OSError as exc:
        raise exec_error(argv[0], exc) from None
    _pending[child.pid] = True
    return child


def close_piped(
    child: subprocess.Popen[bytes], timeout: float = 2.0, limit: int = 1 << 20
) -> tuple[int, str]:
    """Close its stdin (the remote side's cue to end), wait up to `timeout`, then kill
    its group; (exit code, what it wrote to stderr: its first `limit` bytes — what it
    sends past them, and on stdout, is read and dropped, never kept)."""
    with contextlib.suppress(OSError):
        if child.stdin is not None:
            child.stdin.close()
    child.stdin = None
    try:
        deadline = time.monotonic() + timeout
        err = _drain(child, deadline, limit)
        with contextlib.suppress(Exception):
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        if child.poll() is None:
            _signal(child.pid, True, signal.SIGKILL)
            with contextlib.suppress(Exception):
                child.wait(timeout=2.0)
    finally:
        _pending.pop(child.pid, None)
    return shell_code(child.returncode if child.returncode is not None else -9), err.decode(
        "utf-8", "replace"
    )


def _drain(child: subprocess.Popen[bytes], deadline: float, limit: int) -> bytes:
    """Read a child's stdout and stderr until both end or `deadline`; the first `limit`
    bytes of stderr."""
    import select

    pipes = {p.fileno(): p for p in (child.stdout, child.stderr) if p is not None and not p.closed}
    err_fd = child.stderr.fileno() if child.stderr is not None and not child.stderr.closed else -1
    poller, err = select.poll(), b""
    for fd in pipes:
        poller.register(fd, select.POLLIN)
    while pipes and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(int(left * 1000) + 1):
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                pipes.pop(fd).close()
            elif fd == err_fd and len(err) < limit:
                err += chunk[: limit - len(err)]
    for p in pipes.values():
        p.close()
    return err


def kill_piped(child: subprocess.Popen[bytes]) -> None:
    """End a piped child and its group at once, reading nothing more of what it sends
    (a child that floods its pipes: close_piped would take it all into memory)."""
    _signal(child.pid, True, signal.SIGKILL)
    for pipe in (child.stdin, child.stdout, child.stderr):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    with contextlib.suppress(Exception):
        child.wait(timeout=2.0)
    _pending.pop(child.pid, None)


def close_all(
    piped: Iterable[subprocess.Popen[bytes]], timeout: float = 2.0, *, wait: bool = True
) -> None:
    """close_piped for many at once: every stdin closed first (each child's cue to end),
    then the waits. Without `wait`, they are handed off instead (handed_off: the resident
    supervisor reaps them after the exec)."""
    piped = list(piped)
    for child in piped:
        with contextlib.suppress(OSError):
            if child.stdin is not None:
                child.stdin.close()
        child.stdin = None
    for child in piped:
        if wait:
            close_piped(child, timeout)
        else:
            handed_off(child.pid)


def stderr_soon(child: subprocess.Popen[bytes], timeout: float = 1.0) -> str:
    """What a piped child wrote to stderr, up to its end or `timeout` (its stderr stays
    open: close_piped reads the rest)."""
    import select

    if child.stderr is None:
        return ""
    fd, out, end = child.stderr.fileno(), b"", time.monotonic() + timeout
    while len(out) < 65536 and (left := end - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0] or not (chunk := os.read(fd, 4096)):
            break
        out += chunk
    return out.decode("utf-8", "replace")


class Lines:
    """A piped child (open_piped) and its stdout, line by line, each wait bounded by a
    deadline (poll() on the pipe itself: a buffered reader would hide lines already
    read from it, and select() fails once a descriptor's number reaches 1024 — a
    launcher with hundreds of sessions open has such numbers). A line longer than
    `limit` bytes is cut there: what a child sends cannot grow this process's memory."""

    def __init__(self, child: subprocess.Popen[bytes], limit: int = 1 << 20) -> None:
        if child.stdout is None:
            raise ValueError("Lines needs a child started with its stdout on a pipe")
        self.child, self.limit = child, limit
        self.fd, self.buf, self.eof = child.stdout.fileno(), b"", False

    def next(self, deadline: float) -> str | None:
        """The next line, or None (the child's stdout ended, or `deadline` passed)."""
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while b"\n" not in self.buf and not self.eof and len(self.buf) <= self.limit:
            left = max(0.0, deadline - time.monotonic())
            if not poller.poll(int(left * 1000) + (left > 0)):
                return None
            chunk = os.read(self.fd, 65536)
            self.buf += chunk
            self.eof = not chunk
        if b"\n" not in self.buf[: self.limit + 1]:
            if len(self.buf) <= self.limit:
                return None
            self.buf = self.buf[: self.limit] + b"\n" + self.buf[self.limit :]
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace").strip()

    def rest(self) -> str:
        """What arrived after the last line returned (the child ended mid-line)."""
        return self.buf.decode("utf-8", "replace")
