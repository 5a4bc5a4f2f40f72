"""The launch gate (core/gate.py): mpirun starts beside the checks, and still no rank of the
user's program starts on any host unless every check passed. On the simulated cluster,
with each real MPI: a program that writes a marker file per rank proves where ranks ran;
a worker whose check fails (its program missing, its LD_LIBRARY_PATH lost, its data NIC
down) ends the job with 69 naming it, no marker anywhere, and no MPI daemon or ssh
process of the job left on any pod; the control writes every marker."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import AGENT, REAL_MPIS, RealMPI
from tests.support import logs, ranks
from tests.support.cluster import Cluster, Pod
from tests.support.job import Agent, Job, pod_processes, sshd_of
from tests.support.ranks import JOB_PROCESSES, hide, left
from tests.support.wait import holds_for, wait_until

pytestmark = [pytest.mark.usefixtures("netns", "realmpi"), pytest.mark.timeout(180)]

W3 = ["job-worker-0", "job-worker-1", "job-worker-2"]


@dataclass
class Fault:
    """What worker-1's pod gets before its agent starts (`setup`, sh run as the pod's
    PID 1 in its own mount namespace) or after (`after`), and what the launcher says."""

    setup: Callable[[Path], str] = lambda _: ""
    after: Callable[[Cluster], None] = lambda _: None
    said: tuple[str, ...] = ()


def lose_ld(programs: Path) -> str:
    """Root's ~/.bashrc in worker-1's pod sets LD_LIBRARY_PATH: what ssh sent is lost."""
    rc = programs / "bashrc"
    rc.write_text("export LD_LIBRARY_PATH=/wrong\n")
    return f"mount --bind {shlex.quote(str(rc))} /root/.bashrc"


FAULTS = {
    "program missing": Fault(setup=hide, said=("job-worker-1: the program", "is not found there")),
    "LD_LIBRARY_PATH lost": Fault(
        setup=lose_ld, said=("job-worker-1: LD_LIBRARY_PATH did not arrive", "'/wrong'")
    ),
    "data NIC down": Fault(
        after=lambda c: c.pods[2].netns.exec_checked(["ip", "link", "set", "net1", "down"]),
        said=("data network:", "job-worker-1"),
    ),
}


@pytest.fixture
def marker(programs: Path) -> Iterator[tuple[Path, Path]]:
    """A program that writes one marker per rank (`<host>.<pid>`), and their directory."""
    yield from ranks.marker(programs)


def start(c: Cluster, work: Path, m: RealMPI, fault: Fault, programs: Path) -> Job:
    """Workers on pods 1-3, worker-1's with the fault's set-up, each ready."""
    job = Job(c, work, m)
    for pod in c.pods[1:4]:
        setup = fault.setup(programs) if pod.name == "job-worker-1" else ""
        argv = ["sh", "-c", f"{setup} && exec {AGENT} worker"] if setup else [AGENT, "worker"]
        w = Agent(c, pod, argv, job.env(pod))
        job.workers.append(w)
        job.wait_ready(w)
    fault.after(c)
    return job


def daemons_while(launcher: Agent, *pods: Pod) -> set[str]:
    """The MPI daemons seen in any of `pods` (sampled) while the launcher runs."""
    seen: set[str] = set()

    def ended() -> bool:
        for pod in pods:
            seen.update(set(pod_processes(pod)) & JOB_PROCESSES)
        return launcher.p.poll() is not None

    wait_until(ended, 120, "the launcher to end", interval=0.05)
    return seen


@contextlib.contextmanager
def sshd_stopped(pod: Pod) -> Iterator[None]:
    """The worker's sshd stopped (SIGSTOP) for the block, continued after it."""
    sshd = sshd_of(pod)
    os.kill(sshd, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(sshd, signal.SIGCONT)


def launch(job: Job, prog: Path) -> Agent:
    return job.launcher([str(prog)], slots=1, names=W3, LD_LIBRARY_PATH="/opt/user-lib")


def mpi(kind: str) -> RealMPI:
    """One real MPI by its kind (the `real_mpi` fixture runs every one)."""
    m = REAL_MPIS[kind]
    if not os.access(m.mpirun, os.X_OK):
        pytest.fail(f"{m.mpirun} missing: run `make system-deps mpi-venvs` (make test does)")
    return m


def refused(c: Cluster, launcher: Agent, marks: Path) -> list[str]:
    """The launcher's end: 69 naming worker-1's data NIC, no marker on any host, nothing
    of the job left on any pod; its log's events."""
    code, _, err = launcher.finish(timeout=120)
    assert code == 69, err
    assert "data network:" in err and "job-worker-1" in err, err
    assert sorted(p.name for p in marks.iterdir()) == [], err
    wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")
    return [e["event"] for e in logs.events(err)]


class TestNoRankBeforeEveryCheck:
    """mpirun starts with the checks (its log says so first), yet a failed check means no
    rank ran anywhere; the agent ends mpirun and leaves nothing of the job behind."""

    @pytest.mark.parametrize("fault", sorted(FAULTS))
    def test_failed_check(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path], fault: str
    ) -> None:
        """Exit 69 naming worker-1 and why; mpirun was started (and ended); no marker on any
        host; no MPI daemon, ssh or mpirun left on any pod. With the data NIC down, workers
        0 and 2 pass preflight seconds before the data check fails: Open MPI's daemon starts
        on one of them meanwhile (ORTE and PRRTE alike start no rank until every daemon
        reported, and the gate of the last worker known when mpirun started, either of them,
        holds its daemon back), hydra's proxy on neither (its gates wait for all)."""
        prog, marks = marker
        f = FAULTS[fault]
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, real_mpi, f, prog.parent)
            launcher = launch(job, prog)
            seen = daemons_while(launcher, c.pods[1], c.pods[3])
            code, _, err = launcher.finish(timeout=120)
            assert code == 69, err
            for words in f.said:
                assert words in err, err
            events = [e["event"] for e in logs.events(err)]
            assert "mpirun start" in events and "mpirun ended" in events, events
            assert events.index("mpirun start") < events.index("mpirun ended")
            assert sorted(p.name for p in marks.iterdir()) == []
            wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")
            if fault == "data NIC down":  # workers 0 and 2 passed long before the end
                if real_mpi.vendor == "openmpi":  # its daemon started beside the check
                    assert seen & {"orted", "prted"}, seen
                else:  # hydra: no proxy before every check passed
                    assert not seen & {"hydra_pmi_proxy", "hydra_bstrap_proxy"}, seen

    def test_mpirun_that_exited_by_itself_first(
        self, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """mpirun (Open MPI 4, an option it does not know) exits by itself while the checks
        run, then worker-1's data check fails: 69, and the log says mpirun had exited by
        itself, with its code, instead of "no rank has started" (which only the agent's
        ending of a gated mpirun makes known)."""
        prog, marks = marker
        m = mpi("openmpi4")
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, m, FAULTS["data NIC down"], prog.parent)
            argv = [m.mpirun, "--no-such-option", str(prog)]
            launcher = job.launcher(argv, slots=1, names=W3, LD_LIBRARY_PATH="/opt/l")
            refused(c, launcher, marks)
            ended = logs.event(launcher.stderr(), "mpirun ended")
            assert ended is not None and ended["code"] not in (None, 0), ended
            reason = str(ended["reason"])
            assert "mpirun had exited by itself before" in reason, reason
            assert "no rank has started" not in reason, reason

    def test_control(self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]) -> None:
        """Every check passes: one marker per worker, exit 0; mpirun started before the
        checks had passed."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, real_mpi, Fault(), prog.parent)
            code, _, err = launch(job, prog).finish(timeout=120)
            assert code == 0, err
            hosts = sorted(p.name.split(".")[0] for p in marks.iterdir())
            # One rank each, but Intel MPI places by cores, not the hostfile's :1.
            assert len(hosts) == 3 and set(hosts) <= set(W3), hosts
            assert real_mpi.kind == "intel" or hosts == W3, hosts
            events = [e["event"] for e in logs.events(err)]
            assert events.index("mpirun start") < events.index("preflight ok")
            assert events.index("preflight ok") < events.index("checks passed")


class TestWhileGated:
    """mpirun waits at the gate for a worker still coming up; a signal there ends all."""

    def test_late_sshd_delays_the_ranks(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """worker-1's sshd stopped (SIGSTOP) for 3 s after mpirun has started: preflight waits
        for it, mpirun's ssh to it waits at the gate, then every rank runs (exit 0)."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, real_mpi, Fault(), prog.parent)
            with sshd_stopped(c.pods[2]):
                launcher = launch(job, prog)
                launcher.wait_event("mpirun start")
                holds_for(lambda: launcher.p.poll() is None, 3, "the launcher waiting")
            code, _, err = launcher.finish(timeout=120)
            assert code == 0, err
            assert len(list(marks.iterdir())) == 3
            events = [e["event"] for e in logs.events(err)]
            assert events.index("mpirun start") < events.index("preflight ok")

    def test_sigterm_while_gated(
        self, real_mpi: RealMPI, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """SIGTERM to the launcher (the pod's PID 1) while mpirun waits at worker-1's gate:
        exit 143, no rank ran, nothing of the job left on any pod."""
        prog, marks = marker
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, real_mpi, Fault(), prog.parent)
            with sshd_stopped(c.pods[2]):
                launcher = launch(job, prog)
                launcher.wait_event("mpirun start")
                launcher.signal(signal.SIGTERM)
                code, _, err = launcher.finish(timeout=60)
            assert code == 143, err
            assert list(marks.iterdir()) == []
            wait_until(lambda: not left(c), 20, lambda: f"the job's processes gone: {left(c)}")


class TestRanksWithoutTheRshAgent:
    """Runtimes that can start a rank without mpirun's ssh to its host (hydra forks the
    proxy of a host that is mpirun's own; ORTE's --novm and --max-vm-size start daemons on
    some hosts only): still no rank anywhere before every check passed, with the gate on
    where it can hold every rank and off (the checks first) where it cannot. worker-1's
    data NIC is down, so its data check fails seconds after every preflight passed."""

    @pytest.mark.parametrize(
        ("kind", "gate"),
        [("mpich", None), ("intel", None), ("openmpi4", "each"), ("openmpi5", "each")],
    )
    def test_launcher_in_the_hostfile(
        self, kind: str, gate: str | None, work: Path, marker: tuple[Path, Path]
    ) -> None:
        """`mpirun -n 1` with the launcher itself first in the hostfile (MPI Operator's
        runLauncherAsWorker): hydra forks that host's proxy without its launcher-exec, so
        its gate is off and the checks run first (through the gate, the launcher's rank
        ran at once); ORTE and PRRTE run it only once every daemon has reported, and the
        last worker's waits for every check. 69, no marker."""
        prog, marks = marker
        m = mpi(kind)
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, m, FAULTS["data NIC down"], prog.parent)
            argv = [m.mpirun, "-n", "1", str(prog)]
            names = ["job-launcher", *W3]
            launcher = job.launcher(argv, slots=1, names=names, LD_LIBRARY_PATH="/opt/l")
            refused(c, launcher, marks)
            started = logs.event(launcher.stderr(), "mpirun start")
            assert (started or {}).get("gate") == gate, started

    @pytest.mark.parametrize(
        ("flags", "names", "gate"),
        [
            (["--novm"], W3, "every"),
            (["--max-vm-size", "1"], W3, "every"),
            (["--novm"], ["job-launcher", *W3], None),
        ],
    )
    def test_orte_daemons_on_some_hosts(
        self,
        flags: list[str],
        names: list[str],
        gate: str | None,
        work: Path,
        marker: tuple[Path, Path],
    ) -> None:
        """Open MPI 4, `mpirun --novm -np 1` (or `--max-vm-size 1`) on three workers: ORTE
        starts a daemon on worker-0 only, so every gate waits for every check (worker-0's
        rank ran, and mpirun exited 0, when only worker-0's own check held its daemon);
        with the launcher first in the hostfile, ORTE starts the rank there with no daemon
        at all, and the gate is off. 69, no marker."""
        prog, marks = marker
        m = mpi("openmpi4")
        with Cluster(["job-launcher", *W3], pid1=True) as c:
            job = start(c, work, m, FAULTS["data NIC down"], prog.parent)
            argv = [m.mpirun, *flags, "-np", "1", str(prog)]
            launcher = job.launcher(argv, slots=1, names=names, LD_LIBRARY_PATH="/opt/l")
            refused(c, launcher, marks)
            started = logs.event(launcher.stderr(), "mpirun start")
            assert (started or {}).get("gate") == gate, started


class TestMarks:
    """The gate's own marks never share a name with a host's."""

    def test_hosts_named_all_and_failed(self, work: Path, marker: tuple[Path, Path]) -> None:
        """Workers whose hostnames are `all` and `failed` (the names the agent's own marks
        had): Open MPI 4's gates, one mark per worker, let both through; exit 0, a marker
        on each (the launcher exited 73, "File exists", when a host named `all` met the
        mark of every check)."""
        prog, marks = marker
        names = ["all", "failed"]
        with Cluster(["job-launcher", *names], pid1=True) as c:
            job = Job(c, work, mpi("openmpi4"))
            for w in job.start_workers():
                job.wait_ready(w)
            launcher = job.launcher([str(prog)], slots=1, names=names, LD_LIBRARY_PATH="/o")
            code, _, err = launcher.finish(timeout=120)
            assert code == 0, err
            assert logs.event(err, "mpirun start", gate="each") is not None, err
            assert sorted(p.name.split(".")[0] for p in marks.iterdir()) == names, err
