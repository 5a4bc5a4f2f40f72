"""Injected faults, each caused for real on the simulated cluster: the DNS server goes
away mid-wait, a worker pod vanishes after the exchange, sshd dies during preflight, the
state directory is read-only or full, the hostfile is rewritten while it is read, and
SIGTERM arrives in every phase. Expected each time: a recovery or a clear error with the
documented exit code, no process left behind, no half-written file.

The pods here are not PID namespaces (`pid1=False`): the agent runs as a subreaper, so a
child it failed to stop would still be visible in the pod's network namespace.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REAL_MPIS
from tests.support import logs
from tests.support.cluster import Cluster, Pod
from tests.support.job import WORKERS, Agent, Job, pod_processes
from tests.support.wait import holds_for, wait_until

# Every test runs an Open MPI 4 job (or its workers) on a simulated cluster.
pytestmark = [pytest.mark.usefixtures("netns", "realmpi"), pytest.mark.timeout(180)]

OMPI = REAL_MPIS["openmpi4"]

# How long the launcher must keep polling through the DNS outage (several rounds of
# lookups that get no reply) before the server comes back.
OUTAGE_S = 2
# The markers below are logged just before the blocking wait of their phase begins, and
# nothing marks being inside it: this pause puts the SIGTERM well inside that wait.
INSIDE_THE_WAIT_S = 0.5


def faults_job(c: Cluster, work: Path) -> Job:
    """A job with Open MPI 4, its output hostfile in a directory of its own (work/out)."""
    return Job(c, work, OMPI, output=work / "out" / "hostfile")


def assert_no_process_left(pod: Pod, timeout: float = 5) -> None:
    wait_until(
        lambda: not pod_processes(pod),
        timeout,
        lambda: f"every process in {pod.name} to end: {pod_processes(pod)} left running",
    )


def half_written(*dirs: Path) -> list[str]:
    """Temporary files of files.atomic_write (`.<name>.XXXX.tmp`) under `dirs`."""
    return [str(p) for d in dirs if d.exists() for p in d.rglob(".*.tmp")]


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.usefixtures("dnsmasq")
class TestDNSOutage:
    """The DNS server stops while the launcher waits, and comes back: the job runs."""

    def test_server_stops_mid_wait_and_returns(self, work: Path) -> None:
        """The launcher keeps waiting through a DNS outage and resolves a record published during
        it once the server is back: the job runs."""
        with Cluster(["job-launcher", *WORKERS], dns=True, late=["job-worker-1"]) as c:
            assert c.dnsmasq is not None
            job = faults_job(c, work)
            job.start_workers(published=True)
            # (the cluster has DNS: the hostfile names the pods <pod>.job.default.svc)
            launcher = job.launcher(["hostname"], slots=1, MPI_DNS_WAIT_SECONDS="60")
            launcher.wait_event("DNS WAIT", host=c.svc("job-worker-1"))
            c.dnsmasq.stop()
            # The outage is real: a name the server knows no longer resolves in the pod.
            known = c.fqdn("job-worker-0")
            assert c.pods[0].run(["getent", "hosts", known], timeout=30).returncode != 0
            # the launcher keeps polling through it (no reply to count)
            holds_for(
                lambda: launcher.p.poll() is None,
                OUTAGE_S,
                lambda: f"the launcher waiting through the outage: {launcher.stderr()}",
            )
            # the record is published while the server is down; the server returns
            c.dnsmasq.add(
                [(c.fqdn("job-worker-1"), c.pods[2].address), (c.service, c.pods[2].address)],
                wait=False,
            )
            c.dnsmasq.start()
            code, out, err = launcher.finish()
            assert code == 0, err
            assert sorted(out.split()) == WORKERS
            # job-worker-1 was published only while the server was down: the launcher
            # resolved it from the restarted server
            done = logs.named(launcher.stderr(), "DNS done", partial=True)
            assert done and done[0]["unresolved"] == 0


class TestWorkerVanishes:
    """A worker pod disappears after publishing its record: 69 naming it, no mpirun."""

    def test_after_the_exchange(self, work: Path) -> None:
        """A worker pod killed after publishing: 69 naming it unreachable within the DNS wait, no
        mpirun, no process left, nothing half-written."""
        with Cluster(["job-launcher", *WORKERS]) as c:
            job = faults_job(c, work)
            job.start_workers(published=True)
            gone = c.pods[2]
            for pid in gone.netns.pids():  # the whole pod, agent and sshd alike
                os.kill(pid, signal.SIGKILL)
            gone.netns.exec_checked(["ip", "link", "set", "eth0", "down"])
            assert (job.xdir / "job-worker-1.json").exists()  # its record stays behind
            t0 = time.monotonic()
            done = job.launch(["hostname"], slots=1, timeout=120, MPI_DNS_WAIT_SECONDS="6")
            code, err = done.returncode, done.stderr
            assert code == 69, err
            assert f"worker unreachable: job-worker-1: no sshd answers on {gone.address}:" in err
            assert time.monotonic() - t0 < 6 + 10
            assert logs.no_rank_started(err)
            assert_no_process_left(c.pods[0])
            assert half_written(job.state("job-launcher"), work / "out") == []


class TestSshdDiesDuringPreflight:
    """sshd is killed while preflight connects: the worker restarts it, preflight tries
    again, and the job runs."""

    def test_recovers(self, work: Path) -> None:
        """sshd killed during preflight's first ssh: the worker restarts it, preflight retries only
        that worker, and the job runs."""
        with Cluster(["job-launcher", *WORKERS]) as c:
            job = faults_job(c, work)
            job.start_workers(published=True)
            pidfile = job.state("job-worker-1") / "sshd.pid"
            bindir = work / "bin"
            bindir.mkdir()
            # preflight's first ssh to job-worker-1 kills its sshd, then tries once
            # (ssh's own ConnectionAttempts would hide the agent's retry)
            script(
                bindir / "ssh",
                f"""
case "$*" in *job-worker-1*) mkdir {work}/killed 2>/dev/null && first=1;; esac
if [ -n "$first" ]; then
  kill -9 "$(cat {pidfile})"
  exec /usr/bin/ssh -o ConnectionAttempts=1 "$@"
fi
exec /usr/bin/ssh "$@"
""",
            )
            done = job.launch(
                ["hostname"],
                slots=1,
                timeout=120,
                PATH=f"{bindir}:{OMPI.bindir}:/usr/local/bin:/usr/bin:/bin",
            )
            code, out, err = done.returncode, done.stdout, done.stderr
            assert (work / "killed").is_dir()
            assert code == 0, err
            assert sorted(out.split()) == WORKERS
            retries = logs.named(err, "preflight retry")
            assert retries and {e["host"] for e in retries} == {"job-worker-1"}, err
            worker = job.workers[1]
            worker.wait_event("child started", restarted=True, timeout=10)


def mounted(fs_options: str, where: Path, then: list[str], fill: bool = False) -> list[str]:
    """argv: mount a small tmpfs at `where` in the pod's own mount namespace (`ip netns
    exec` makes one; nothing reaches the host), optionally fill it, run `then`, and list
    on stdout (`LEFT …`) every file it left there, before the namespace goes away."""
    fill_cmd = f"dd if=/dev/zero of={where}/fill bs=4k >/dev/null 2>&1; " if fill else ""
    return [
        "sh",
        "-c",
        f"mount -t tmpfs -o {fs_options} tmpfs {where} && {fill_cmd}"
        f"{' '.join(then)}; code=$?; find {where} -mindepth 1 ! -name fill "
        "-printf 'LEFT %p %s\\n'; exit $code",
    ]


def left(stdout: str) -> dict[str, int]:
    """{path: size} of what `mounted` listed."""
    return {
        ln.split()[1]: int(ln.split()[2]) for ln in stdout.splitlines() if ln.startswith("LEFT ")
    }


class TestStateDir:
    """A read-only or full state directory is exit 73 naming the path, nothing
    half-written, nothing left running."""

    @pytest.mark.parametrize("fault", ["read-only", "full"])
    def test_worker(self, work: Path, fault: str) -> None:
        """A worker's read-only or full state dir: 73 naming the path and cause, no traceback, no
        record published, no process left, nothing half-written."""
        with Cluster(["job-launcher", "job-worker-0"]) as c:
            job = faults_job(c, work)
            pod = c.pods[1]
            where = work / "fs"
            where.mkdir()
            options = "size=64k,mode=0755" + (",ro" if fault == "read-only" else "")
            env = job.env(pod, MPI_BOOTSTRAP_STATE_DIR=str(where / "state"))
            done = pod.run(
                mounted(options, where, [AGENT, "worker"], fill=fault == "full"), env, timeout=60
            )
            assert done.returncode == 73, done.stderr
            reason = "Read-only file system" if fault == "read-only" else "No space left on device"
            assert f"{where}/state" in done.stderr and reason in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
            assert_no_process_left(pod)
            assert not (job.xdir / "job-worker-0.json").exists()
            files = left(done.stdout)
            assert not [f for f in files if f.endswith(".tmp")], files
            # whatever is there is whole: an empty state dir, or nothing at all
            assert all(size == 0 or f.endswith("/state") for f, size in files.items()), files

    @pytest.mark.parametrize("fault", ["read-only", "full"])
    def test_launcher(self, work: Path, fault: str) -> None:
        """A launcher's read-only or full state dir: 73 naming the path and cause before mpirun,
        no traceback, no process left, no temporary file."""
        with Cluster(["job-launcher", "job-worker-0"]) as c:
            job = faults_job(c, work)
            job.start_workers(published=True)
            launcher = c.pods[0]
            where = work / "fs"
            where.mkdir()
            env = job.env(
                launcher,
                MPI_HOSTFILE=str(job.hostfile(1, ["job-worker-0"])),
                MPI_BOOTSTRAP_STATE_DIR=str(where / "state"),
                MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(where / "hostfile"),
            )
            options = "size=64k,mode=0755" + (",ro" if fault == "read-only" else "")
            done = launcher.run(
                mounted(
                    options,
                    where,
                    [AGENT, "launcher", "--mpirun", OMPI.mpirun, "--", "hostname"],
                    fill=fault == "full",
                ),
                env,
                timeout=60,
            )
            assert done.returncode == 73, done.stderr
            reason = "Read-only file system" if fault == "read-only" else "No space left on device"
            assert f"{where}/" in done.stderr and reason in done.stderr, done.stderr
            assert "mpirun start" not in done.stderr  # the files are written first
            assert "Traceback" not in done.stderr
            assert_no_process_left(launcher)
            files = left(done.stdout)
            assert not [f for f in files if f.endswith(".tmp")], files


PHASES = ["mpirun --version", "hostfile", "DNS", "exchange", "sshd wait", "preflight", "mpirun"]


def start_in_phase(cluster: Cluster, job: Job, work: Path, phase: str) -> Agent:
    """The launcher, with the one thing that holds it in `phase` arranged, once it is
    inside that phase."""
    launcher_pod, worker_pod = cluster.pods
    bindir = work / "bin"
    bindir.mkdir()
    path = f"{bindir}:{OMPI.bindir}:/usr/local/bin:/usr/bin:/bin"
    extra: dict[str, str] = {"PATH": path, "MPI_DNS_WAIT_SECONDS": "60"}
    mpirun = OMPI.mpirun
    program = ["hostname"]
    if phase == "mpirun --version":  # an mpirun that hangs when asked its version
        mpirun = str(script(bindir / "mpirun", "exec sleep 60\n"))
    if phase in ("preflight", "mpirun", "sshd wait"):
        job.start_workers([worker_pod], published=True)
    if phase == "sshd wait":  # the worker's record names a port nobody listens on
        for pid in worker_pod.netns.pids():
            os.kill(pid, signal.SIGKILL)
        assert_no_process_left(worker_pod)
        record = json.loads((job.xdir / "job-worker-0.json").read_text())
        record["port"] = 1
        (job.xdir / "job-worker-0.json").write_text(json.dumps(record))
    if phase == "preflight":  # an ssh that never returns
        script(bindir / "ssh", "exec sleep 60\n")
    if phase == "mpirun":
        program = ["sleep", "60"]
    names = {"DNS": ["job-worker-0", "no-such-host"]}.get(phase, ["job-worker-0"])
    hostfile = job.hostfile(1, names)
    if phase == "hostfile":  # a FIFO nobody writes: open() blocks
        hostfile.unlink()
        os.mkfifo(hostfile)
    env = job.env(
        launcher_pod,
        MPI_HOSTFILE=str(hostfile),
        MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(job.output),
        **extra,
    )
    agent = Agent(
        cluster, launcher_pod, [AGENT, "launcher", "--mpirun", mpirun, "--", *program], env
    )
    # Wait until the agent is inside the phase.
    if phase in ("mpirun --version", "preflight", "mpirun"):
        wait_for_process(launcher_pod if phase != "mpirun" else worker_pod, "sleep", agent)
    else:
        marker = {
            "hostfile": "MPI",
            "DNS": "DNS WAIT",
            "exchange": "DNS done",
            "sshd wait": "records",
        }[phase]
        agent.wait_event(marker)
        holds_for(
            lambda: agent.p.poll() is None,
            INSIDE_THE_WAIT_S,
            lambda: f"the launcher inside the {phase} phase: {agent.stderr()}",
        )
    return agent


@pytest.mark.workers(1)
class TestSigtermInEveryPhase:
    """SIGTERM at any point of the launcher: 143 at once, no child left, no temporary
    file, and no output file unless it is whole."""

    @pytest.mark.parametrize("phase", PHASES)
    def test_launcher(self, cluster: Cluster, work: Path, phase: str) -> None:
        """SIGTERM in each launcher phase: 143 within 5 s, no traceback, no process or rank left,
        no temporary file, an output hostfile only if whole, state files at most world-readable."""
        job = faults_job(cluster, work)
        launcher_pod, worker_pod = cluster.pods
        agent = start_in_phase(cluster, job, work, phase)
        assert agent.p.poll() is None, agent.stderr()
        t0 = time.monotonic()
        agent.p.send_signal(signal.SIGTERM)
        code, _, err = agent.finish(timeout=30)
        elapsed = time.monotonic() - t0
        assert code == 143, err
        # at once: 1 s of grace for its own children at most, plus a loaded machine
        assert elapsed < 5.0, f"{elapsed:.1f} s to exit"
        assert "Traceback" not in err
        assert_no_process_left(launcher_pod)
        if phase == "mpirun":  # the ranks on the worker go too (the worker's sshd stays)
            wait_until(
                lambda: "sleep" not in pod_processes(worker_pod),
                15,
                "the ranks on the worker to end",
            )
        state = job.state("job-launcher")
        assert half_written(state, work / "out", job.xdir) == []
        out = work / "out" / "hostfile"
        if out.exists():  # written only whole (the plan's text), never a prefix of it
            assert out.read_text().endswith("\n") and "job-worker-0" in out.read_text()
        for f in state.glob("*") if state.exists() else []:
            assert stat.S_IMODE(f.stat().st_mode) & 0o077 in (0, 0o044), f

    def test_worker_while_sshd_starts(self, cluster: Cluster, work: Path) -> None:
        """SIGTERM while the worker waits for its sshd: 143, and that sshd goes too."""
        job = faults_job(cluster, work)
        pod = cluster.pods[1]
        slow = script(work / "slow-sshd", "exec sleep 60\n")  # never answers
        agent = Agent(cluster, pod, [AGENT, "worker"], job.env(pod, MPI_BOOTSTRAP_SSHD=str(slow)))
        wait_for_process(pod, "sleep", agent)
        agent.p.send_signal(signal.SIGTERM)
        code, _, err = agent.finish(timeout=30)
        assert code == 143, err
        assert_no_process_left(pod)
        assert half_written(job.state(pod.name), job.xdir) == []


def wait_for_process(pod: Pod, name: str, agent: Agent, timeout: float = 30) -> None:
    def running() -> bool:
        if name in pod_processes(pod):
            return True
        assert agent.p.poll() is None, agent.stderr()
        return False

    wait_until(running, timeout, lambda: f"a {name} in {pod.name}: {agent.stderr()}")


@pytest.mark.workers(1)
class TestNetExchangeFlood:
    """Strangers holding many silent connections to a worker's net exchange stall
    nothing: a real hello is answered at once, and SIGTERM still ends the worker."""

    TOKEN = "flood-test-token-0123456789abcdef"  # noqa: S105 - a test token

    def test_silent_connections(self, cluster: Cluster, work: Path) -> None:
        """200 silent connections to the net exchange: a real hello is still answered within 2 s,
        and SIGTERM still ends the worker (0) within 5 s."""
        job = faults_job(cluster, work)
        launcher_pod, pod = cluster.pods
        env = job.env(pod, MPI_BOOTSTRAP_TOKEN=self.TOKEN, MPI_BOOTSTRAP_EXCHANGE="net")
        del env["MPI_BOOTSTRAP_EXCHANGE_DIR"]
        worker = Agent(cluster, pod, [AGENT, "worker"], env)
        worker.wait_event("record published")
        root = Path(__file__).resolve().parent.parent
        # 200 connections that never send a byte, held open for the whole test
        flood = cluster.start(
            launcher_pod,
            [
                sys.executable,
                "-c",
                f"""
import socket, sys, time
held = []
for _ in range(200):
    try:
        held.append(socket.create_connection(({pod.address!r}, 2223), timeout=2))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(120)
""",
            ],
        )
        assert flood.stdout is not None
        assert int(flood.stdout.readline()) > 100
        done = launcher_pod.run(
            [
                sys.executable,
                "-c",
                f"""
import sys, time
from mpi_bootstrap.ssh import netx as exchange
from mpi_bootstrap.ssh import keys
key = keys.generate(sys.argv[1], "t").public
t0 = time.monotonic()
port = exchange.fetch({pod.address!r}, 2223, {self.TOKEN!r}, key, target={pod.name!r},
                      deadline=time.monotonic() + 10).port
print(port, time.monotonic() - t0)
""",
                str(work / "client-key"),
            ],
            {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        port, answered = done.stdout.split()
        assert int(port) > 0
        # served serially with 1 s per silent peer (before), this waited ~64 s
        assert float(answered) < 2.0, f"a real hello waited {answered} s behind the flood"
        t0 = time.monotonic()
        worker.p.send_signal(signal.SIGTERM)
        code, _, err = worker.finish(timeout=30)
        assert code == 0, err
        assert time.monotonic() - t0 < 5.0
        flood.kill()
