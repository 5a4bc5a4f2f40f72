"""What images nobody here built bring, met with the real MPIs on the simulated cluster:
single-node settings in the environment (overridden, or refused with 64), a program
that resolves differently on some pod, MPICH's netmod across pods, a job set up with no
exchange at all, and a readiness probe that must not fill the worker's log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import AGENT, REAL_MPIS
from tests.support import logs
from tests.support.cluster import Cluster, agent_env
from tests.support.job import PODS, WORKERS, Job, check_allreduce
from tests.support.programs import DISTGRAPH, compile_allreduce, compile_program

# Every test builds a cluster with DNS; all but TestNoExchange run a real MPI on it.
pytestmark = [pytest.mark.usefixtures("dnsmasq"), pytest.mark.timeout(300)]

# What an Ubuntu 24.04 CUDA/PyTorch image carries (its Open MPI 4.1.6), and the rest of
# the single-node settings README's table lists.
CUDA_IMAGE = {
    "OMPI_MCA_plm": "isolated",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "PMIX_MCA_gds": "hash",
}
OVERRIDDEN = [
    pytest.param(("openmpi4", CUDA_IMAGE, "OMPI_MCA_plm", "--mca plm"), id="openmpi4-plm-isolated"),
    pytest.param(
        ("openmpi4", {"OMPI_MCA_btl": "self,vader"}, "OMPI_MCA_btl", "--mca btl"),
        id="openmpi4-btl-on-node",
    ),
    pytest.param(
        ("openmpi5", {"PRTE_MCA_plm": "isolated"}, "PRTE_MCA_plm", "--prtemca plm"),
        id="openmpi5-plm-isolated",
    ),
    pytest.param(
        ("mpich", {"HYDRA_LAUNCHER": "fork"}, "HYDRA_LAUNCHER", "-launcher"), id="mpich-fork"
    ),
    pytest.param(
        ("intel", {"I_MPI_HYDRA_BOOTSTRAP": "fork"}, "I_MPI_HYDRA_BOOTSTRAP", "-bootstrap"),
        id="intel-fork",
    ),
]


@pytest.mark.usefixtures("realmpi")
class TestImageSettings:
    """A single-node setting in the image's environment does not stop (or silently
    shrink) a job across pods: the agent overrides it and says so."""

    @pytest.mark.parametrize("case", OVERRIDDEN)
    def test_overridden(
        self, case: tuple[str, dict[str, str], str, str], work: Path, programs: Path
    ) -> None:
        """Each single-node setting in the image's environment is overridden (--explain says
        `overrides VAR=`), and the job runs with every rank on a worker."""
        mpi, env, var, setting = case
        m = REAL_MPIS[mpi]
        exe = compile_allreduce(m, programs)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            job.start_workers()
            explain = c.pods[0].run(
                [AGENT, "launcher", "--explain", "--json", "--mpirun", m.mpirun, "--", str(exe)],
                job.env(c.pods[0], MPI_HOSTFILE=str(job.hostfile()), **env),
                timeout=120,
            )
            assert explain.returncode == 0, explain.stderr
            decided = {d["setting"]: d for d in json.loads(explain.stdout)["decisions"]}
            assert decided[setting]["reason"].startswith(f"overrides {var}="), decided[setting]
            done = job.launch([str(exe)], **env)
            check_allreduce(done, 4, WORKERS)  # every rank on a worker, none on the launcher

    def test_fi_provider_shm_is_refused(self, work: Path, programs: Path) -> None:
        """FI_PROVIDER=shm: Intel MPI's ranks died with SIGSEGV in libfabric across pods.
        The right provider depends on the fabric: 64, naming it, before mpirun."""
        m = REAL_MPIS["intel"]
        exe = compile_allreduce(m, programs)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            job.start_workers()
            done = job.launch([str(exe)], FI_PROVIDER="shm")
            assert done.returncode == 64, done.stderr
            assert "FI_PROVIDER='shm'" in done.stderr
            assert "mpirun start" not in done.stderr  # refused with the config


@pytest.mark.usefixtures("realmpi")
class TestMPICHNetmod:
    """PyPI's MPICH (ch4:ucx,ofi) runs on OFI's tcp provider: MPI_Dist_graph_create across
    pods, which hung with its default UCX netmod (mpi4py's topology tests), completes."""

    def test_distgraph_across_pods(self, work: Path, programs: Path) -> None:
        """MPI_Dist_graph_create completes on all 4 ranks across pods, and the agent forwards
        MPIR_CVAR_CH4_NETMOD."""
        m = REAL_MPIS["mpich"]
        exe = compile_program(m, programs, DISTGRAPH)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            job.start_workers()
            done = job.launch([str(exe)], timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.count(": OK") == 4, done.stdout
            start = logs.event(done.stderr, "mpirun start")
            assert start is not None, done.stderr
            assert "MPIR_CVAR_CH4_NETMOD" in start["forwarded"]


RANK_PATH = "import os; print('PATH', os.uname().nodename, os.environ['PATH'], flush=True)"


@pytest.mark.usefixtures("realmpi")
class TestProgramResolves:
    """The ranks get the PATH the launcher forwards (no /usr/bin put first behind the
    agent's back), and a program that is another file on some pod is caught before
    mpirun starts."""

    @pytest.mark.parametrize("mpi", ["openmpi4", "mpich"])
    def test_ranks_keep_the_forwarded_path(self, mpi: str, work: Path) -> None:
        """Every rank's PATH is exactly the one the launcher forwards (the MPI's bindir first), not
        reordered on the workers."""
        m = REAL_MPIS[mpi]
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            job.start_workers()
            done = job.launch(["/usr/bin/python3", "-c", RANK_PATH])
            assert done.returncode == 0, done.stderr
            paths = {ln.split()[2] for ln in done.stdout.splitlines() if ln.startswith("PATH")}
            assert paths == {f"{m.bindir}:/usr/local/bin:/usr/bin:/bin"}, done.stdout

    def test_program_differs_on_a_worker(self, work: Path) -> None:
        """`myprog` in the launcher pod's own /opt/venv (a mount only it has), and in a
        common directory later on the PATH: on the workers the ranks would run the other
        one (a bare `python3` leaving the image's venv)."""
        m = REAL_MPIS["openmpi4"]
        common, venv = work / "common", work / "venv"
        for d in (common, venv):
            d.mkdir()
            (d / "myprog").write_text(f"#!/bin/sh\necho {d.name}\n")
            (d / "myprog").chmod(0o755)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            job.start_workers()
            launcher = c.pods[0]
            path = f"/opt/venv:{common}:{m.bindir}:/usr/bin:/bin"
            env = job.env(launcher, MPI_HOSTFILE=str(job.hostfile(1)), PATH=path)
            # /opt/venv exists in the launcher pod's mount namespace only
            done = launcher.run(
                [
                    "sh",
                    "-c",
                    f"mkdir -p /opt/venv && mount --bind {venv} "
                    f"/opt/venv && exec {AGENT} launcher -- myprog",
                ],
                env,
                timeout=120,
            )
            assert done.returncode == 69, done.stdout + done.stderr
            assert (
                f"the program 'myprog' is {common}/myprog there but /opt/venv/myprog "
                "on the launcher"
            ) in done.stderr
            assert logs.no_rank_started(done.stderr)


class TestNoExchange:
    """With no exchange found (`auto`: no key, no directory, no token) and no sshd on the
    workers, preflight says so within seconds — host, port, why no exchange, what to set
    — not after the 120 s deadline; and every log line, from every thread, has a role."""

    def test_refused_is_named_at_once(self, work: Path) -> None:
        """No exchange and no sshd: 69 within 20 s naming the refused port, why no exchange and
        what to set, without the doctor; every log line has role launcher."""
        with Cluster(PODS, dns=True, pid1=True) as c:
            launcher = c.pods[0]
            hf = work / "hostfile"
            hf.write_text("".join(f"{c.svc(w)} slots=1\n" for w in WORKERS))
            env = agent_env(work, launcher, MPI_HOSTFILE=str(hf), MPI_BOOTSTRAP_REWRITE="fqdn")
            t0 = time.monotonic()
            done = launcher.run([AGENT, "launcher", "--", "hostname"], env, timeout=180)
            took = time.monotonic() - t0
            assert done.returncode == 69, done.stderr
            assert took < 20, took  # 5 s of refusals, not the 120 s deadline
            assert "connection refused: no sshd on that port (port 22)" in done.stderr
            assert "no exchange is set up (auto: no key at" in done.stderr
            assert "TOKEN_FILE (net) or MPI_BOOTSTRAP_EXCHANGE_DIR (dir)" in done.stderr
            assert "--- doctor" not in done.stderr  # DNS and the Service are beside the point
            lines = logs.events(done.stderr)
            assert any(e["event"] == "preflight retry" for e in lines)
            assert all(e.get("role") == "launcher" for e in lines), lines
            assert any(e["event"] == "exchange" and e["mode"] == "none" for e in lines)


@pytest.mark.usefixtures("realmpi")
class TestQuietProbe:
    """A readinessProbe every few seconds adds nothing to the worker's log (sshd logs two
    lines for every connection: the probe does not connect)."""

    def test_probes_add_no_log_line(self, work: Path) -> None:
        """20 readiness probes add no sshd connection line to the worker's log."""
        m = REAL_MPIS["openmpi4"]
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, m)
            pod = c.pods[1]
            worker = job.start_workers([pod])[0]
            job.wait_ready(worker)
            for _ in range(20):
                done = pod.run([AGENT, "probe"], job.env(pod))
                assert done.returncode == 0 and done.stdout.startswith("ready:"), done.stdout
            worker.signal()  # SIGTERM: the worker ends, its log is complete
            _, _, err = worker.finish(timeout=20)
            noise = [
                ln
                for ln in logs.messages(err)
                if (
                    "kex_exchange_identification" in ln
                    or "Connection reset" in ln
                    or "Connection closed" in ln
                )
            ]
            assert noise == []
            assert "Server listening on" in err  # sshd's log was really collected
