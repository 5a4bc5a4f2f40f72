"""Driving a job on the simulated cluster: workers with the `dir` exchange, the launcher,
and what its output says (tests/support/cluster.py builds the pods)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from tests.conftest import AGENT, RealMPI
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.programs import LINE

WORKERS = ["job-worker-0", "job-worker-1"]
PODS = ["job-launcher", *WORKERS]


class Job:
    """Runs workers and the launcher in a cluster with the dir exchange."""

    def __init__(self, cluster: Cluster, work: Path, m: RealMPI) -> None:
        self.c, self.work, self.m = cluster, work, m
        self.xdir = work / "exchange"
        self.xdir.mkdir(exist_ok=True)

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        return agent_env(self.work, pod, path=f"{self.m.bindir}:/usr/local/bin:/usr/bin:/bin",
                         **{"MPI_BOOTSTRAP_EXCHANGE_DIR": str(self.xdir), **extra})

    def start_workers(self, pods: list[Pod] | None = None) -> list[subprocess.Popen[str]]:
        self.workers = [self.c.start(p, [AGENT, "worker"], self.env(p))
                        for p in (pods if pods is not None else self.c.pods[1:])]
        return self.workers

    def restart_workers(self) -> None:
        """Stop the workers (if still up), clear job-done, start them again."""
        for p in self.workers:
            if p.poll() is None:
                self.c.signal(p)
            p.wait(timeout=20)
        (self.xdir / "job-done").unlink(missing_ok=True)
        self.start_workers()
        for pod in self.c.pods[1:]:  # the new records (new ports) are published
            deadline = time.monotonic() + 20
            while pod.run([AGENT, "probe"], self.env(pod)).returncode != 0:
                assert time.monotonic() < deadline, f"{pod.name} did not come back"
                time.sleep(0.1)

    def hostfile(self, slots: int = 2, names: list[str] | None = None) -> Path:
        hf = self.work / "hostfile"
        form = (lambda n: f"{n}:{slots}") if self.m.vendor in ("mpich", "intel") else (
            lambda n: f"{n} slots={slots}")
        hf.write_text("".join(form(self.c.svc(w)) + "\n" for w in (names or WORKERS)))
        return hf

    def launcher_argv(self, program: list[str]) -> list[str]:
        return [AGENT, "launcher", "--mpirun", self.m.mpirun, "--", *program]

    def launch(self, program: list[str], *, slots: int = 2, timeout: float = 180,
               **extra: str) -> subprocess.CompletedProcess[str]:
        launcher = self.c.pods[0]
        env = self.env(launcher, MPI_HOSTFILE=str(self.hostfile(slots)),
                       MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(self.work / "mpi-hostfile"), **extra)
        return launcher.run(self.launcher_argv(program), env, timeout=timeout)


def ranks(stdout: str) -> list[tuple[int, int, str, bool]]:
    return [(int(m[1]), int(m[2]), m[3], m[6] == "OK") for m in LINE.finditer(stdout)]


def check_allreduce(done: subprocess.CompletedProcess[str], size: int,
                    hosts: list[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    seen = ranks(done.stdout)
    assert sorted(r[0] for r in seen) == list(range(size)), done.stdout
    assert all(r[1] == size and r[3] for r in seen), done.stdout
    assert sorted({r[2] for r in seen}) == sorted(hosts)


def pod_processes(pod: Pod) -> list[str]:
    names = []
    for pid in pod.netns.pids():
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


