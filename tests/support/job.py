"""Driving a job on the simulated cluster: workers with the `dir` exchange, the launcher,
and what its output says (tests/support/cluster.py builds the pods). The one job driver of
the tests, the demo (tests/demo.py) and the benchmarks that run it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, ClassVar

from tests.conftest import AGENT, RealMPI
from tests.conftest import Pod as OnePod
from tests.support import logs
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.programs import LINE
from tests.support.wait import wait_until
from tests.support.workers import PODS, WORKERS, wait_ready

__all__ = [
    "PODS",
    "WORKERS",
    "Agent",
    "Job",
    "check_allreduce",
    "pod_processes",
    "ranks",
    "sshd_of",
]


class Agent:
    """A program running in a pod (the agent, as a rule) whose output, and so its JSON log
    on stderr, is collected as it comes: its events can be awaited while it runs. A test
    that fails prints every one it started, whole (conftest.py `pytest_runtest_makereport`)."""

    started: ClassVar[list[Agent]] = []  # this test's, in order (emptied for each test)

    def __init__(
        self, cluster: Cluster, pod: Pod, argv: Sequence[str], env: dict[str, str]
    ) -> None:
        self.c, self.pod, self.argv = cluster, pod, list(argv)
        self.p = cluster.start(pod, argv, env)
        self.out: list[str] = []
        self.lines: list[str] = []  # stderr
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.p.stdout, self.out), (self.p.stderr, self.lines))
        ]
        for t in self._readers:
            t.start()
        Agent.started.append(self)

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)

    def stdout(self) -> str:
        """Its stdout so far."""
        return "".join(self.out)

    def stderr(self) -> str:
        """Its stderr so far."""
        return "".join(self.lines)

    def events(self) -> list[logs.Event]:
        """Its log events so far (the last line may still be cut off)."""
        return logs.events(self.stderr(), partial=True)

    def wait_event(self, name: str, timeout: float = 30, **match: object) -> None:
        """Until it has logged `name` with fields `match`; fails at once if it exits."""

        def logged() -> bool:
            if logs.event(self.stderr(), name, partial=True, **match) is not None:
                return True
            assert self.p.poll() is None, f"exited {self.p.returncode}: {self.stderr()}"
            return False

        wait_until(logged, timeout, lambda: f"a {name!r} event: {self.stderr()}")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Signal the program itself (also as PID 1 of its pod)."""
        self.c.signal(self.p, signum)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """(exit code, stdout, stderr), once it has ended (within `timeout` seconds; else
        a failure that shows what it said)."""
        try:
            code = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:g} s: {self.stderr()}") from None
        for t in self._readers:  # the rest of what it wrote, up to the end of its pipes
            t.join(timeout=5)
        return code, self.stdout(), self.stderr()


class Job:
    """Runs workers and the launcher of one job in a cluster with the dir exchange and the
    MPI `m`. The hostfile names pods as MPI Operator does (`<pod>.<job>.<ns>.svc`) where
    the cluster has DNS, and by the short names its hosts files know where it has none."""

    def __init__(
        self, cluster: Cluster, work: Path, m: RealMPI, *, output: Path | None = None
    ) -> None:
        self.c, self.work, self.m = cluster, work, m
        self.xdir = work / "exchange"
        self.xdir.mkdir(exist_ok=True)
        self.output = output or work / "mpi-hostfile"  # the hostfile the launcher writes
        self.workers: list[Agent] = []

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        return agent_env(
            self.work,
            pod,
            path=f"{self.m.bindir}:/usr/local/bin:/usr/bin:/bin",
            **{"MPI_BOOTSTRAP_EXCHANGE_DIR": str(self.xdir), **extra},
        )

    def state(self, name: str) -> Path:
        """The state directory of the agent in the pod `name`."""
        return self.work / name / "state"

    def start_workers(
        self, pods: list[Pod] | None = None, *, published: bool = False
    ) -> list[Agent]:
        """A worker in each of `pods` (every pod but the launcher's); with `published`,
        one after the other, each started once the one before has published its record."""
        started = []
        for pod in pods if pods is not None else self.c.pods[1:]:
            w = Agent(self.c, pod, [AGENT, "worker"], self.env(pod))
            if published:
                w.wait_event("record published", timeout=30)
            started.append(w)
        self.workers += started
        return started

    def wait_ready(self, worker: Agent, timeout: float = 20, **extra: str) -> None:
        """Until the worker's probe passes (its sshd serves, its record is published);
        `extra`: the worker's settings beside the job's (another exchange)."""
        env = self.env(worker.pod, **extra)
        wait_ready(worker.pod, env, worker.p, timeout, log=worker.stderr)

    def restart_workers(self) -> None:
        """Stop the workers (if still up), clear job-done, start them again."""
        for w in self.workers:
            if w.p.poll() is None:
                w.signal()
            w.p.wait(timeout=20)
        self.workers = []
        (self.xdir / "job-done").unlink(missing_ok=True)
        for w in self.start_workers():  # the new records (new ports) are published
            self.wait_ready(w)

    def hostfile(self, slots: int = 2, names: list[str] | None = None) -> Path:
        hf = self.work / "hostfile"
        form = (
            (lambda n: f"{n}:{slots}")
            if self.m.vendor in ("mpich", "intel")
            else (lambda n: f"{n} slots={slots}")
        )
        name = self.c.svc if self.c.dnsmasq is not None else str
        hf.write_text("".join(form(name(w)) + "\n" for w in (names or WORKERS)))
        return hf

    def launcher_argv(self, program: list[str]) -> list[str]:
        return [AGENT, "launcher", "--mpirun", self.m.mpirun, "--", *program]

    def launcher_env(
        self, *, slots: int = 2, names: list[str] | None = None, **extra: str
    ) -> dict[str, str]:
        """The launcher's environment: the hostfile written, the output hostfile set;
        `extra` adds to or overrides it."""
        return self.env(
            self.c.pods[0],
            **{
                "MPI_HOSTFILE": str(self.hostfile(slots, names)),
                "MPI_BOOTSTRAP_OUTPUT_HOSTFILE": str(self.output),
                **extra,
            },
        )

    def launcher(
        self, program: list[str], *, slots: int = 2, names: list[str] | None = None, **extra: str
    ) -> Agent:
        """The launcher, started: its log can be awaited while it runs."""
        return Agent(
            self.c,
            self.c.pods[0],
            self.launcher_argv(program),
            self.launcher_env(slots=slots, names=names, **extra),
        )

    def launch(
        self,
        program: list[str],
        *,
        slots: int = 2,
        names: list[str] | None = None,
        timeout: float = 180,
        **extra: str,
    ) -> subprocess.CompletedProcess[str]:
        """The launcher, run to its end."""
        return self.c.pods[0].run(
            self.launcher_argv(program),
            self.launcher_env(slots=slots, names=names, **extra),
            timeout=timeout,
        )


def ranks(stdout: str) -> list[tuple[int, int, str, bool]]:
    return [(int(m[1]), int(m[2]), m[3], m[6] == "OK") for m in LINE.finditer(stdout)]


def check_allreduce(done: subprocess.CompletedProcess[str], size: int, hosts: list[str]) -> None:
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


def sshd_of(pod: Pod | OnePod) -> int:
    """The PID of the worker's sshd (its listener) in `pod` (a cluster's, or the one-pod
    fixture's)."""
    for pid in pod.netns.pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                return pid
    raise AssertionError(f"no sshd in {getattr(pod, 'name', pod.netns.name)}")
