"""PID 1 at tini's and dumb-init's standard: the behaviours their test suites check, run
against the agent's resident supervisor as a real PID 1 (`unshare --pid --fork
--mount-proc`). test_pid1.py holds the rest (exit codes, reaping, restarts)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from mpi_bootstrap.pid1.restart import RestartPolicy
from mpi_bootstrap.proc import signals
from tests.conftest import AGENT, Pod
from tests.support.pid1 import CHILD, PY, agent_argv, agent_pid, run

pytestmark = [pytest.mark.timeout(180)]

# Signals 32 and 33 are glibc's own (thread cancellation, setxid), invisible to programs:
# glibc's posix_spawn always leaves them ignored in the child (any posix_spawn caller's
# child shows them in SigIgn; the program's glibc installs its handlers again).
GLIBC_INTERNAL = (1 << 31) | (1 << 32)
FLOOD = 339_000  # bytes a job writes to stderr last: what used to be cut (11,320 lost)


def expect_line(stream: Any, wanted: str, timeout: float = 10.0) -> str:
    """Read lines from `stream` (text) until one equals `wanted`; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = stream.readline()
        if not line:
            break
        seen.append(line.strip())
        if line.strip() == wanted:
            return line
    raise AssertionError(f"no {wanted!r} within {timeout} s; saw {seen[-5:]}")


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestEverySignal:
    """Every catchable signal but SIGCHLD and the synchronous faults reaches the child —
    TERM, WINCH, CONT, TSTP/TTIN/TTOU, ALRM, PWR, PIPE, RTMIN..RTMAX — to it alone, or
    to its group (--group). (Before: six; the kernel dropped the rest.)"""

    @pytest.mark.parametrize("group", [False, True])
    def test_forwarded(self, started: list[subprocess.Popen[str]], group: bool) -> None:
        """Each of the 50-odd forwardable signals, standard and real-time, reaches the child, alone
        or with --group."""
        p = subprocess.Popen(
            agent_argv(PY, CHILD, "report-all", options=("--group",) if group else ()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert p.stdout is not None
        expect_line(p.stdout, "READY")
        pid = agent_pid(p)
        order = [*sorted(signals.FORWARDED - {signal.SIGUSR2}), signal.SIGUSR2]
        assert len(order) >= 50  # 31 standard less KILL STOP CHLD and 6 faults, + 31 RT
        for signum in order:
            os.kill(pid, signum)
            expect_line(p.stdout, f"GOT {int(signum)}")
        assert p.wait(timeout=10) == 0

    def test_burst(self, started: list[subprocess.Popen[str]]) -> None:
        """300 signals as fast as they can be sent: the agent keeps up and keeps forwarding."""
        p = subprocess.Popen(
            agent_argv(PY, CHILD, "burst"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert p.stdout is not None
        expect_line(p.stdout, "READY")
        pid = agent_pid(p)
        kinds = (signal.SIGUSR1, signal.SIGHUP, signal.SIGWINCH)
        for i in range(300):
            os.kill(pid, kinds[i % 3])
        time.sleep(0.2)
        os.kill(pid, signal.SIGUSR2)
        out, _ = p.communicate(timeout=20)
        counts = dict(re.findall(r"(SIG\w+)=(\d+)", out))
        assert p.returncode == 0
        assert all(int(counts[k.name]) >= 1 for k in kinds), counts


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestOutput:
    """mpirun's stderr is copied through whole, in every ending, and a reader that stops
    reading PID 1's stderr never stalls signal forwarding."""

    @pytest.mark.parametrize(
        ("ending", "code"), [("ok", 0), ("fail", 3), ("term", 143), ("leftover", 0)]
    )
    @pytest.mark.parametrize("reader", ["fast", "slow"])
    def test_last_words_kept(
        self, started: list[subprocess.Popen[bytes]], ending: str, code: int, reader: str
    ) -> None:
        """The job's last 339,000 bytes of stderr all reach PID 1's stderr — after success,
        failure, a forwarded SIGTERM, and from a leftover killed after the grace period —
        also when PID 1's stderr is read slowly. (Before: up to 64 KiB lost.)"""
        p = subprocess.Popen(
            agent_argv(PY, CHILD, "flood", str(FLOOD), ending, options=("--explain-failure",)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        started.append(p)
        assert p.stdout is not None and p.stderr is not None
        if ending == "term":
            assert p.stdout.readline().strip() == b"READY"
            os.kill(agent_pid(p), signal.SIGTERM)
        err = bytearray()
        while chunk := p.stderr.read1(4096 if reader == "slow" else 1 << 20):
            err += chunk
            if reader == "slow":
                time.sleep(0.002)
        assert p.wait(timeout=30) == code
        lines = re.findall(rb"^line (\d{8}) x{40}$", bytes(err), re.M)
        numbers = [int(n) for n in lines]
        assert numbers == list(range(len(numbers))), "lines lost or out of order"
        assert len(numbers) * 55 >= FLOOD, len(numbers)
        assert b"\nEND\n" in err

    def test_stalled_reader_does_not_stall_pid1(self, started: list[subprocess.Popen[str]]) -> None:
        """Nobody reads PID 1's stderr (a full container log pipe) while the job writes
        4 MiB to its stderr: signals are still forwarded at once. (Before: the copy
        blocked PID 1's loop; the job never even got past its own writes.)"""
        r, w = os.pipe()
        try:
            p = subprocess.Popen(
                agent_argv(PY, CHILD, "flood-report", str(4 << 20), options=("--explain-failure",)),
                stdout=subprocess.PIPE,
                stderr=w,
                text=True,
            )
            started.append(p)
            assert p.stdout is not None
            expect_line(p.stdout, "READY", timeout=30)
            pid = agent_pid(p)
            for sig in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM):
                t0 = time.monotonic()
                os.kill(pid, sig)
                expect_line(p.stdout, f"GOT {sig.name}", timeout=5)
                assert time.monotonic() - t0 < 1.0, sig.name
            os.kill(pid, signal.SIGUSR2)  # the child exits 0
        finally:
            os.close(w)
            os.close(r)  # the agent's pending writes now fail: it ends without them
        assert p.wait(timeout=20) == 0

    def test_explaining_answers_sigterm(self, started: list[subprocess.Popen[str]]) -> None:
        """A rank that prints 1 MiB on one line before mpirun fails: PID 1 explains (or
        not) and exits promptly. (Before: 77 s for 128 KiB, SIGTERM unanswered.)"""
        code = "import sys; sys.stderr.write(('orted' + 'x' * 40) * 23301 + '\\n'); sys.exit(1)"
        t0 = time.monotonic()
        done = run(PY, "-c", code, options=("--explain-failure",))
        assert done.returncode == 1
        assert time.monotonic() - t0 < 5.0


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestChildStartsClean:
    """The child starts with every signal at its default and an empty mask, except those
    PID 1 itself was started with ignored (as tini keeps them)."""

    def test_default_dispositions(self) -> None:
        """The child starts with no signal ignored (but glibc's internal ones) and none blocked."""
        done = run("sh", "-c", "grep -E '^Sig(Ign|Blk):' /proc/self/status")
        assert done.returncode == 0, done.stderr
        masks = dict(re.findall(r"Sig(Ign|Blk):\s+(\S+)", done.stdout))
        ignored, blocked = int(masks["Ign"], 16), int(masks["Blk"], 16)
        assert (ignored & ~GLIBC_INTERNAL, blocked) == (0, 0)

    def test_sigpipe_is_default(self) -> None:
        """`yes | head -1` ends quietly, and pipefail sees 141 (128+SIGPIPE)."""
        done = run("sh", "-c", "yes | head -1")
        assert (done.returncode, done.stdout) == (0, "y\n")
        assert "Broken pipe" not in done.stderr
        done = run("bash", "-c", "set -o pipefail; yes | head -1")
        assert done.returncode == 141

    def test_inherited_ignore_is_kept(self) -> None:
        """Started with SIGUSR1 and SIGHUP ignored (nohup-style), the child has them
        ignored too — and only them."""
        code = (
            "import os, signal, sys; signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
            "signal.signal(signal.SIGHUP, signal.SIG_IGN); "
            "signal.signal(signal.SIGPIPE, signal.SIG_DFL); os.execv(sys.argv[1], "
            "sys.argv[1:])"
        )
        argv = agent_argv("sh", "-c", "grep '^SigIgn:' /proc/self/status")
        unshare = argv.index(PY)
        done = subprocess.run(
            [*argv[:unshare], sys.executable, "-c", code, *argv[unshare:]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        mask = int(done.stdout.split()[1], 16) & ~GLIBC_INTERNAL
        assert mask == (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGHUP - 1))


def on_a_terminal(argv: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start argv with a new pty as its controlling terminal (stdin, stdout, stderr)."""
    master, slave = pty.openpty()

    def controlling_tty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_tty,  # noqa: PLW1509 - tests only: the child gets a terminal
    )
    os.close(slave)
    return p, master


# How long a second copy of a terminal's ^C (sent on by PID 1 as well as by the
# terminal) would take to reach the child at most; the test waits that long for none.
SECOND_COPY_WITHIN_S = 0.5


def read_until(master: int, wanted: bytes, timeout: float = 10.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while wanted not in out:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} on the terminal; got {out[-300:]!r}"
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                out += os.read(master, 4096)
            except OSError:
                break
    return out


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestTerminal:
    """On a terminal (`kubectl run -it`), the child's group holds it: ^C reaches the child
    once, and a child reading it is not stopped by SIGTTIN, also with --group."""

    def test_ctrl_c_reaches_the_child_once(self, started: list[subprocess.Popen[bytes]]) -> None:
        """On a terminal, one ^C reaches the child once, not a second time through PID 1."""
        p, master = on_a_terminal(agent_argv(PY, CHILD, "tty-int"))
        started.append(p)
        try:
            read_until(master, b"READY")
            os.write(master, b"\x03")
            # The child counts what arrives and says so only when told to: a fixed window
            # in which a second copy (through PID 1) would come.
            time.sleep(SECOND_COPY_WITHIN_S)
            os.write(master, b"go\n")
            out = read_until(master, b"INTS ")
            out += read_until(master, b"\n")
            assert b"INTS 1" in out, out  # (before: INTS 2)
            assert p.wait(timeout=10) == 0
        finally:
            os.close(master)

    @pytest.mark.parametrize("group", [False, True])
    def test_child_reads_the_terminal(
        self, started: list[subprocess.Popen[bytes]], group: bool
    ) -> None:
        """A child reading the terminal is not stopped by SIGTTIN, also with --group."""
        p, master = on_a_terminal(
            agent_argv(PY, CHILD, "tty-read", options=("--group",) if group else ())
        )
        started.append(p)
        try:
            read_until(master, b"READY")
            os.write(master, b"hello\n")
            read_until(master, b"READ hello")
            assert p.wait(timeout=10) == 0  # (before, with --group: stopped, PID 1 hung)
        finally:
            os.close(master)

    @pytest.mark.parametrize("group", [False, True])
    def test_launcher_gives_mpirun_the_terminal(
        self, started: list[subprocess.Popen[bytes]], pod: Pod, group: bool
    ) -> None:
        """The launcher starts mpirun before its hand-off to the resident PID 1: on a terminal
        that mpirun still holds it and reads it, also with a process group of its own."""
        hostfile = pod.tmp / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        mpirun = pod.tmp / "mpirun"  # an Open MPI by its --version; its run reads the terminal
        mpirun.write_text(
            '#!/bin/sh\n[ "$1" != --version ] || { echo "mpirun (Open MPI) 4.1.4"; exit 0; }\n'
            f"exec {PY} {CHILD} tty-read\n"
        )
        mpirun.chmod(0o755)
        argv = [
            *pod.netns.prefix(),
            *["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],  # the agent: PID 1
            *[AGENT, "--hostfile", str(hostfile), "--exchange", "none", "--mpirun", str(mpirun)],
            *[f"--state-dir={pod.tmp / 'state'}", "--log-format", "json"],
            *(["--signal-group"] if group else []),
            *["launcher", "--", "true"],
        ]
        p, master = on_a_terminal(argv)
        started.append(p)
        try:
            out = read_until(master, b"READY", timeout=30)
            os.write(master, b"hello\n")
            out += read_until(master, b"READ hello")
            if b'"child adopted"' not in out:  # the resident says so once it has started
                out += read_until(master, b'"child adopted"')
            assert p.wait(timeout=10) == 0  # (stopped by SIGTTIN without the terminal)
        finally:
            os.close(master)


# Deaths (seconds after the first) → the delay before each restart, or None: give up.
RESTARTS = [
    ([0.0], [0.2]),
    ([0.0, 1.0, 2.0, 3.0, 4.0], [0.2, 0.4, 0.8, 1.6, 3.2]),
    ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.2, 0.4, 0.8, 1.6, 3.2, None]),  # 6 in 60 s
    ([0.0, 61.0], [0.2, 0.2]),  # the first death has left the window
    ([0.0, 10.0, 20.0, 30.0, 40.0, 61.0], [0.2, 0.4, 0.8, 1.6, 3.2, 3.2]),
    ([float(i) for i in range(8)], [0.2, 0.4, 0.8, 1.6, 3.2, None, None, None]),
]


class TestRestartPolicy:
    """The worker's sshd: restarted after a doubling backoff (capped at 5 s), at most 5
    times in any 60 s; the sixth death in a window gives up (exit 69)."""

    @pytest.mark.parametrize(("deaths", "delays"), RESTARTS)
    def test_table(self, deaths: list[float], delays: list[float | None]) -> None:
        """Restart delays double from 0.2 s, deaths older than 60 s are forgotten, and a sixth death
        within the window gives up (None)."""
        policy = RestartPolicy()
        seen: tuple[float, ...] = ()
        got = []
        for t in deaths:
            seen, delay = policy.after_death(seen, t)
            got.append(None if delay is None else round(delay, 3))
        assert got == delays

    def test_backoff_is_capped(self) -> None:
        """However many restarts a policy allows, the delay before one never exceeds 5 s."""
        policy = RestartPolicy(limit=20)
        seen: tuple[float, ...] = ()
        delay = None
        for t in range(20):
            seen, delay = policy.after_death(seen, float(t))
        assert delay == 5.0


def test_resident_imports_only_the_standard_library(tmp_path: Path) -> None:
    """What the resident process loads during a whole run — a failing child explained,
    a restarted service, the data check's FIFO served — is the standard library and this
    package, nothing else, lazy imports included."""
    root = str(Path(__file__).resolve().parent.parent)
    out = tmp_path / "modules"
    os.mkfifo(fifo := tmp_path / "data-probe", 0o600)
    code = (
        f"import atexit, json, sys; sys.path.insert(0, {root!r}); "
        f"atexit.register(lambda: open({str(out)!r}, 'w').write("
        "json.dumps(sorted(sys.modules)))); "
        "from mpi_bootstrap.pid1.resident import main; sys.exit(main())"
    )
    for options, program, code_expected in (
        # mpirun's own code passes through its explanation; a service that keeps dying
        # is given up on as unavailable (the exit-code table)
        (
            ["--explain-failure"],
            ["sh", "-c", "echo 'Host key verification failed.' >&2; exit 255"],
            255,
        ),
        (["--restart", "1/60"], ["sh", "-c", "exit 1"], 69),
        # the data check's FIFO served: a garbage line refused, then the job ends
        (["--data-probe", str(fifo)], ["sh", "-c", f"echo garbage >{fifo}; sleep 0.5"], 0),
    ):
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, *options, "--", *program],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code_expected, done.stderr
        modules = __import__("json").loads(out.read_text())
        foreign = [
            m
            for m in modules
            if m.split(".")[0] not in sys.stdlib_module_names
            and m.split(".")[0] not in ("mpi_bootstrap", "__main__", "_sitebuiltins")
        ]
        assert foreign == []
        assert "mpi_bootstrap.core.failures" in modules or options != ["--explain-failure"]
        assert "mpi_bootstrap.pid1.dataserve" in modules or options[0] != "--data-probe"
