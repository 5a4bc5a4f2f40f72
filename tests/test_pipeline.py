"""The pipelined launch (launcher/pipeline.py): each worker trusted, checked and let
through the launch gate as soon as its name resolves and its record is in, while the
others are awaited. On the simulated cluster (dnsmasq serving MPI Operator's names, one
record held back), with each real MPI: the workers already there pass their checks, and
with Open MPI their daemons start, while the last is awaited; no rank starts anywhere
before it has passed too (a marker file per rank says where ranks ran); a late worker
that fails its check ends the launch, 69, naming it, with no rank run and nothing left."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import AGENT, RealMPI
from tests.support import logs, ranks
from tests.support.cluster import REPO, Cluster
from tests.support.job import Agent, Job, pod_processes
from tests.support.ranks import DAEMONS, hide, left
from tests.support.wait import holds_for, wait_until

pytestmark = [pytest.mark.usefixtures("netns", "realmpi", "dnsmasq"), pytest.mark.timeout(240)]

W3 = ["job-worker-0", "job-worker-1", "job-worker-2"]
LATE = "job-worker-2"


@pytest.fixture
def marker(programs: Path) -> Iterator[tuple[Path, Path]]:
    yield from ranks.marker(programs)


def workers(c: Cluster, job: Job, setup: str = "", **env: str) -> None:
    """An agent in every worker pod (with `env`), each ready; the late one's pod with
    `setup` (sh run as its PID 1 first)."""
    for pod in c.pods[1:]:
        argv = (
            ["sh", "-c", f"{setup} && exec {AGENT} worker"]
            if setup and pod.name == LATE
            else [AGENT, "worker"]
        )
        w = Agent(c, pod, argv, job.env(pod, **env))
        job.workers.append(w)
        job.wait_ready(w)


def passed(launcher: Agent) -> set[str]:
    """The workers whose checks passed (their gates open), by their first label."""
    return {str(e["host"]).split(".")[0] for e in logs.named(launcher.stderr(), "worker passed")}


class TestAsTheyCome:
    def test_the_others_pass_while_one_is_awaited(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """worker-2's DNS record is late: meanwhile workers 0 and 1 pass their checks and
        — Open MPI — mpirun starts and their daemons do (but the one whose gate waits
        for every check); hydra's mpirun waits for every worker (a name is unresolved);
        no rank runs anywhere. Once the record appears, worker-2 is checked and the job
        runs: a marker per worker, exit 0."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], dns=True, pid1=True, late=[LATE]) as c:
            job = Job(c, work, real_mpi)
            workers(c, job)
            launcher = job.launcher([str(prog)], slots=1, names=W3)
            wait_until(lambda: passed(launcher) >= set(W3[:2]), 60, launcher.stderr)
            early = {p.name: set(pod_processes(p)) & DAEMONS for p in c.pods[1:3]}
            if real_mpi.vendor == "openmpi":  # their gates opened: daemons up, waiting
                # (but on the one whose gate also waits for every check: the last whose
                # name had resolved when mpirun started, launcher/sshplan.py `_holder`)
                wait_until(
                    lambda: any(set(pod_processes(p)) & DAEMONS for p in c.pods[1:3]),
                    30,
                    lambda: f"daemons on workers 0 and 1: {early}",
                )
            else:
                assert not any(early.values()), early
            holds_for(lambda: launcher.p.poll() is None, 2, "the launcher awaiting worker-2")
            assert list(marks.iterdir()) == [], "a rank ran before every check passed"
            assert LATE not in passed(launcher)
            c.add_record(LATE)
            code, _, err = launcher.finish(timeout=120)
            assert code == 0, err
            hosts = sorted(p.name.split(".")[0] for p in marks.iterdir())
            assert len(hosts) == 3 and set(hosts) <= set(W3), hosts  # Intel places by cores
            events = [(e["event"], str(e.get("host", ""))) for e in logs.events(err)]
            late_dns = next(i for i, e in enumerate(events) if e[0] == "DNS OK" and LATE in e[1])
            if real_mpi.vendor == "openmpi":
                assert events.index(("mpirun start", "")) < late_dns, events
            else:  # a name unresolved: hydra's mpirun waits for every worker (pipeline.py)
                assert late_dns < events.index(("mpirun start", "")), events
                assert logs.named(err, "mpirun waits"), err

    def test_a_late_worker_that_fails_its_check(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """worker-2, late, lacks the program: once it arrives its check fails: 69 naming
        it, no rank ran on the two that had passed, nothing of the job left on any pod."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], dns=True, pid1=True, late=[LATE]) as c:
            job = Job(c, work, real_mpi)
            workers(c, job, setup=hide(prog.parent))
            launcher = job.launcher([str(prog)], slots=1, names=W3)
            wait_until(lambda: passed(launcher) >= set(W3[:2]), 60, launcher.stderr)
            c.add_record(LATE)
            code, _, err = launcher.finish(timeout=120)
            assert code == 69, err
            assert "job-worker-2" in err and "is not found there" in err, err
            assert logs.no_rank_started(err), err
            assert list(marks.iterdir()) == []
            wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")

    @pytest.mark.parametrize("real_mpi", ["openmpi4", "mpich"], indirect=True)
    def test_a_name_of_this_pod_by_its_address(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """The hostfile names this pod by a name only DNS knows (an alias of the
        launcher's address, as MPI Operator's runLauncherAsWorker does): mpirun starts its
        ranks here without ssh (hydra at once), so the gate, planned by name before any
        answer, cannot hold them. Planned from the answers, it is off for hydra: every
        check first. worker-2 lacks the program: 69, and no rank ran anywhere, this pod
        included (hydra's ran here at once, before any check, when the first Plan took
        the name for a worker's)."""
        prog, marks = marker
        alias = "job-alias"
        with Cluster(["job-launcher", *W3], dns=True, pid1=True) as c:
            assert c.dnsmasq is not None
            c.dnsmasq.add([(c.fqdn(alias), c.pods[0].address)])
            job = Job(c, work, real_mpi)
            workers(c, job, setup=hide(prog.parent))
            launcher = job.launcher([str(prog)], slots=1, names=[*W3, alias])
            code, _, err = launcher.finish(timeout=120)
            assert code == 69, err
            assert "job-worker-2" in err and "is not found there" in err, err
            assert list(marks.iterdir()) == [], "a rank ran before every check passed"
            if real_mpi.vendor == "mpich":  # mpirun waits for every check: never started
                assert logs.named(err, "mpirun waits") and not logs.named(err, "mpirun start")
            wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")

    @pytest.mark.parametrize("real_mpi", ["openmpi4", "openmpi5", "mpich"], indirect=True)
    def test_a_second_answer_naming_this_pod(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """The launcher's nameserver answers worker-1's name with worker-1's address once
        (the agent's lookup) and with the launcher's own after (mpirun's: a stale record,
        a racing answer; tests/support/twofaced.py). worker-1 never comes up. mpirun must
        not take worker-1 for this pod and start its ranks here without ssh: no rank runs
        anywhere, and the launch ends 69 naming worker-1 (SECURITY.md 32; before, ORTE ran
        ranks here and on worker-0, and hydra here at once)."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3[:2]], dns=True, pid1=True) as c:
            launcher_pod = c.pods[0]
            records = {c.fqdn(p.name): p.address for p in c.pods}
            target = c.fqdn(W3[1])
            server = subprocess.Popen(
                ["ip", "netns", "exec", launcher_pod.netns.name, sys.executable, "-m",
                 "tests.support.twofaced", "127.0.0.53", target, launcher_pod.address,
                 json.dumps(records)],
                cwd=REPO, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            c.on_close(lambda: (server.kill(), server.wait()))
            assert server.stdout is not None and server.stdout.readline() == "ready\n"
            launcher_pod.netns.write_etc(
                "resolv.conf",
                "search default.svc.cluster.local svc.cluster.local cluster.local\n"
                "nameserver 127.0.0.53\noptions ndots:5 timeout:1 attempts:2\n",
            )
            job = Job(c, work, real_mpi)
            w0 = Agent(c, c.pods[1], [AGENT, "worker"], job.env(c.pods[1]))
            job.workers.append(w0)
            job.wait_ready(w0)
            launcher = job.launcher([str(prog)], slots=1, names=W3[:2], MPI_DNS_WAIT_SECONDS="6")
            code, _, err = launcher.finish(timeout=120)
            assert list(marks.iterdir()) == [], f"ranks ran: {sorted(marks.iterdir())}\n{err}"
            assert code == 69, err
            assert "job-worker-1" in err, err
            wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")


@pytest.mark.parametrize("real_mpi", ["openmpi4"], indirect=True)
class TestEveryWorkerFirst:
    @pytest.mark.parametrize(
        "setting", [{"MPI_BOOTSTRAP_PIPELINE": "false"}, {"MPI_BOOTSTRAP_REWRITE": "ip"}]
    )
    def test_mpirun_after_every_name(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path], setting: dict[str, str]
    ) -> None:
        """With the pipeline off, or --rewrite ip (the hostfile holds every address), no
        worker is taken (checked) and mpirun does not start before the last name resolved
        and every record was read."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], dns=True, pid1=True, late=[LATE]) as c:
            job = Job(c, work, real_mpi)
            workers(c, job)
            launcher = job.launcher([str(prog)], slots=1, names=W3, **setting)
            launcher.wait_event("DNS WAIT", timeout=30)
            holds_for(lambda: launcher.p.poll() is None, 2, "the launcher awaiting worker-2")
            c.add_record(LATE)
            code, _, err = launcher.finish(timeout=120)
            assert code == 0, err
            names = [e["event"] for e in logs.events(err)]
            assert names.index("DNS done") < names.index("records") < names.index("worker in")
            assert names.index("records") < names.index("mpirun start"), names
            assert len(list(marks.iterdir())) == 3

    def test_rdma_devices_make_mpirun_wait_for_every_worker(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path], tmp_path: Path
    ) -> None:
        """The workers' records list an RDMA device behind net1 (a sysfs tree of the
        test's): NCCL_IB_HCA names every worker's, so mpirun waits for the last worker
        (the log says why) while the others pass their checks; then the job runs."""
        prog, marks = marker
        sysfs = tmp_path / "sysfs"
        (sysfs / "class" / "net" / "net1" / "device" / "infiniband" / "mlx5_0").mkdir(parents=True)
        sysfs.chmod(0o755)
        with Cluster(["job-launcher", *W3], dns=True, pid1=True, late=[LATE]) as c:
            job = Job(c, work, real_mpi)
            workers(c, job, MPI_BOOTSTRAP_SYSFS=str(sysfs))
            # The data check would ask for an unlimited locked-memory limit with RDMA
            # (NCCL's IB transport), which needs a capability this machine may lack.
            launcher = job.launcher(
                [str(prog)], slots=1, names=W3, MPI_BOOTSTRAP_DATA_CHECK="false"
            )
            wait_until(lambda: passed(launcher) >= set(W3[:2]), 60, launcher.stderr)
            holds_for(lambda: launcher.p.poll() is None, 1, "the launcher awaiting worker-2")
            said = logs.event(launcher.stderr(), "mpirun waits")
            assert said is not None and "RDMA" in str(said["reason"]), launcher.stderr()
            assert logs.event(launcher.stderr(), "mpirun start") is None
            c.add_record(LATE)
            code, _, err = launcher.finish(timeout=120)
            assert code == 0, err
            start = logs.event(err, "mpirun start")
            assert start is not None and "NCCL_IB_HCA" in start["forwarded"], err
            assert len(list(marks.iterdir())) == 3
