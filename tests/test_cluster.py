"""End to end on the simulated cluster: a launcher pod and worker pods (network
namespaces on a control and a data bridge, the agent as PID 1 of each pod's PID
namespace), dnsmasq serving MPI Operator's names, real OpenSSH, and each real MPI."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REAL_MPIS, RealMPI
from tests.support.cluster import Cluster
from tests.support.job import PODS, WORKERS, Job, check_allreduce, pod_processes
from tests.support.programs import compile_allreduce

pytestmark = [pytest.mark.netns, pytest.mark.realmpi, pytest.mark.dnsmasq,
              pytest.mark.timeout(300)]

class TestEveryMPI:
    """Each of Open MPI 4, Open MPI 5, MPICH and Intel MPI through the agent."""

    def test_allreduce_2_workers_2_slots(self, real_mpi: RealMPI, work: Path,
                                         programs: Path) -> None:
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            done = job.launch([str(exe)])
            check_allreduce(done, 4, WORKERS)

    def test_late_dns_record(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True, late=["job-worker-1"]) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            launcher = c.pods[0]
            env = job.env(launcher, MPI_HOSTFILE=str(job.hostfile()),
                          MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(work / "mpi-hostfile"))
            p = c.start(launcher, job.launcher_argv([str(exe)]), env)
            time.sleep(4)
            assert p.poll() is None, "the launcher must still be waiting for DNS"
            c.add_record("job-worker-1")
            out, err = p.communicate(timeout=120)
            check_allreduce(subprocess.CompletedProcess([], p.returncode, out, err), 4,
                            WORKERS)
            events = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
            waits = [e for e in events if e["event"] == "DNS WAIT"]
            assert waits and waits[0]["host"] == "job-worker-1.job.default.svc"

    def test_only_fqdn_resolves(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True, fqdn_only=True) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            t0 = time.monotonic()
            done = job.launch([str(exe)], MPI_DNS_WAIT_SECONDS="3")
            assert done.returncode == 68, done.stderr
            assert time.monotonic() - t0 < 15
            assert "did not resolve within 3 s: job-worker-0.job.default.svc" in done.stderr
            for mode in ("fqdn", "ip"):
                job.restart_workers()  # a successful job ends them (job-done)
                done = job.launch([str(exe)], MPI_BOOTSTRAP_REWRITE=mode)
                check_allreduce(done, 4, WORKERS)
                written = (work / "mpi-hostfile").read_text()
                if mode == "fqdn":
                    assert "job-worker-0.job.default.svc.cluster.local" in written
                else:
                    assert "10.250.0.11" in written

    def test_environment_reaches_every_rank_and_data_stays_off_the_wire(
            self, real_mpi: RealMPI, work: Path, probe: list[str]) -> None:
        """NCCL_SOCKET_IFNAME=net1, the user's NCCL_* and LD_LIBRARY_PATH on every rank;
        nothing of ssh or MPI on net1 while it runs, and plenty on eth0."""
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            worker = c.pods[1]
            caps = {}
            for iface in ("net1", "eth0"):
                out = work / f"{iface}.pcap"
                caps[iface] = (out, c.start(worker, ["tcpdump", "-i", iface, "-U", "-n",
                                                     "-w", str(out), "tcp or udp"]))
            deadline = time.monotonic() + 10
            while not all(o.exists() for o, _ in caps.values()) and time.monotonic() < deadline:
                time.sleep(0.05)
            done = job.launch(probe, NCCL_DEBUG="INFO", NCCL_IB_HCA="mlx5_0",
                              LD_LIBRARY_PATH="/opt/user-lib")
            for _, p in caps.values():
                c.signal(p)
                p.wait(timeout=10)
            assert done.returncode == 0, done.stderr
            seen = [json.loads(ln[6:]) for ln in done.stdout.splitlines()
                    if ln.startswith("PROBE ")]
            assert len(seen) == 4
            for r in seen:
                env = r["env"]
                assert env.get("NCCL_SOCKET_IFNAME") == "net1"
                assert env.get("NCCL_DEBUG") == "INFO"
                assert env.get("NCCL_IB_HCA") == "mlx5_0"
                assert "/opt/user-lib" in env.get("LD_LIBRARY_PATH", "")
                assert "MPI_BOOTSTRAP_EXCHANGE_DIR" not in env
            count = {iface: len(subprocess.run(
                ["tcpdump", "-n", "-r", str(out)], capture_output=True, text=True,
                check=False).stdout.splitlines()) for iface, (out, _) in caps.items()}
            assert count["net1"] == 0, count
            assert count["eth0"] > 10, count  # the capture works: ssh and MPI were seen


@pytest.fixture(params=["openmpi4", "mpich"])
def failing_mpi(request: pytest.FixtureRequest) -> RealMPI:
    return REAL_MPIS[request.param]


class TestFailures:
    """The failures the agent exists to explain, with Open MPI 4 and a hydra MPI."""

    def test_record_never_appears(self, failing_mpi: RealMPI, work: Path) -> None:
        with Cluster(PODS, dns=True, pid1=True, late=["job-worker-1"]) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers()
            t0 = time.monotonic()
            done = job.launch(["true"], MPI_DNS_WAIT_SECONDS="4")
            assert done.returncode == 68, done.stderr
            assert time.monotonic() - t0 < 4 + 8
            # dnsmasq refuses the `.svc` form outright (glibc: temporary failure) after
            # NXDOMAIN for every search-list form
            assert re.search(r"job-worker-1\.job\.default\.svc \((not found|temporary "
                             r"failure)\)", done.stderr), done.stderr
            for section in ("--- hostfile", "--- /etc/resolv.conf", "search default.svc",
                            "--- /etc/hosts", "--- unresolved names"):
                assert section in done.stderr

    def test_worker_without_sshd(self, failing_mpi: RealMPI, work: Path) -> None:
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers(c.pods[1:2])  # job-worker-1 never starts its agent
            done = job.launch(["true"], MPI_DNS_WAIT_SECONDS="5")
            assert done.returncode == 69, done.stderr
            assert "no record from job-worker-1.job.default.svc" in done.stderr
            assert "mpirun start" not in done.stderr

    def test_sigterm_mid_job(self, failing_mpi: RealMPI, work: Path) -> None:
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers()
            launcher = c.pods[0]
            env = job.env(launcher, MPI_HOSTFILE=str(job.hostfile(1)),
                          MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(work / "mpi-hostfile"))
            p = c.start(launcher, job.launcher_argv(["sleep", "120"]), env)
            deadline = time.monotonic() + 60
            while not all("sleep" in pod_processes(w) for w in c.pods[1:]):
                assert time.monotonic() < deadline, "ranks never started"
                assert p.poll() is None, p.communicate()
                time.sleep(0.1)
            t0 = time.monotonic()
            c.signal(p)  # to the agent, PID 1 of the launcher pod
            _, err = p.communicate(timeout=60)
            assert p.returncode == 143, err
            assert time.monotonic() - t0 < 15
            deadline = time.monotonic() + 15
            leftovers = {w.name: [n for n in pod_processes(w)
                                  if n in ("sleep", "orted", "hydra_pmi_proxy")]
                         for w in c.pods[1:]}
            while any(leftovers.values()) and time.monotonic() < deadline:
                time.sleep(0.2)
                leftovers = {w.name: [n for n in pod_processes(w)
                                      if n in ("sleep", "orted", "hydra_pmi_proxy")]
                             for w in c.pods[1:]}
            assert not any(leftovers.values()), leftovers
            assert pod_processes(launcher) == []


def test_scale_16_workers(work: Path, programs: Path) -> None:
    """16 worker pods, 1 slot each, Open MPI 4: the job completes."""
    m = REAL_MPIS["openmpi4"]
    exe = compile_allreduce(m, programs)
    workers = [f"job-worker-{i}" for i in range(16)]
    with Cluster(["job-launcher", *workers], dns=True, pid1=True) as c:
        job = Job(c, work, m)
        job.start_workers()
        launcher = c.pods[0]
        hf = job.hostfile(1, workers)
        env = job.env(launcher, MPI_HOSTFILE=str(hf),
                      MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(work / "mpi-hostfile"))
        done = launcher.run(job.launcher_argv([str(exe)]), env, timeout=240)
        check_allreduce(done, 16, workers)


def test_teardown_leaves_nothing(work: Path) -> None:
    """After close(): no namespace, /etc/netns entry, netns mount or started process."""
    m = REAL_MPIS["openmpi4"]
    with Cluster(PODS, dns=True, pid1=True) as c:
        job = Job(c, work, m)
        procs = job.start_workers()
        for pod in c.pods[1:]:  # up and serving, as a job's pods would be
            deadline = time.monotonic() + 20
            while pod.run([AGENT, "probe"], job.env(pod)).returncode != 0:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        names = [p.netns.name for p in c.pods] + [c.switch.name]
        dnsmasq_pid = c.dnsmasq.pid if c.dnsmasq else None
        pids = [c.pid_of(p) for p in procs]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    for name in names:
        assert name not in listed
        assert not Path(f"/etc/netns/{name}").exists()
        assert f"/run/netns/{name}" not in mounts
    assert all(p.poll() is not None for p in procs)
    for pid in [*pids, dnsmasq_pid]:
        assert pid is not None and not Path(f"/proc/{pid}").exists(), pid
