"""The chaos bench's cluster (tests/bench/chaos.py): worker pods with the agent as each
pod's PID 1 (`net` exchange, names from dnsmasq, each worker's state directory on a
tmpfs of its own), a launcher pod, the launches, and what a launch left on the pods."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import AGENT, RealMPI
from tests.support import logs
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.faults import Faults
from tests.support.job import Agent
from tests.support.programs import TICKER, compile_program
from tests.support.wait import wait_until

DEADLINE_S = 30  # MPI_DNS_WAIT_SECONDS: the launch's deadline
STATE_FS = "size=2m,mode=0700"
# What a launch may leave behind on a pod: the MPIs' daemons, ssh, the programs' ranks
# (`sh -c sleep` runs as sh, then sleep; the ticker as ticker-<mpi>).
JOB_PROCESSES = {
    "orted",
    "prted",
    "hydra_pmi_proxy",
    "hydra_bstrap_proxy",
    "ssh",
    "mpirun",
    "mpiexec",
    "mpiexec.hydra",
    "sleep",
}
BEFORE, RUNNING = "before checks", "ranks running"


class Chaos:
    def __init__(
        self,
        work: Path,
        n: int,
        m: RealMPI,
        *,
        env: dict[str, str] | None = None,
        deadline: int | None = DEADLINE_S,
    ) -> None:
        """`env`: more variables for every agent (a setting to try, say); `deadline`: the
        launch's (None: the agent's default)."""
        self.work, self.n, self.m = work, n, m
        self.extra = {"MPI_DNS_WAIT_SECONDS": str(deadline)} if deadline else {}
        self.extra.update(env or {})
        self.names = [f"w{i}" for i in range(n)]
        self.token = "tok-" + os.urandom(16).hex()
        self.c = Cluster(["launcher", *self.names], pid1=True, dns=True, private_root=True)
        self.faults = Faults(self.c)
        self.workers: dict[str, Agent] = {}
        self.ticker = compile_program(m, work, TICKER)
        self.rank_name = self.ticker.name[:15]  # as /proc/PID/comm has it

    def close(self) -> None:
        self.c.close()

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        return agent_env(
            self.work,
            pod,
            path=f"{self.m.bindir}:/usr/local/bin:/usr/bin:/bin",
            **{
                "MPI_BOOTSTRAP_EXCHANGE": "net",
                "MPI_BOOTSTRAP_TOKEN": self.token,
                **self.extra,
                **extra,
            },
        )

    def state(self, pod: Pod) -> Path:
        return self.work / pod.name / "state"

    def pod(self, name: str) -> Pod:
        return next(p for p in self.c.pods if p.name == name)

    @property
    def launcher_pod(self) -> Pod:
        return self.c.pods[0]

    # ------------------------------------------------------------ workers

    def start_worker(self, pod: Pod) -> Agent:
        state = self.state(pod)
        state.mkdir(parents=True, exist_ok=True)
        mount = f"mount -t tmpfs -o {STATE_FS} none {shlex.quote(str(state))}"
        argv = ["sh", "-c", f"{mount} && exec {shlex.quote(AGENT)} worker"]
        w = self.workers[pod.name] = Agent(self.c, pod, argv, self.env(pod))
        return w

    def ready(self, w: Agent) -> bool:
        """The worker's probe, run in its pod's namespaces (its state directory is a tmpfs
        in its own mount namespace)."""
        assert w.p.poll() is None, f"{w.pod.name} exited {w.p.returncode}: {w.stderr()[-1500:]}"
        env = [f"{k}={v}" for k, v in self.env(w.pod).items()]
        pid = str(self.c.pid_of(w.p))
        done = subprocess.run(
            ["nsenter", "-t", pid, "-m", "-n", "-u", "-p", "env", "-i", *env, AGENT, "probe"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0

    def wait_ready(self, w: Agent, timeout: float = 120) -> None:
        wait_until(lambda: self.ready(w), timeout, f"{w.pod.name} to be ready", interval=0.2)

    def start_workers(self, *, wait: bool = True) -> None:
        """Every worker pod's agent; each ready before this returns, unless not `wait`
        (the next launcher then starts with them, as a cluster starts it)."""
        for w in [self.start_worker(p) for p in self.c.pods[1:]]:
            if wait:
                self.wait_ready(w, 180)

    def restart_worker(self, name: str) -> None:
        """A worker whose pod was killed, started again (a new pod, as its StatefulSet's)."""
        self.workers[name].p.wait(timeout=30)
        self.wait_ready(self.start_worker(self.pod(name)))

    # ------------------------------------------------------------ runs

    def hostfile(self, names: list[str]) -> Path:
        hf = self.work / "hostfile"
        form = "{}:1\n" if self.m.vendor in ("mpich", "intel") else "{} slots=1\n"
        hf.write_text("".join(form.format(self.c.svc(n)) for n in names))
        return hf

    def launcher(self, names: list[str], program: list[str] | None = None) -> Agent:
        """The launcher, started; `program` (mpirun's arguments after -np N) is `sh -c
        'sleep 1'` unless given."""
        env = self.env(
            self.launcher_pod,
            MPI_HOSTFILE=str(self.hostfile(names)),
            MPI_BOOTSTRAP_REWRITE="fqdn",
            MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(self.work / "mpi-hostfile"),
        )
        run = program or ["sh", "-c", "sleep 1"]
        argv = [AGENT, "launcher", "--mpirun", self.m.mpirun, "--"]
        return Agent(
            self.c, self.launcher_pod, [*argv, "mpirun", "-np", str(len(names)), *run], env
        )

    def ticking(self, seconds: float) -> list[str]:
        return [str(self.ticker), f"{seconds:g}"]

    def clean_run(self, program: list[str] | None = None) -> tuple[int, float, str]:
        t0 = time.monotonic()
        a = self.launcher(self.names, program)
        code, _, err = a.finish(timeout=DEADLINE_S + 120)
        return code, time.monotonic() - t0, err

    # ------------------------------------------------------------ what is left

    def processes(self, pod: Pod, names: set[str]) -> list[tuple[int, str]]:
        """(PID, name) of the pod's processes whose name is in `names`."""
        found = []
        for pid in pod.netns.pids():
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm in names:
                    found.append((pid, comm))
        return found

    def left(self) -> dict[str, list[str]]:
        """The job's processes (daemons, ssh, ranks) still on each pod."""
        names = JOB_PROCESSES | {self.rank_name}
        found = {}
        for p in self.c.pods:
            job = sorted({comm for _, comm in self.processes(p, names)})
            if job:
                found[p.name] = job
        return found

    def ranks_on_workers(self) -> int:
        return sum(len(self.processes(p, {self.rank_name})) for p in self.c.pods[1:])

    def clear_leftovers(self) -> None:
        """SIGKILL, by PID, every job process still on a pod (a run that the harness gave
        up on leaves them: mpirun hung, the daemons and ranks it started)."""
        names = JOB_PROCESSES | {self.rank_name}
        for p in self.c.pods:
            for pid, _ in self.processes(p, names):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not self.left(), 15, "the job's processes to go", interval=0.2)


def moment_of(err: str, injected_at: float) -> str:
    """Whether the launcher had logged `checks passed` (or, without the gate, `child
    adopted`) when the fault came (wall-clock time)."""
    passed = logs.event(err, "checks passed", partial=True) or logs.event(
        err, "child adopted", partial=True
    )
    if passed is not None and logs.stamp(passed) <= injected_at:
        return RUNNING
    return BEFORE


def exit_code(a: Agent) -> int:
    """The launcher pod's exit code as Kubernetes reports a container's: 128+N when its
    PID 1 died of signal N. `unshare --fork` (before the pod's PID 1) dies of the same
    signal, but util-linux 2.38's cannot for SIGKILL: it exits 1, saying so."""
    code = a.p.returncode
    assert code is not None
    if code == 1 and "unshare: sigprocmask unblock failed" in a.stderr():
        return 128 + signal.SIGKILL
    return 128 - code if code < 0 else code
