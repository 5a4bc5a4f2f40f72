"""The supervisor as a real PID 1 (`unshare --pid --fork --mount-proc`) and as a subreaper:
exit codes, signal forwarding, reaping, leftovers, and the race against other children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, Pod
from tests.support import logs
from tests.support.pid1 import CHILD, PY, agent_argv, agent_pid, run
from tests.support.wait import wait_until

pytestmark = [pytest.mark.timeout(180)]


class TestExitCodeTable:
    """The one function that turns a child's wait status into PID 1's exit code
    (proc/spawn.py exit_code), over every code and signal: the table the real PID 1
    below is sampled against."""

    def test_every_code_and_signal(self) -> None:
        """Exit codes 0-255 pass unchanged; a death by signal N (core dumped or not) is
        128+N."""
        from mpi_bootstrap.proc.spawn import exit_code

        assert [exit_code(code << 8) for code in range(256)] == list(range(256))
        signals = range(1, signal.NSIG - 1)
        assert [exit_code(n) for n in signals] == [128 + n for n in signals]
        assert [exit_code(n | 0x80) for n in signals] == [128 + n for n in signals]


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestExitCodes:
    """The child's code passes through; a death by signal N is 128+N."""

    # Every code 0-255 as a real PID 1 took 37-48 s: the table above has them all; here,
    # those nearest the agent's own (sysexits 64-78, 126, 127, 128+N) and the ends.
    SAMPLE = (
        0,
        1,
        2,
        63,
        64,
        65,
        68,
        69,
        70,
        73,
        75,
        78,
        79,
        125,
        126,
        127,
        128,
        129,
        143,
        254,
        255,
    )

    @pytest.mark.parametrize("code", SAMPLE)
    def test_codes(self, code: int) -> None:
        """The child's exit code becomes PID 1's own exit code unchanged."""
        done = run("sh", "-c", f"exit {code}")
        assert done.returncode == code, done.stderr[-300:]

    @pytest.mark.parametrize("sig", ["TERM", "INT", "HUP", "QUIT", "KILL", "USR1"])
    def test_death_by_signal(self, sig: str) -> None:
        """A child killed by signal N (TERM, INT, HUP, QUIT, KILL, USR1) makes PID 1 exit 128+N."""
        done = run("sh", "-c", f"kill -{sig} $$")
        assert done.returncode == 128 + signal.Signals[f"SIG{sig}"], done.stderr

    def test_not_found(self) -> None:
        """A program that does not exist is exit 127 with 'command not found', as in a shell."""
        done = run("no-such-program-here")
        assert done.returncode == 127
        assert "no-such-program-here: command not found" in done.stderr

    def test_not_executable(self, tmp_path: Path) -> None:
        """A program file that is not executable is exit 126, saying so."""
        script = tmp_path / "script"
        script.write_text("#!/bin/sh\n")
        script.chmod(0o644)
        done = run(str(script))
        assert done.returncode == 126
        assert "not executable" in done.stderr


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestSignals:
    """Every catchable signal sent to the agent reaches the child (after a handshake)."""

    @pytest.mark.parametrize("group", [False, True])
    def test_forwarded(self, started: list[subprocess.Popen[str]], group: bool) -> None:
        """TERM, INT, HUP, QUIT, USR1 and USR2 sent to PID 1 reach the child, also with --group."""
        argv = agent_argv(PY, CHILD, "report")
        if group:
            argv.insert(argv.index("--"), "--group")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        pid = agent_pid(p)
        for sig in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
            os.kill(pid, signal.Signals[sig])
            assert p.stdout.readline().strip() == f"GOT {sig}"
        assert p.wait(timeout=10) == 0

    def test_own_code_after_sigterm_reported_as_143(
        self, started: list[subprocess.Popen[str]]
    ) -> None:
        """A launcher told to stop exits 128+N even if mpirun picks its own code (MPICH
        exits 255 after SIGTERM), so the orchestrator sees why the job ended."""
        p = subprocess.Popen(
            agent_argv(
                "sh", "-c", "trap 'exit 255' TERM; echo READY; while :; do sleep 0.05; done"
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        os.kill(agent_pid(p), signal.SIGTERM)
        assert p.wait(timeout=10) == 143
        assert p.stderr is not None
        assert '"child_code": 255' in p.stderr.read()

    def test_term_latency(self, started: list[subprocess.Popen[str]]) -> None:
        """SIGTERM to a cooperative child: the agent exits with 143 promptly."""
        p = subprocess.Popen(agent_argv("sleep", "60"), stderr=subprocess.PIPE, text=True)
        started.append(p)
        pid = agent_pid(p)

        def sleep_started() -> bool:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            return any(Path(f"/proc/{k}/comm").read_text().strip() == "sleep" for k in kids)

        # The signal must meet the child, not an agent still starting it.
        wait_until(sleep_started, 10, "the agent's child `sleep` to run", interval=0.01)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 143
        assert time.monotonic() - t0 < 2.0


@pytest.mark.usefixtures("root")  # the agent as PID 1 of a PID namespace
class TestReaping:
    """Orphans are reaped; leftovers are ended; the main status is never lost."""

    def test_200_orphans(self) -> None:
        """200 orphaned grandchildren are all reaped by PID 1: no zombie is left behind."""
        done = run(PY, CHILD, "orphans", "200")
        assert "ZOMBIES 0" in done.stdout, done.stdout + done.stderr
        assert done.returncode == 0

    def test_leftover_ignoring_term_is_killed(self) -> None:
        """A leftover grandchild that ignores SIGTERM is killed after the grace period, and the exit
        code is still the main child's."""
        t0 = time.monotonic()
        done = run(PY, CHILD, "leftover", "7", grace=1.0)
        elapsed = time.monotonic() - t0
        assert done.returncode == 7, done.stderr
        assert 1.0 <= elapsed < 10
        events = [e["event"] for e in logs.events(done.stderr)]
        assert "terminating leftovers" in events
        assert "killing leftovers" in events

    def test_main_status_survives_racing_children(self) -> None:
        """The main child's exit code is kept when other children exit at the same moment."""
        codes = [run(PY, CHILD, "race", "42", "20").returncode for _ in range(30)]
        assert codes == [42] * 30


class TestSubreaper:
    """Not PID 1: the agent becomes a child subreaper, says so, and reaps orphans."""

    def test_subreaper(self) -> None:
        """Not PID 1, the agent becomes a subreaper, logs it, adopts an orphan and reaps it."""
        p = subprocess.Popen(
            agent_argv(PY, CHILD, "orphan-ppid", pid1=False),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert f"PPID {p.pid}" in out  # the orphan re-parented to the agent
        assert logs.named(err, "subreaper")
        # the orphan finished after the main child: it was waited for and reaped
        assert any(e["count"] >= 1 for e in logs.named(err, "reaped others"))


ORPHANING_MPIRUN = """#!/bin/sh
# An Open MPI mpirun, as far as the agent can tell, that leaves an orphan in its first
# instant: the orphan writes who adopted it once its parent is gone.
if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi
echo "$PPID" > "$OUT.agent"
python3 -c '
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while os.getppid() == int(sys.argv[2]):
    time.sleep(0.001)
with open(sys.argv[1], "w") as fh:
    fh.write(str(os.getppid()))
time.sleep(0.5)
' "$OUT.orphan" "$$" &
exit 0
"""


def test_subreaper_before_the_first_child(pod: Pod) -> None:
    """Not PID 1, the launcher is a subreaper before it starts mpirun (which it starts before
    its hand-off to the resident): an orphan mpirun makes at once re-parents to the agent,
    not to the host's init, and is reaped with the job's other leftovers."""
    fake = pod.tmp / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text(ORPHANING_MPIRUN)
    fake.chmod(0o755)
    hostfile = pod.tmp / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    out = pod.tmp / "who"
    code, _, err = pod.agent(
        "--hostfile",
        str(hostfile),
        "--output-hostfile",
        str(pod.tmp / "out"),
        "--mpirun",
        str(fake),
        "--grace-seconds",
        "2",
        "--log-format",
        "json",
        "launcher",
        "--",
        "mpirun",
        "-np",
        "1",
        "true",
        env={"OUT": str(out), "PATH": f"{fake.parent}:/usr/bin:/bin"},
    )
    assert code == 0, err
    agent = Path(f"{out}.agent").read_text().strip()
    wait_until(lambda: Path(f"{out}.orphan").exists(), 10, "the orphan's report")
    assert Path(f"{out}.orphan").read_text() == agent, err  # today: 1 (or the host's reaper)
    assert logs.named(err, "subreaper")


class TestLauncherPhases:
    """The full agent: SIGTERM while it waits for DNS ends it within a second, exit 143."""

    def test_sigterm_during_dns_wait(self, pod: Pod, started: list[subprocess.Popen[str]]) -> None:
        """SIGTERM during the launcher's DNS wait exits 143 within 1 s, writing no hostfile."""
        hostfile = pod.tmp / "hostfile"
        hostfile.write_text("ghost-worker-0.job.default.svc slots=1\n")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(pod.tmp),
            "MPI_BOOTSTRAP_STATE_DIR": str(pod.tmp / "s"),
        }
        p = subprocess.Popen(
            [
                *pod.netns.prefix(),
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                AGENT,
                "--hostfile",
                str(hostfile),
                "--output-hostfile",
                str(pod.tmp / "out"),
                "--dns-wait-seconds",
                "60",
                "--log-format",
                "json",
                "launcher",
                "--",
                "true",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert p.stderr is not None
        seen = []
        for line in p.stderr:
            seen.append(line)
            if '"DNS WAIT"' in line:
                break
        else:  # stderr ended: the launcher never waited, so there was nothing to interrupt
            pytest.fail(f"no DNS WAIT before the launcher ended: {''.join(seen)[-2000:]}")
        pid = agent_pid(p)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 143
        assert time.monotonic() - t0 < 1.0
        assert not (pod.tmp / "out").exists()


def test_supervisor_imports_no_heavy_modules() -> None:
    """The resident supervisor loads only the standard library (its footprint)."""
    root = str(Path(__file__).parent.parent)
    code = (
        f"import sys; sys.path.insert(0, {root!r}); import mpi_bootstrap.pid1.resident; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('structlog','dns','paramiko','psutil')))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.fixture
def sshd_argv(tmp_path: Path, root: None) -> tuple[list[str], int]:
    """A private, real OpenSSH sshd on a free loopback port (key made here)."""
    sshd = "/usr/sbin/sshd"
    if not os.access(sshd, os.X_OK):
        pytest.fail("OpenSSH sshd missing: `make system-deps` installs openssh-server")
    key = tmp_path / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\n"
        f"PidFile {tmp_path / 'sshd.pid'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # Debian's privsep directory
    return [sshd, "-D", "-e", "-f", str(config)], port


def banner(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                if c.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


def sshd_child(agent: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for kid in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
            if Path(f"/proc/{kid}/comm").read_text().strip() == "sshd":
                return int(kid)
        time.sleep(0.01)
    raise AssertionError("no sshd under the agent")


class TestServiceRestart:
    """A supervised sshd (the worker's) is restarted when it dies, within limits."""

    def test_restarted_and_accepts_again(
        self, sshd_argv: tuple[list[str], int], started: list[subprocess.Popen[str]]
    ) -> None:
        """A killed sshd is restarted and serves again; SIGTERM to PID 1 stops it, exit 0."""
        argv, port = sshd_argv
        p = subprocess.Popen(
            [PY, "-m", "mpi_bootstrap.pid1", "--restart", "3/60", "--", *argv],
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        assert banner(port)
        first = sshd_child(p.pid)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sshd_child(p.pid) == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sshd_child(p.pid) != first
        assert banner(port)
        os.kill(p.pid, signal.SIGTERM)  # stops sshd, exits 0
        assert p.wait(timeout=15) == 0
        assert not banner(port, timeout=0.5)

    def test_gives_up(
        self, sshd_argv: tuple[list[str], int], started: list[subprocess.Popen[str]]
    ) -> None:
        """An sshd that dies more often than --restart allows ends the supervisor with 69,
        saying why, so Kubernetes restarts the pod."""
        argv, port = sshd_argv
        p = subprocess.Popen(
            [PY, "-m", "mpi_bootstrap.pid1", "--restart", "3/60", "--", *argv],
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        for _ in range(4):
            assert banner(port)
            os.kill(sshd_child(p.pid), signal.SIGKILL)
            time.sleep(0.05)
        assert p.wait(timeout=30) == 69
        assert p.stderr is not None
        err = p.stderr.read()
        assert "keeps dying (4 times in 60 s" in err
        assert "Kubernetes restarts the pod" in err
