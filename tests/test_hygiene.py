"""Nothing a test or a benchmark starts outlives it, pass, fail or signal: its processes
(a PID namespace's PID 1 and what runs in it included), and for the simulated cluster
its namespaces, /etc/netns entries, state directories and daemons. And no simulated pod
runs this machine's login files (a pyenv set-up there takes a lock that a killed shell
leaves behind, and every later ssh session then waits 60 s for it)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import leaky, proctree
from tests.support.cluster import Cluster
from tests.support.pid1 import agent_argv, agent_pid
from tests.support.wait import wait_until

pytestmark = [pytest.mark.timeout(120)]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it has ended, its parent not yet asked)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class TestStarted:
    """The `started` fixture and the PID-1 helper end everything a test started."""

    def test_a_failing_test_leaves_no_process(self, tmp_path: Path, root: None) -> None:
        """A test that fails with a PID namespace (PID 1 and its child) and a shell with
        background children running leaves none of them once its session has ended."""
        record = tmp_path / "pids"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", leaky.__file__],
            env={**os.environ, "MPIB_LEAKY_PIDS": str(record)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert "1 failed" in done.stdout, done.stdout + done.stderr
        pids = [int(p) for p in record.read_text().split()]
        try:
            assert len(pids) == 6, pids
            wait_until(
                lambda: not [p for p in pids if alive(p)],
                5,
                lambda: f"these to be gone: {[p for p in pids if alive(p)]}",
            )
        finally:  # ours, by PID: so that this test, failing, leaks nothing either
            for pid in pids:
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def test_killing_unshare_ends_the_namespace(self, root: None) -> None:
        """agent_argv's `unshare --kill-child`: when unshare is killed (all a test holds),
        the agent, PID 1 of the namespace, goes with it, and so does its child."""
        p = subprocess.Popen(agent_argv("sleep", "300"), stderr=subprocess.DEVNULL)
        try:
            agent = agent_pid(p)
            p.kill()
            p.wait(timeout=10)
            wait_until(lambda: not alive(agent), 5, "the namespace's PID 1 to end")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


CHAOS = str(ROOT / "tests" / "bench" / "chaos.py")
MADE = re.compile(r"cluster (\w+): namespaces \S+, files in (\S+)")


def started_at(pid: int) -> str | None:
    """A process's start time (field 22 of its stat): a PID reused later differs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def pid_file(d: Path) -> str:
    try:
        return (d / "dnsmasq.pid").read_text().strip()
    except OSError:
        return ""


@pytest.mark.usefixtures("dnsmasq", "realmpi")  # what tests/bench/chaos.py builds and runs
class TestBenchSignal:
    """A bench ended by SIGTERM removes what it made (tests/support/interrupt.py)."""

    @pytest.mark.parametrize("to", ["process", "group"])
    def test_chaos_sigterm_mid_run_leaves_nothing(self, to: str) -> None:
        """The chaos bench on 2 workers, SIGTERMed while a worker pod is frozen and the
        launcher waits on it — sent to the bench alone (as `make` passes it on) or to its
        whole process group (as `timeout` sends it) —: it exits 143, and no namespace,
        /etc/netns entry, netns mount, state directory or process of it is left."""
        argv = [sys.executable, CHAOS, "--family", "job", "--faults", "frozen"]
        argv += ["--workers", "2", "--runs", "1", "--give-up", "60", "--seed", "1"]
        p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(p.stdout or []), daemon=True)
        reader.start()
        try:
            wait_until(
                lambda: any("run 1: frozen" in ln for ln in lines), 90, lambda: "".join(lines)
            )
            made = next(m for ln in lines if (m := MADE.search(ln)))
            ours = [(pid, started_at(pid)) for pid in proctree.tree([p.pid])]
            (os.killpg if to == "group" else os.kill)(p.pid, signal.SIGTERM)
            assert p.wait(timeout=60) == 143, "".join(lines)
        finally:
            proctree.end([p])
        cluster, files = made[1], made[2]
        tag = f"-{cluster}-"
        netns = subprocess.run(["ip", "netns"], capture_output=True, text=True, check=True).stdout
        assert tag not in netns
        assert not [e for e in os.listdir("/etc/netns") if tag in e]
        assert tag not in Path("/proc/self/mountinfo").read_text()
        assert not Path(files).exists()
        left = [pid for pid, at in ours if at is not None and started_at(pid) == at and alive(pid)]
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
        pids = {str(pid) for pid, _ in ours}  # dnsmasq's files: /tmp/mpib-dnsmasq-*
        assert not [d for d in Path("/tmp").glob("mpib-dnsmasq-*") if pid_file(d) in pids]


def test_pods_never_run_the_machines_login_files(netns: None) -> None:
    """A simulated pod's root has empty shell start-up files, as in an image: an ssh
    session there (bash reads ~/.bashrc for it) never runs this machine's, nor takes a
    lock of theirs that a killed shell would leave behind for every later session."""
    with Cluster(["job-launcher"]) as c:
        done = c.pods[0].run(["sh", "-c", "cat /root/.bashrc /root/.profile 2>/dev/null; true"])
    assert done.returncode == 0 and done.stdout == ""
