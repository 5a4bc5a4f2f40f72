"""End to end on the simulated cluster: a launcher pod and worker pods (network
namespaces on a control and a data bridge, the agent as PID 1 of each pod's PID
namespace), dnsmasq serving MPI Operator's names, real OpenSSH, and each real MPI."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REAL_MPIS, RealMPI
from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.job import PODS, WORKERS, Agent, Job, check_allreduce, pod_processes
from tests.support.programs import compile_allreduce
from tests.support.wait import holds_for, wait_until

# Every test builds a cluster with DNS and runs a real MPI on it.
pytestmark = [pytest.mark.usefixtures("dnsmasq", "realmpi"), pytest.mark.timeout(300)]

# How long the launcher must keep waiting for a DNS record that is not there yet (well
# past its first rounds of lookups) before the record is added.
STILL_WAITING_S = 4


class TestEveryMPI:
    """Each of Open MPI 4, Open MPI 5, MPICH and Intel MPI through the agent."""

    def test_allreduce_2_workers_2_slots(
        self, real_mpi: RealMPI, work: Path, programs: Path
    ) -> None:
        """Each MPI runs an allreduce on 2 worker pods × 2 slots through the agent, every rank on
        a worker, after the workers tested their data NIC (net1) between them. mpirun's ssh
        runs over the connection preflight opened (ControlMaster), whose session also ran
        the data check: each worker's sshd accepts one login per job, not two, and no
        connection that only looked at its banner; the sockets' directory is private."""
        exe = compile_allreduce(real_mpi, programs)
        sshd_logs, done = sshd_log_per_worker(work, real_mpi, exe, "on")
        assert logs.event(done.stderr, "data check ok", workers=2, nic="net1") is not None
        assert [log.count("Accepted publickey") for log in sshd_logs] == [1, 1]
        # sshd's words for a client that left before its own banner (a readiness probe)
        assert not [log for log in sshd_logs if "kex_exchange_identification" in log]

    def test_without_reuse_every_ssh_logs_in(self, work: Path, programs: Path) -> None:
        """The control for the test above: with MPI_BOOTSTRAP_SSH_REUSE=off, preflight (with
        the data check in its session) and mpirun each log in to every worker."""
        m = REAL_MPIS["openmpi4"]
        sshd_logs, _ = sshd_log_per_worker(work, m, compile_allreduce(m, programs), "off")
        assert [log.count("Accepted publickey") for log in sshd_logs] == [2, 2]

    @pytest.mark.parametrize("real_mpi", ["openmpi4", "mpich"], indirect=True)  # MPI-free
    def test_late_dns_record(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        """The launcher keeps waiting (DNS WAIT) for a worker's late DNS record, then runs the job
        once it appears."""
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True, late=["job-worker-1"]) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            p = c.start(c.pods[0], job.launcher_argv([str(exe)]), job.launcher_env())
            holds_for(
                lambda: p.poll() is None,
                STILL_WAITING_S,
                "the launcher must still be waiting for DNS",
            )
            c.add_record("job-worker-1")
            out, err = p.communicate(timeout=120)
            check_allreduce(subprocess.CompletedProcess([], p.returncode, out, err), 4, WORKERS)
            waits = logs.named(err, "DNS WAIT")
            assert waits and waits[0]["host"] == "job-worker-1.job.default.svc"

    def test_only_fqdn_resolves(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        """Where only FQDNs resolve: 68 within the DNS wait naming the name; with REWRITE=fqdn or
        ip the hostfile holds FQDNs or addresses and the job runs."""
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
                if mode == "fqdn" and real_mpi.vendor == "openmpi":  # hydra: addresses
                    assert "job-worker-0.job.default.svc.cluster.local" in written
                else:
                    assert "10.250.0.11" in written

    def test_environment_reaches_every_rank_and_data_stays_off_the_wire(
        self, real_mpi: RealMPI, work: Path, probe: list[str]
    ) -> None:
        """NCCL_SOCKET_IFNAME==net1 (exactly net1), the user's NCCL_* and LD_LIBRARY_PATH on
        every rank; nothing of ssh or MPI on net1 while it runs, and plenty on eth0. (The data
        check, which uses net1 on purpose, is off here: tests/test_datacheck.py covers it.)"""
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, real_mpi)
            job.start_workers()
            worker = c.pods[1]
            caps = {}
            for iface in ("net1", "eth0"):
                out = work / f"{iface}.pcap"
                # --immediate-mode: each packet written as it comes. Without it they wait in
                # the kernel's buffer for up to a second, and a job this short ends first:
                # "0 packets captured, 168 received by filter".
                argv = ["tcpdump", "-i", iface, "--immediate-mode", "-U", "-n", "-w", str(out)]
                argv.append("tcp or udp")
                caps[iface] = (out, Agent(c, worker, argv, {}))
            # Its file can exist before it captures: "listening on" says it does.
            wait_until(
                lambda: all("listening on" in a.stderr() for _, a in caps.values()),
                10,
                "tcpdump to start capturing",
            )
            done = job.launch(
                probe,
                NCCL_DEBUG="INFO",
                NCCL_IB_HCA="mlx5_0",
                LD_LIBRARY_PATH="/opt/user-lib",
                MPI_BOOTSTRAP_DATA_CHECK="off",
            )
            for _, a in caps.values():
                a.signal()
                a.finish(timeout=10)
            assert done.returncode == 0, done.stderr
            seen = [
                json.loads(ln[6:]) for ln in done.stdout.splitlines() if ln.startswith("PROBE ")
            ]
            assert len(seen) == 4
            for r in seen:
                env = r["env"]
                assert env.get("NCCL_SOCKET_IFNAME") == "=net1"  # exactly the data NIC
                assert env.get("NCCL_DEBUG") == "INFO"
                assert env.get("NCCL_IB_HCA") == "mlx5_0"
                assert "/opt/user-lib" in env.get("LD_LIBRARY_PATH", "")
                assert "MPI_BOOTSTRAP_EXCHANGE_DIR" not in env
            count = {
                iface: len(
                    subprocess.run(
                        ["tcpdump", "-n", "-r", str(out)],
                        capture_output=True,
                        text=True,
                        check=False,
                    ).stdout.splitlines()
                )
                for iface, (out, _) in caps.items()
            }
            assert count["net1"] == 0, count
            assert count["eth0"] > 10, count  # the capture works: ssh and MPI were seen


@pytest.fixture(params=["openmpi4", "mpich"])
def failing_mpi(request: pytest.FixtureRequest) -> RealMPI:
    return REAL_MPIS[request.param]


def sshd_log_per_worker(
    work: Path, m: RealMPI, exe: Path, reuse: str
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Run the allreduce with MPI_BOOTSTRAP_SSH_REUSE=`reuse`; each worker's log, sshd's
    included, and the launcher's run. The state directory is short (the socket's path must
    fit in 108 bytes)."""
    state = Path(tempfile.mkdtemp(prefix="mpib-", dir="/run"))
    try:
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            workers = job.start_workers()
            for w in workers:
                job.wait_ready(w)
            done = job.launch(
                [str(exe)], MPI_BOOTSTRAP_STATE_DIR=str(state / "s"), MPI_BOOTSTRAP_SSH_REUSE=reuse
            )
            check_allreduce(done, 4, WORKERS)
            assert logs.event(done.stderr, "mpirun start") is not None, done.stderr
            if reuse == "on":
                assert stat.S_IMODE((state / "s" / "cm").stat().st_mode) == 0o700
            else:
                assert not (state / "s" / "cm").exists()
            # The workers end on the job's end (job-done); sshd's log is in theirs.
            return [w.finish(timeout=30)[2] for w in workers], done
    finally:
        shutil.rmtree(state, ignore_errors=True)


class TestFailures:
    """The failures the agent exists to explain, with Open MPI 4 and a hydra MPI."""

    def test_record_never_appears(self, failing_mpi: RealMPI, work: Path) -> None:
        """A record that never appears: 68 soon after the DNS wait, naming the host and why, with
        the hostfile, resolv.conf, /etc/hosts and unresolved-names sections."""
        with Cluster(PODS, dns=True, pid1=True, late=["job-worker-1"]) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers()
            t0 = time.monotonic()
            done = job.launch(["true"], MPI_DNS_WAIT_SECONDS="4")
            assert done.returncode == 68, done.stderr
            assert time.monotonic() - t0 < 4 + 8
            # dnsmasq refuses the `.svc` form outright (glibc: temporary failure) after
            # NXDOMAIN for every search-list form
            assert re.search(
                r"job-worker-1\.job\.default\.svc \((not found|temporary "
                r"failure)\)",
                done.stderr,
            ), done.stderr
            for section in (
                "--- hostfile",
                "--- /etc/resolv.conf",
                "search default.svc",
                "--- /etc/hosts",
                "--- unresolved names",
            ):
                assert section in done.stderr

    def test_worker_without_sshd(self, failing_mpi: RealMPI, work: Path) -> None:
        """A worker whose agent never starts: 69 naming its missing record, before mpirun starts."""
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers(c.pods[1:2])  # job-worker-1 never starts its agent
            done = job.launch(["true"], MPI_DNS_WAIT_SECONDS="5")
            assert done.returncode == 69, done.stderr
            assert "no record from job-worker-1.job.default.svc" in done.stderr
            assert logs.no_rank_started(done.stderr)

    def test_sigterm_mid_job(self, failing_mpi: RealMPI, work: Path) -> None:
        """SIGTERM to the launcher's agent mid-job: 143 within 15 s, and no rank or MPI daemon
        left in any pod."""
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, failing_mpi)
            job.start_workers()
            launcher = c.pods[0]
            p = c.start(launcher, job.launcher_argv(["sleep", "120"]), job.launcher_env(slots=1))

            def ranks_running() -> bool:
                assert p.poll() is None, p.communicate()
                return all("sleep" in pod_processes(w) for w in c.pods[1:])

            wait_until(ranks_running, 60, "the ranks to start")
            t0 = time.monotonic()
            c.signal(p)  # to the agent, PID 1 of the launcher pod
            _, err = p.communicate(timeout=60)
            assert p.returncode == 143, err
            assert time.monotonic() - t0 < 15

            def leftovers() -> dict[str, list[str]]:
                return {
                    w.name: [
                        n for n in pod_processes(w) if n in ("sleep", "orted", "hydra_pmi_proxy")
                    ]
                    for w in c.pods[1:]
                }

            wait_until(
                lambda: not any(leftovers().values()),
                15,
                lambda: f"the ranks and MPI daemons to end: {leftovers()}",
            )
            assert pod_processes(launcher) == []


def test_scale_16_workers(work: Path, programs: Path) -> None:
    """16 worker pods, 1 slot each, Open MPI 4: the job completes."""
    m = REAL_MPIS["openmpi4"]
    exe = compile_allreduce(m, programs)
    workers = [f"job-worker-{i}" for i in range(16)]
    with Cluster(["job-launcher", *workers], dns=True, pid1=True) as c:
        job = Job(c, work, m)
        job.start_workers()
        done = job.launch([str(exe)], slots=1, names=workers, timeout=240)
        check_allreduce(done, 16, workers)


def test_teardown_leaves_nothing(work: Path) -> None:
    """After close(): no namespace, /etc/netns entry, netns mount or started process."""
    m = REAL_MPIS["openmpi4"]
    with Cluster(PODS, dns=True, pid1=True) as c:
        job = Job(c, work, m)
        procs = [w.p for w in job.start_workers()]
        for w in job.workers:  # up and serving, as a job's pods would be
            job.wait_ready(w)
        names = [p.netns.name for p in c.pods] + [c.switch.name]
        dnsmasq_pid = c.dnsmasq.pid if c.dnsmasq else None
        pids = [c.pid_of(p) for p in procs]
    listed = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    for name in names:
        assert name not in listed
        assert not Path(f"/etc/netns/{name}").exists()
        assert f"/run/netns/{name}" not in mounts
    assert all(p.poll() is not None for p in procs)
    for pid in [*pids, dnsmasq_pid]:
        assert pid is not None and not Path(f"/proc/{pid}").exists(), pid
