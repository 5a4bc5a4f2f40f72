"""Many launches against the same worker pods: the soak (tests/bench/soak.py, `make soak`;
tests/test_soak.py runs 20 of them), what each run should end with, and what the pods
hold after it (the series that must stay flat).

A run is a new launcher process in the same launcher pod and state directory, as a
restarted container is (`restartPolicy: OnFailure`). Runs cycle through four kinds:

    success        every rank runs /bin/hostname                   → 0
    rank exits 3   every rank exits 3                              → 3 (mpirun's code)
    check fails    the program is missing on the first worker      → 69, no rank started
    SIGTERM        the launcher is sent SIGTERM while ranks sleep  → 143

With the `dir` exchange a success writes job-done, on which the workers end: they are
started again (a new job on the same pods), as the next job's pods would be.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shlex
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from tests.conftest import AGENT
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.job import Agent, pod_processes
from tests.support.wait import wait_until

KINDS = ("success", "rank exits 3", "check fails", "SIGTERM")
EXPECTED = {"success": 0, "rank exits 3": 3, "check fails": 69, "SIGTERM": 143}
MPIRUN = "/usr/bin/mpirun"  # Debian's Open MPI 4.1
PATH = "/usr/local/bin:/usr/bin:/bin"
# What a launch may leave behind on a pod: the MPIs' daemons, ssh, the data check's port.
JOB_PROCESSES = {"orted", "prted", "hydra_pmi_proxy", "ssh", "mpirun", "sleep", "hostname"}


def kind_of(run: int) -> str:
    """The kind of run number `run` (from 1)."""
    return KINDS[(run - 1) % len(KINDS)]


@dataclasses.dataclass
class Outcome:
    run: int
    kind: str
    code: int
    seconds: float
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.code == EXPECTED[self.kind]


class Soak:
    """`n` worker pods (PID 1 agents) and a launcher pod, one exchange, run after run."""

    def __init__(
        self,
        work: Path,
        n: int,
        exchange: str,
        worker_env: dict[str, str] | None = None,
        bindir: str | None = None,
    ) -> None:
        self.work, self.n, self.exchange = work, n, exchange
        self.worker_env = worker_env or {}  # beside the job's, in the worker pods
        # Another MPI's bin directory (RealMPI.bindir), first on every pod's PATH.
        self.mpirun = f"{bindir}/mpirun" if bindir else MPIRUN
        self.path = f"{bindir}:{PATH}" if bindir else PATH
        self.names = [f"w{i}" for i in range(n)]
        self.xdir = work / "exchange"
        self.xdir.mkdir(exist_ok=True)
        self.token = "tok-" + secrets.token_hex(16)
        # The program every rank runs; hidden (an empty tmpfs over its directory) in the
        # first worker's pod for "check fails".
        self.progs = work / "programs"
        self.progs.mkdir(exist_ok=True)
        self.hidden = self.progs / "hidden"
        self.hidden.mkdir(exist_ok=True)
        for prog in (self.hidden / "hostname", self.progs / "ok"):
            prog.write_text("#!/bin/sh\nexec /bin/hostname\n")
            prog.chmod(0o755)
        self.hostfile = work / "hostfile"
        self.hostfile.write_text("".join(f"{w} slots=1\n" for w in self.names))
        self.c = Cluster(["launcher", *self.names], pid1=True, private_root=True)
        self.workers: dict[str, Agent] = {}
        self.samples: list[dict[str, Any]] = []
        self.files: list[dict[str, set[str]]] = []  # each worker's state files, by sample

    def close(self) -> None:
        self.c.close()

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        mode = (
            {"MPI_BOOTSTRAP_EXCHANGE_DIR": str(self.xdir)}
            if self.exchange == "dir"
            else {"MPI_BOOTSTRAP_EXCHANGE": "net", "MPI_BOOTSTRAP_TOKEN": self.token}
        )
        own = self.worker_env if pod.name != "launcher" else {}
        return agent_env(self.work, pod, path=self.path, **mode, **own, **extra)

    def state(self, pod: Pod) -> Path:
        return self.work / pod.name / "state"

    # ------------------------------------------------------------ workers

    def start_workers(self, timeout: float = 120, *, wait: bool = True) -> None:
        """Every worker that is not running, started; until each is ready, unless not
        `wait` (the next launcher then starts with them, as a cluster starts it)."""
        (self.xdir / "job-done").unlink(missing_ok=True)
        started = []
        for pod in self.c.pods[1:]:
            w = self.workers.get(pod.name)
            if w is not None and w.p.poll() is None:
                continue
            hide = (
                f"mount -t tmpfs none {shlex.quote(str(self.hidden))} && "
                if pod.name == self.names[0]
                else ""
            )
            argv = ["sh", "-c", f"{hide}exec {shlex.quote(AGENT)} worker"]
            self.workers[pod.name] = w = Agent(self.c, pod, argv, self.env(pod))
            started.append(w)
        for w in started if wait else ():
            wait_until(
                lambda w=w: _probe(w, self.env(w.pod)),
                timeout,
                lambda w=w: f"{w.pod.name} to be ready: {w.stderr()[-2000:]}",
                interval=0.1,
            )

    def wait_workers_gone(self, timeout: float = 30) -> None:
        """After a dir success: every worker ends on job-done."""
        for w in self.workers.values():
            w.p.wait(timeout=timeout)

    # ------------------------------------------------------------ runs

    def program(self, kind: str) -> list[str]:
        return {
            "success": ["mpirun", "-np", str(self.n), str(self.progs / "ok")],
            "rank exits 3": ["mpirun", "-np", str(self.n), "sh", "-c", "exit 3"],
            "check fails": ["mpirun", "-np", str(self.n), str(self.hidden / "hostname")],
            "SIGTERM": ["mpirun", "-np", str(self.n), "sleep", "60"],
        }[kind]

    def launch(self, run: int, *, timeout: float = 120, **extra: str) -> Outcome:
        kind = kind_of(run)
        pod = self.c.pods[0]
        env = self.env(
            pod,
            MPI_HOSTFILE=str(self.hostfile),
            MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(self.work / "mpi-hostfile"),
            **extra,
        )
        t0 = time.monotonic()
        a = Agent(
            self.c,
            pod,
            [AGENT, "launcher", "--mpirun", self.mpirun, "--", *self.program(kind)],
            env,
        )
        if kind == "SIGTERM":
            wait_until(
                lambda: self.ranks_running("sleep") or a.p.poll() is not None,
                timeout,
                lambda: f"the ranks to start: {a.stderr()[-2000:]}",
                interval=0.05,
            )
            a.signal(signal.SIGTERM)
        code, _, err = a.finish(timeout=timeout)
        seconds = time.monotonic() - t0
        out = Outcome(run, kind, code, round(seconds, 3))
        if not out.ok:
            out.stderr_tail = err[-3000:]
        if self.exchange == "dir" and kind == "success" and code == 0:
            self.wait_workers_gone()
            self.start_workers()
        return out

    def ranks_running(self, comm: str) -> bool:
        return all(comm in pod_processes(p) for p in self.c.pods[1:])

    # ------------------------------------------------------------ what the pods hold

    def sample(self, run: int) -> dict[str, Any]:
        """Per worker pod and for the launcher's pod, after run `run` has ended."""
        wait_until(
            lambda: not self.job_left(),
            10,
            lambda: f"job processes: {self.job_left()}",
            interval=0.1,
        )
        per = [self.worker_sample(p) for p in self.c.pods[1:]]
        launcher = self.c.pods[0]
        lstate = self.state(launcher)
        out = {
            "run": run,
            "pss_kib": _spread([w["pss_kib"] for w in per]),
            "uss_kib": _spread([w["uss_kib"] for w in per]),
            "fds": _spread([w["fds"] for w in per]),
            "processes": _spread([w["processes"] for w in per]),
            "sshd_children": _spread([w["sshd_children"] for w in per]),
            "authorized_keys_lines": _spread([w["authorized_keys_lines"] for w in per]),
            "state_files": _spread([w["state_files"] for w in per]),
            "exchange_files": _count(self.xdir) if self.exchange == "dir" else 0,
            "launcher_state_files": _count(lstate),
            "launcher_sockets": _count(lstate / "cm"),
            "launcher_processes": len(launcher.netns.pids()),
            "job_processes_left": sum(len(v) for v in self.job_left().values()),
        }
        self.samples.append(out)
        self.files.append({p.name: _names(self.state(p)) for p in self.c.pods[1:]})
        return out

    def new_files(self) -> dict[str, list[str]]:
        """The files of each worker's state directory at the last sample that were not
        there at the first: what a growing `state_files` is."""
        first, last = self.files[0], self.files[-1]
        return {pod: sorted(last[pod] - first.get(pod, set())) for pod in last}

    def job_left(self) -> dict[str, list[str]]:
        found = {p.name: sorted(set(pod_processes(p)) & JOB_PROCESSES) for p in self.c.pods}
        return {name: procs for name, procs in found.items() if procs}

    def worker_sample(self, pod: Pod) -> dict[str, int]:
        pids = pod.netns.pids()
        pss = uss = fds = 0
        sshd = []
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm in ("sshd", "python3", "python", "mpi-bootstrap"):
                    pss += _rollup(pid, "Pss")
                    uss += _rollup(pid, "Private_Clean", "Private_Dirty")
                fds += len(os.listdir(f"/proc/{pid}/fd"))
                if comm == "sshd":
                    sshd.append(pid)
        listener = min(sshd) if sshd else None
        children = sum(1 for pid in pids if listener is not None and _ppid(pid) == listener)
        state = self.state(pod)
        keys = state / "authorized_keys"
        lines = len(keys.read_text().splitlines()) if keys.exists() else 0
        return {
            "pss_kib": pss,
            "uss_kib": uss,
            "fds": fds,
            "processes": len(pids),
            "sshd_children": children,
            "authorized_keys_lines": lines,
            "state_files": _count(state),
        }


def flat(samples: list[dict[str, Any]], *, uss_slack_kib: int = 1024) -> list[str]:
    """What grew between the first sample and the last (every series but memory exactly;
    USS, the pods' own pages, by at most `uss_slack_kib` per pod); empty when all is flat.
    PSS is reported, not judged: it rises when other processes that shared its pages end
    (another test's pods on the same machine: +1,064 KiB once in CI, nothing leaked)."""
    if len(samples) < 2:
        return []
    first, last = samples[0], samples[-1]
    grew = []
    for key, value in last.items():
        if key in ("run", "pss_kib"):
            continue
        a = first[key]["max"] if isinstance(first[key], dict) else first[key]
        b = value["max"] if isinstance(value, dict) else value
        slack = uss_slack_kib if key == "uss_kib" else 0
        if b > a + slack:
            grew.append(f"{key}: {a} after run {first['run']}, {b} after run {last['run']}")
    return grew


def _probe(w: Agent, env: dict[str, str]) -> bool:
    assert w.p.poll() is None, f"{w.pod.name} exited {w.p.returncode}: {w.stderr()[-2000:]}"
    return w.pod.run([AGENT, "probe"], env, timeout=30).returncode == 0


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _rollup(pid: int, *keys: str) -> int:
    """KiB of smaps_rollup's `keys` added up (Pss; Private_Clean and Private_Dirty: USS)."""
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return sum(int(ln.split()[1]) for ln in lines if ln.split(":", 1)[0] in keys)


def _names(root: Path) -> set[str]:
    return {str(Path(d, f).relative_to(root)) for d, _, files in os.walk(root) for f in files}


def _count(root: Path) -> int:
    """Files (and sockets, FIFOs) under `root`, directories not counted."""
    if not root.exists():
        return 0
    return sum(len(files) for _, _, files in os.walk(root))


def _spread(values: list[int]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values)}


def run_soak(
    soak: Soak, runs: int, every: int, say: Any = print, *, together: bool = False
) -> list[Outcome]:
    """`runs` launches, sampled after every `every` runs (and after the first); with
    `together`, the first launcher starts with the workers, as a cluster starts it."""
    soak.start_workers(wait=not together)
    outcomes = []
    for run in range(1, runs + 1):
        out = soak.launch(run)
        outcomes.append(out)
        if not out.ok:
            say(
                f"run {run} ({out.kind}): exit {out.code}, expected {EXPECTED[out.kind]}\n"
                f"{out.stderr_tail}"
            )
        if run % every == 0:
            s = soak.sample(run)
            say(
                f"after run {run}: "
                + ", ".join(
                    f"{k}={v['max'] if isinstance(v, dict) else v}"
                    for k, v in s.items()
                    if k != "run"
                )
            )
    return outcomes
