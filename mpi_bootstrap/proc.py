"""Processes: the one module that starts them and the only one that calls waitpid.

Three ways out of the agent:
- `capture`: a short helper run (`mpirun --version`), waited on by `subprocess` before
  any supervision exists.
- `exec_replace` (`--exec`): the agent becomes mpirun (for images that already run tini).
- `handoff` → the resident supervisor below, as PID 1 or as a child subreaper.

The resident supervisor runs one main child.

It forwards signals to the child, reaps every process that dies (orphans re-parent to
PID 1 and to a subreaper), and when the main child ends, sends SIGTERM to what is left,
then SIGKILL after a grace period, and exits with the main child's code (128+N for a
death by signal N). It is the only code that calls waitpid(-1), so no exit status is ever
lost to another waiter — the classic bug of Python inits where `subprocess` reads 0 for a
child someone else reaped (FIELD-NOTES §4).

The launcher prepares everything in a full interpreter, then execs
`python -I -S … mpi_bootstrap.proc --plan-fd N`, so the process that stays resident
for the whole job imports only the standard modules below — not structlog, dnspython or
paramiko. Signals that arrive during that exec are blocked, not lost: the mask survives
exec and is lifted here once the handlers are in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpi_bootstrap.errors import ExecError, ExitStatus, signal_exit_status

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)
HANDLED = (*FORWARDED, signal.SIGCHLD)
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PR_SET_CHILD_SUBREAPER = 36

Log = Callable[..., None]
ArgvForPort = Callable[[int], list[str]]


def json_log(role: str, level: str = "info", stream: Any = None, fmt: str = "json") -> Log:
    """A tiny structured logger with structlog's keys (event, role, level, timestamp):
    JSON lines, or (`fmt="console"`, or "auto" on a TTY) one readable line per event."""
    order = {"debug": 10, "info": 20, "warning": 30, "error": 40}
    floor = order.get(level, 20)
    out = stream if stream is not None else sys.stderr
    console = fmt == "console" or (fmt == "auto" and out.isatty())

    def log(event: str, level: str = "info", **kw: Any) -> None:
        if order.get(level, 20) < floor:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        if console:
            pairs = " ".join(f"{k}={v}" for k, v in sorted({**kw, "role": role}.items()))
            out.write(f"{stamp} [{level:<9}] {event:<30} {pairs}\n")
        else:
            record = {**kw, "event": event, "role": role, "level": level, "timestamp": stamp}
            out.write(json.dumps(record) + "\n")
        out.flush()

    return log


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): orphans of our descendants re-parent to us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """PIDs below `root` in the process tree, read from /proc (deepest last)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


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


def _exec_error(program: str, exc: OSError | None = None) -> ExecError:
    """127 for a program that is not there, 126 for one that cannot be executed."""
    if exc is None or isinstance(exc, FileNotFoundError):
        return ExecError(f"{program}: command not found", ExitStatus.NOT_FOUND)
    return ExecError(f"{program}: not executable ({exc.strerror})", ExitStatus.NOT_EXECUTABLE)


def spawn(argv: Sequence[str], env: Mapping[str, str], *, group: bool,
          stderr: tuple[int, int] | None = None, pending: bool = True) -> int:
    """Start argv with default signal dispositions and an empty mask; return its PID.
    `stderr`: a pipe (read end, write end) to become the child's stderr. `pending`: the
    agent has not handed it to a supervisor yet (see end_pending)."""
    if _stopping:
        raise Interrupted(signal.SIGTERM)
    path = resolve(argv[0], env.get("PATH"))
    if path is None:
        raise _exec_error(argv[0])
    kwargs: dict[str, Any] = {"setsigdef": HANDLED, "setsigmask": ()}
    if stderr is not None:
        kwargs["file_actions"] = [(os.POSIX_SPAWN_DUP2, stderr[1], 2),
                                  (os.POSIX_SPAWN_CLOSE, stderr[0])]
    if group:
        kwargs["setpgroup"] = 0
    try:
        pid = os.posix_spawn(path, list(argv), dict(env), **kwargs)
    except OSError as exc:
        raise _exec_error(argv[0], exc) from None
    if pending:
        _pending[pid] = bool(group)
    return pid


# Children started before anything supervises them (sshd being checked, `mpirun
# --version`, preflight's ssh), PID → whether it leads its own process group: if the
# agent gives up or is interrupted before the hand-off, end_pending() stops them, so
# none outlives the agent as an orphan. Once it has run, nothing new is started
# (threads of an interrupted fan-out would otherwise start the next ssh).
_pending: dict[int, bool] = {}
_stopping = False


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
        while alive and time.monotonic() < deadline:
            alive = {pid: g for pid, g in alive.items() if not _gone(pid)}
            if alive:
                time.sleep(0.01)
        for pid, g in alive.items():
            _signal(pid, g, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for pid in batch:  # a thread may have added one meanwhile: next round
            _pending.pop(pid, None)
    return count


def _gone(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # reaped already (by the thread that ran it)
        return True


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Restart a service child that dies: backoff doubling from `delay` up to `max_delay`,
    at most `limit` restarts in any `window` seconds."""

    limit: int = 5
    window: float = 60.0
    delay: float = 0.2
    max_delay: float = 5.0


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


class Supervisor:
    """Runs one main child as its reaper and signal forwarder (optionally restarting it)."""

    def __init__(self, *, grace: float, group: bool, log: Log,
                 restart: RestartPolicy | None = None,
                 readers: Mapping[int, Callable[[], None]] | None = None,
                 stop_file: str | None = None, stop_text: str = "",
                 explain: bool = False) -> None:
        self.grace = grace
        self.group = group
        self.log = log
        self.restart = restart
        # Extra file descriptors served in the same loop (the worker's net exchange).
        self.readers = dict(readers or {})
        # A file whose appearance with `stop_text` in it ends the service (the job is
        # done: direxchange.py), checked each second.
        self.stop_file = stop_file
        self.stop_text = stop_text
        # Tee the child's stderr and explain a known failure after it (failures.py).
        self.explain = explain
        self._tail = bytearray()
        self._err: int | None = None
        self.give_up = False
        self.reaped_others = 0
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    TAIL = 256 * 1024  # how much of mpirun's stderr is kept for the explainer

    def _tee(self) -> None:
        """Copy what the child wrote to stderr through, keeping the last TAIL bytes."""
        assert self._err is not None  # noqa: S101 - only registered with the pipe
        try:
            data = os.read(self._err, 65536)
        except BlockingIOError:
            return
        if not data:
            self.readers.pop(self._err, None)
            os.close(self._err)
            self._err = None
            return
        with contextlib.suppress(OSError):
            os.write(2, data)
        self._tail += data
        del self._tail[:-self.TAIL]

    def _explain(self, code: int) -> None:
        while self._err is not None and self._err in self.readers:  # what is left now
            before = len(self._tail)
            self._tee()
            if len(self._tail) == before:
                break
        from mpi_bootstrap import failures

        found = failures.explain(self._tail.decode("utf-8", "replace"))
        if found is not None:
            self.log("mpirun failure explained", signature=found.signature, code=code)
            with contextlib.suppress(OSError):
                os.write(2, found.text(code).encode())

    def _job_done(self) -> bool:
        from mpi_bootstrap.files import read_regular

        assert self.stop_file is not None  # noqa: S101 - only called when set
        try:
            text = read_regular(self.stop_file, 256, owner=os.geteuid())
        except OSError:
            return False
        return text.decode("ascii", "replace") == self.stop_text

    def install(self) -> None:
        """Handlers first, then let any signal blocked across exec in."""
        signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        for s in HANDLED:
            signal.signal(s, _noop)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _signal_all(self, signum: int) -> int:
        """Signal every process below us (the main child is gone: these are leftovers)."""
        targets = descendants(os.getpid())
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return len(targets)

    def _forward(self, main: int, signum: int) -> None:
        try:
            if self.group:
                os.killpg(main, signum)
            else:
                os.kill(main, signum)
        except ProcessLookupError:
            return
        self.log("signal forwarded", signal=signal.Signals(signum).name, pid=main,
                 group=self.group)

    def _reap(self, main: int) -> tuple[int | None, bool]:
        """Collect every dead child. Returns (main's status if it died, no children left)."""
        status: int | None = None
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status, True
            if pid == 0:
                return status, False
            if pid == main:
                status = st
            else:
                self.reaped_others += 1
                self.log("reaped", level="debug", pid=pid, code=exit_code(st))

    def run(self, argv: Sequence[str], env: Mapping[str, str], adopt: int | None = None
            ) -> int:
        """Spawn argv and supervise it; return the exit code to exit with.

        Without a restart policy (the launcher) the code is the child's. With one (the
        worker's sshd), an unexpected death restarts the child after a backoff, at most
        `restart.limit` times per `restart.window` seconds, after which the agent gives
        up with 69 so that Kubernetes restarts the pod; a terminating signal stops the
        child and the agent exits 0. `adopt` is a child already started (the worker's
        sshd, started and checked before the hand-off).
        """
        # A terminating signal that arrived during the hand-off: do not start the job.
        if adopt is None:
            for signum in _drain(self._rfd):
                if signum in TERMINATING:
                    self.log("signal before start", signal=signal.Signals(signum).name)
                    return 0 if self.restart else signal_exit_status(signum)
            pipe = None
            if self.explain:
                pipe = os.pipe2(os.O_CLOEXEC)
                os.set_blocking(pipe[0], False)
            main = spawn(argv, env, group=self.group, stderr=pipe, pending=False)
            if pipe is not None:
                os.close(pipe[1])
                self._err = pipe[0]
                self.readers[pipe[0]] = self._tee
            self.log("child started", pid=main, program=argv[0])
        else:
            main = adopt
            self.log("child adopted", pid=main, program=argv[0])
        main_status: int | None = None
        stopping = False
        stop_signal = 0  # the terminating signal forwarded to the main child, if any
        deaths: list[float] = []
        restart_at: float | None = None
        deadline: float | None = None
        killed = False
        while True:
            wake = [t for t in (deadline, restart_at) if t is not None]
            if self.stop_file and not stopping:
                wake.append(time.monotonic() + 1.0)
            timeout = max(0.0, min(wake) - time.monotonic()) if wake else None
            ready, _, _ = select.select([self._rfd, *self.readers], [], [], timeout)
            for fd in ready:
                if fd in self.readers:
                    try:
                        self.readers[fd]()
                    except Exception as exc:  # PID 1 must outlive a bad reader
                        self.readers.pop(fd, None)
                        self.log("reader failed", level="error", fd=fd, error=repr(exc))
            if self.stop_file and not stopping and self._job_done():
                self.log("job done", file=self.stop_file)
                stopping = True
                restart_at = None
                if main_status is None:
                    self._forward(main, signal.SIGTERM)
            if self._rfd in ready:
                for signum in _drain(self._rfd):
                    if signum == signal.SIGCHLD:
                        continue
                    if signum in TERMINATING:
                        stopping = True
                        stop_signal = stop_signal or signum
                        restart_at = None
                    if main_status is None:
                        self._forward(main, signum)
            status, none_left = self._reap(main)
            if status is not None and main_status is None:
                code = exit_code(status)
                self.log("child exited", pid=main, code=code)
                if self.restart and not stopping:
                    now = time.monotonic()
                    deaths = [t for t in deaths if now - t < self.restart.window] + [now]
                    if len(deaths) > self.restart.limit:
                        self.log("giving up", level="error", program=argv[0],
                                 reason=f"{argv[0]} died {len(deaths)} times in "
                                        f"{self.restart.window:g} s; exiting so that "
                                        "Kubernetes restarts the pod")
                        sys.stderr.write(
                            f"mpi-bootstrap: {argv[0]} keeps dying ({len(deaths)} times in "
                            f"{self.restart.window:g} s, last exit {code}); giving up so "
                            "that Kubernetes restarts the pod\n")
                        main_status = status
                        self.give_up = True
                    else:
                        delay = min(self.restart.max_delay,
                                    self.restart.delay * 2 ** (len(deaths) - 1))
                        restart_at = now + delay
                        self.log("restarting", program=argv[0], in_s=round(delay, 2),
                                 deaths_in_window=len(deaths))
                else:
                    main_status = status
                if main_status is not None:
                    if not none_left:
                        n = self._signal_all(signal.SIGTERM)
                        self.log("terminating leftovers", processes=n, grace_s=self.grace)
                    deadline = time.monotonic() + self.grace
            if restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                main = spawn(argv, env, group=self.group, pending=False)
                self.log("child started", pid=main, program=argv[0], restarted=True)
            if main_status is not None:
                if none_left:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    if killed:
                        self.log("leftovers survive SIGKILL", level="warning")
                        break
                    n = self._signal_all(signal.SIGKILL)
                    self.log("killing leftovers", level="warning", processes=n)
                    killed = True
                    deadline = time.monotonic() + 2.0
        if self.reaped_others:
            self.log("reaped others", count=self.reaped_others)
        if self.restart:
            return int(ExitStatus.PEER_UNAVAILABLE) if self.give_up else 0
        code = exit_code(main_status if main_status is not None else 0)
        if self.explain and code != 0 and not stop_signal:
            self._explain(code)
        if stop_signal and code not in (0, signal_exit_status(stop_signal)):
            # mpirun chose its own code (MPICH: 255) for a job we were told to end; the
            # orchestrator must see that it was ended by the signal: 128+N, like tini.
            self.log("stopped by signal", signal=signal.Signals(stop_signal).name,
                     child_code=code, code=signal_exit_status(stop_signal))
            return signal_exit_status(stop_signal)
        return code


class Interrupted(Exception):
    """A terminating signal arrived before the supervisor existed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def install_early_handlers() -> None:
    """Before any slow step: TERM/INT/HUP/QUIT end the agent (128+N), USR1/2 are ignored.

    A PID 1 drops signals it has no handler for, so without this a SIGTERM during the
    DNS wait would be lost and the pod would sit out its grace period. SIGCHLD keeps its
    default here: `capture` waits on its own child, and nothing else is ours to reap yet.
    """
    for s in TERMINATING:
        signal.signal(s, _raise)
    for s in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)


def capture(argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 20.0) -> tuple[int, str]:
    """Run argv to completion; return (exit code, stdout and stderr together).

    The child leads its own session, so a timeout ends it with everything it started
    (a wrapper script's children would otherwise hold the pipe open past the timeout).
    """
    import subprocess

    if _stopping:
        raise Interrupted(signal.SIGTERM)
    try:
        child = subprocess.Popen(list(argv), env=None if env is None else dict(env),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise _exec_error(argv[0], exc) from None
    _pending[child.pid] = True
    with child:
        try:
            out, _ = child.communicate(timeout=timeout)
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


def exec_replace(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace the agent by argv (`--exec`). Returns only by raising ExecError."""
    path = resolve(argv[0], env.get("PATH"))
    if path is None:
        raise _exec_error(argv[0])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, list(argv), dict(env))
    except OSError as exc:
        raise _exec_error(argv[0], exc) from None


def handoff(argv: Sequence[str], env: Mapping[str, str], *, grace: float, group: bool,
            role: str, log_level: str, log_format: str = "json", **extra: Any) -> None:
    """Re-exec into the lean resident supervisor, which then runs argv (or adopts
    `extra["adopt"]`, a child already running: children survive exec).

    The spec travels in a memfd (the environment can be large); signals are blocked
    across the exec so none is lost, and the supervisor unblocks them.
    """
    path = resolve(argv[0], env.get("PATH"))
    if path is None:  # fail here, where the message can still name the plan's mpirun
        raise _exec_error(argv[0])
    spec = {"argv": list(argv), "env": dict(env), "grace": grace, "group": group,
            "role": role, "log_level": log_level, "log_format": log_format, **extra}
    fd = os.memfd_create("mpi-bootstrap-plan", 0)  # not CLOEXEC: the new image reads it
    os.write(fd, json.dumps(spec).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); "
            "from mpi_bootstrap.proc import main; sys.exit(main())")
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    from mpi_bootstrap.environ import public

    try:
        # The resident process's own environment carries no secret: it stays readable
        # in /proc/1/environ for the whole job (environ.py); what it needs is in the spec.
        os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", code,
                                   "--plan-fd", str(fd)], public(os.environ))
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        os.close(fd)
        raise


def _noop(_signum: int, _frame: object) -> None:
    """A handler must exist for set_wakeup_fd to see the signal; the loop does the work."""


def _drain(fd: int) -> list[int]:
    out: list[int] = []
    while True:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return out
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        if not data:
            return out
        out.extend(data)


def mode(is_pid1: bool, exec_requested: bool) -> tuple[str, str]:
    """(mode, reason) for --explain: how the child will be run."""
    if exec_requested:
        return "exec", "--exec: the agent is replaced by mpirun (for images that run tini)"
    if is_pid1:
        return "pid1", "the agent is PID 1: it supervises mpirun, forwards signals, reaps"
    return "subreaper", ("not PID 1: the agent becomes a child subreaper so orphans are "
                         "still reaped")


def main(argv: Sequence[str] | None = None) -> int:
    """`… mpi_bootstrap.proc --plan-fd N` (the launcher's hand-off), or, for tests and
    debugging, `python -m mpi_bootstrap.proc [--grace S] [--group] [--restart N/SECONDS]
    -- PROGRAM ARGS…`."""
    args = list(sys.argv[1:] if argv is None else argv)
    spec: dict[str, Any] = {"grace": 10.0, "group": False, "env": dict(os.environ),
                            "role": "launcher", "log_level": "info"}
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--plan-fd":
            fd = int(args.pop(0))
            with os.fdopen(fd, "rb") as fh:
                spec.update(json.loads(fh.read()))
        elif opt == "--grace":
            spec["grace"] = float(args.pop(0))
        elif opt == "--group":
            spec["group"] = True
        elif opt == "--restart":  # LIMIT/WINDOW, e.g. 5/60
            limit, _, window = args.pop(0).partition("/")
            spec["restart"] = {"limit": int(limit), "window": float(window or 60)}
        else:
            sys.stderr.write(f"mpi-bootstrap proc: unknown option {opt}\n")
            return 64
    if args and args[0] == "--":
        spec["argv"] = args[1:]
    log = json_log(spec["role"], spec["log_level"], fmt=spec.get("log_format", "json"))
    restart = RestartPolicy(**spec["restart"]) if spec.get("restart") else None
    sup = Supervisor(grace=float(spec["grace"]), group=bool(spec["group"]), log=log,
                     restart=restart, stop_file=spec.get("stop_file"),
                     stop_text=spec.get("stop_text", ""),
                     explain=bool(spec.get("explain")))
    if spec.get("net"):
        _net_server(spec["net"], log, sup.readers)
    sup.install()
    if os.getpid() != 1 and become_subreaper():
        log("subreaper", reason="not PID 1: orphans re-parent to the agent and are reaped")
    if not spec.get("argv"):
        sys.stderr.write("mpi-bootstrap proc: no program\n")
        return 64
    try:
        code = sup.run(spec["argv"], spec["env"], adopt=spec.get("adopt"))
    except ExecError as exc:
        sys.stderr.write(f"mpi-bootstrap: {exc.message}\n")
        code = int(exc.status)
    # Tells the workers (dir exchange) that the job is over — on success only: after a
    # failure the orchestrator may restart the launcher, which needs its workers.
    if spec.get("done_file") and code == 0:
        from mpi_bootstrap.files import atomic_write

        with contextlib.suppress(OSError):
            atomic_write(spec["done_file"], spec.get("done_text", f"{code}\n"), 0o644)
    return code


def _net_server(net: Mapping[str, Any], log: Log,
                readers: dict[int, Callable[[], None]]) -> None:
    """The worker's net exchange, served from the supervisor's loop (stdlib only)."""
    import socket

    from mpi_bootstrap import exchange, keys
    from mpi_bootstrap.files import atomic_write

    listener = socket.socket(fileno=int(net["fd"]))
    path = str(net["authorized_keys"])

    def authorize(key: str, peer: str) -> None:
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            lines = []
        except ValueError as exc:  # not UTF-8: refuse this hello, keep serving
            raise OSError(f"{path} is not text: {exc}") from None
        if key not in lines:
            atomic_write(path, "\n".join([*lines, key]) + "\n", 0o600)
            log("key authorized", fingerprint=keys.fingerprint(key),
                key_type=key.split(maxsplit=1)[0], origin=f"net exchange hello from {peer}")

    server = exchange.NetServer(str(net["token"]), exchange.record_from(net["record"]),
                                authorize, log)
    server.attach(listener, readers)


if __name__ == "__main__":
    sys.exit(main())
