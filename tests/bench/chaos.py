"""Chaos: one fault at a random moment of each launch, on many worker pods.

    make chaos CHAOS_RUNS=50 [SEED=N]      (or: python tests/bench/chaos.py --runs 50)

64 worker pods (netns, the agent as each pod's PID 1, the `net` exchange, names from
dnsmasq as in Kubernetes, each worker's state directory on a tmpfs of its own) and a
launcher pod. Each run starts a launcher (`mpirun -np N sh -c 'sleep 1'`) and, after a
delay drawn from the seeded generator (uniform over a clean launch's length), injects
one fault into one worker drawn the same way (or the launcher):

    kill9-pid1   kill -9 the worker pod's PID 1 (the pod is gone)
    kill-sshd    kill -9 the worker's sshd (its supervisor restarts it)
    eth0-down    the worker's eth0 down
    dns-removed  the worker's DNS record removed
    sigstop-20s  every process of the worker's pod stopped for 20 s, then continued
    fill-state   the worker's state directory's filesystem filled
    net1-down    the worker's net1 (data NIC) down
    sigterm      SIGTERM to the launcher

The moment is read back from the launcher's log: `before checks` (it had not yet logged
`checks passed`) or `ranks running` (it had). Each run must end with an exit code of the
docs/benchmarks.md's table for that fault and moment (OUTCOMES below), within the deadline + 10 s,
its message naming the pod at fault (not for sigterm), with no process of the job left
on any pod; then the fault is undone (the pod restarted, the link up, the record back,
the filesystem emptied) and a clean run must succeed. The seed is printed: `--seed N
--runs 1 --skip K` replays run K+1. Never asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import AGENT
from tests.support import logs
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.dnsmasq import READY_NAME, write_hosts_file
from tests.support.job import Agent, pod_processes, sshd_of
from tests.support.wait import wait_until

FAULTS = (
    "kill9-pid1",
    "kill-sshd",
    "eth0-down",
    "dns-removed",
    "sigstop-20s",
    "fill-state",
    "net1-down",
    "sigterm",
)
BEFORE, RUNNING = "before checks", "ranks running"
# docs/benchmarks.md's table: the exit codes each fault may end a launch with, by moment. 69:
# a check failed (no rank started); 68: a name did not resolve by the deadline; 143:
# SIGTERM; 0: the fault did not touch the launch (it came after its part, or the agent
# got past it: sshd restarted before preflight's retry); mpirun's own non-zero code
# (`N`) when a rank or daemon was lost while ranks ran — or 0 when the fault came after
# that worker's ranks had ended and its daemon had reported (`ranks running` is every
# moment after `checks passed`, the job's last instants included: seed 383140092's run 40
# took eth0 down 10 ms before mpirun exited 0).
N = "N"
OUTCOMES: dict[tuple[str, str], set[int | str]] = {
    ("kill9-pid1", BEFORE): {69},
    ("kill9-pid1", RUNNING): {0, N},
    ("kill-sshd", BEFORE): {0, 69},
    ("kill-sshd", RUNNING): {0},
    ("eth0-down", BEFORE): {69, 68},
    ("eth0-down", RUNNING): {0, N},
    ("dns-removed", BEFORE): {0, 68},
    ("dns-removed", RUNNING): {0},
    ("sigstop-20s", BEFORE): {0, 69},
    ("sigstop-20s", RUNNING): {0, N},
    ("fill-state", BEFORE): {0},
    ("fill-state", RUNNING): {0},
    ("net1-down", BEFORE): {0, 69},
    ("net1-down", RUNNING): {0},
    ("sigterm", BEFORE): {143},
    ("sigterm", RUNNING): {143},
}
JOB_PROCESSES = {"orted", "ssh", "mpirun", "sleep", "sh -c sleep"}
DEADLINE_S = 30  # MPI_DNS_WAIT_SECONDS: the launch's deadline
STATE_FS = "size=2m,mode=0700"


def allowed(fault: str, moment: str, code: int) -> bool:
    ok = OUTCOMES[(fault, moment)]
    return code in ok or (N in ok and code not in (0, 68, 69, 143))


class Chaos:
    def __init__(self, work: Path, n: int) -> None:
        self.work, self.n = work, n
        self.names = [f"w{i}" for i in range(n)]
        self.token = "tok-" + os.urandom(16).hex()
        self.c = Cluster(["launcher", *self.names], pid1=True, dns=True, private_root=True)
        self.workers: dict[str, Agent] = {}
        self.removed: set[str] = set()

    def close(self) -> None:
        self.c.close()

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        return agent_env(
            self.work,
            pod,
            MPI_BOOTSTRAP_EXCHANGE="net",
            MPI_BOOTSTRAP_TOKEN=self.token,
            MPI_DNS_WAIT_SECONDS=str(DEADLINE_S),
            **extra,
        )

    def state(self, pod: Pod) -> Path:
        return self.work / pod.name / "state"

    def pod(self, name: str) -> Pod:
        return next(p for p in self.c.pods if p.name == name)

    # ------------------------------------------------------------ workers

    def start_worker(self, pod: Pod) -> Agent:
        state = self.state(pod)
        env = self.env(pod)
        state.mkdir(parents=True, exist_ok=True)
        mount = f"mount -t tmpfs -o {STATE_FS} none {shlex.quote(str(state))}"
        argv = ["sh", "-c", f"{mount} && exec {shlex.quote(AGENT)} worker"]
        w = self.workers[pod.name] = Agent(self.c, pod, argv, env)
        return w

    def ready(self, w: Agent) -> bool:
        """The worker's probe, run in its pod's namespaces (its state directory is a tmpfs
        in its own mount namespace)."""
        assert w.p.poll() is None, f"{w.pod.name} exited {w.p.returncode}: {w.stderr()[-1500:]}"
        env = [f"{k}={v}" for k, v in self.env(w.pod).items()]
        done = subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.c.pid_of(w.p)),
                "-m",
                "-n",
                "-u",
                "-p",
                "env",
                "-i",
                *env,
                AGENT,
                "probe",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0

    def start_workers(self) -> None:
        started = [self.start_worker(p) for p in self.c.pods[1:]]
        for w in started:
            wait_until(lambda w=w: self.ready(w), 180, f"{w.pod.name} to be ready", interval=0.2)

    # ------------------------------------------------------------ runs

    def hostfile(self, names: list[str]) -> Path:
        hf = self.work / "hostfile"
        hf.write_text("".join(f"{self.c.svc(n)} slots=1\n" for n in names))
        return hf

    def launcher(self, names: list[str]) -> Agent:
        pod = self.c.pods[0]
        env = self.env(
            pod,
            MPI_HOSTFILE=str(self.hostfile(names)),
            MPI_BOOTSTRAP_REWRITE="fqdn",
            MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(self.work / "mpi-hostfile"),
        )
        return Agent(
            self.c,
            pod,
            [AGENT, "launcher", "--", "mpirun", "-np", str(len(names)), "sh", "-c", "sleep 1"],
            env,
        )

    def clean_run(self, names: list[str]) -> tuple[int, float, str]:
        t0 = time.monotonic()
        a = self.launcher(names)
        code, _, err = a.finish(timeout=DEADLINE_S + 120)
        return code, time.monotonic() - t0, err

    def inject(self, fault: str, target: str, launcher: Agent) -> None:  # noqa: C901
        pod = self.pod(target)
        w = self.workers.get(target)
        if fault == "kill9-pid1":
            assert w is not None
            os.kill(self.c.pid_of(w.p), signal.SIGKILL)
        elif fault == "kill-sshd":
            with contextlib.suppress(AssertionError, ProcessLookupError):
                os.kill(sshd_of(pod), signal.SIGKILL)
        elif fault in ("eth0-down", "net1-down"):
            pod.netns.exec_checked(["ip", "link", "set", fault[:4], "down"])
        elif fault == "dns-removed":
            self.set_records(removed={target})
        elif fault == "sigstop-20s":
            pids = pod.netns.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)

            def cont() -> None:
                time.sleep(20)
                for pid in pod.netns.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

            threading.Thread(target=cont, daemon=True).start()
        elif fault == "fill-state":
            assert w is not None
            pid = self.c.pid_of(w.p)
            subprocess.run(
                [
                    "nsenter",
                    "-t",
                    str(pid),
                    "-m",
                    "sh",
                    "-c",
                    f"cat /dev/zero > {shlex.quote(str(self.state(pod)))}/fill",
                ],
                capture_output=True,
                timeout=30,
                check=False,
            )
        elif fault == "sigterm":
            launcher.signal(signal.SIGTERM)

    def undo(self, fault: str, target: str) -> None:
        pod = self.pod(target)
        if fault == "kill9-pid1":
            w = self.workers[target]
            w.p.wait(timeout=30)
            w = self.start_worker(pod)
            wait_until(lambda: self.ready(w), 120, f"{target} to be ready again", interval=0.2)
        elif fault in ("eth0-down", "net1-down"):
            pod.netns.exec_checked(["ip", "link", "set", fault[:4], "up"])
        elif fault == "dns-removed":
            self.set_records(removed=set())
        elif fault == "sigstop-20s":
            time.sleep(21)
            for pid in pod.netns.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        elif fault == "fill-state":
            w = self.workers[target]
            subprocess.run(
                [
                    "nsenter",
                    "-t",
                    str(self.c.pid_of(w.p)),
                    "-m",
                    "rm",
                    "-f",
                    str(self.state(pod) / "fill"),
                ],
                timeout=30,
                check=False,
            )
        if fault != "sigterm":
            w = self.workers[target]
            wait_until(lambda: self.ready(w), 120, f"{target} to be ready again", interval=0.2)

    def set_records(self, removed: set[str]) -> None:
        """The cluster's DNS records, but those of `removed` (dnsmasq re-reads on SIGHUP)."""
        d = self.c.dnsmasq
        assert d is not None
        for f in os.listdir(d.hostsdir):
            os.unlink(os.path.join(d.hostsdir, f))
        pods = [p for p in self.c.pods if p.name not in removed]
        pairs = [(self.c.fqdn(p.name), p.address) for p in pods]
        pairs += [(self.c.service, p.address) for p in pods if p is not self.c.pods[0]]
        write_hosts_file(d.hostsdir, "records-chaos", [*pairs, (READY_NAME, "127.0.0.1")])
        os.kill(d.pid, signal.SIGHUP)
        time.sleep(0.2)

    def left(self) -> dict[str, list[str]]:
        found = {}
        for p in self.c.pods:
            job = sorted(set(pod_processes(p)) & JOB_PROCESSES)
            if job:
                found[p.name] = job
        return found


def moment_of(err: str, injected_at: float) -> str:
    """Whether the launcher had logged `checks passed` (or, without the gate, `mpirun
    start` after the checks) when the fault came (wall-clock time)."""
    passed = logs.event(err, "checks passed", partial=True) or logs.event(
        err, "child adopted", partial=True
    )
    if passed is not None and logs.stamp(passed) <= injected_at:
        return RUNNING
    return BEFORE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--skip", type=int, default=0, help="draw and skip this many runs first")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mpib-chaos-", dir="/run") as d:
        t0 = time.monotonic()
        ch = Chaos(Path(d), args.workers)
        try:
            ch.start_workers()
            print(f"{args.workers} workers ready in {time.monotonic() - t0:.1f} s", flush=True)
            code, clean_s, err = ch.clean_run(ch.names)
            if code != 0:
                raise SystemExit(f"the first clean run exited {code}: {err[-3000:]}")
            print(f"clean run: {clean_s:.2f} s", flush=True)
            for i in range(args.skip + args.runs):
                fault = rng.choice(FAULTS)
                target = rng.choice(ch.names)
                delay = rng.uniform(0, clean_s)
                if i < args.skip:
                    continue
                results.append(one_run(ch, i + 1, fault, target, delay))
                print(json.dumps(results[-1]), flush=True)
        finally:
            ch.close()
    bad = [r for r in results if r["problems"]]
    table: dict[tuple[str, str], list[int]] = {}
    for r in results:
        table.setdefault((r["fault"], r["moment"]), []).append(r["code"])
    print(f"\nseed {seed}: {len(results)} runs, {len(bad)} not as documented")
    print("| fault | moment | runs | exit codes seen | documented |")
    print("|---|---|---|---|---|")
    for (fault, moment), codes in sorted(table.items()):
        doc = ", ".join(str(c) for c in sorted(OUTCOMES[(fault, moment)], key=str))
        seen = ", ".join(f"{c}×{codes.count(c)}" for c in sorted(set(codes)))
        print(f"| {fault} | {moment} | {len(codes)} | {seen} | {doc} |")
    for r in bad:
        print(
            f"run {r['run']} ({r['fault']} on {r['target']} at {r['delay_s']} s): "
            f"{'; '.join(r['problems'])}"
        )
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "runs": results}, indent=1))
    return 0


def one_run(ch: Chaos, run: int, fault: str, target: str, delay: float) -> dict[str, Any]:
    names = ch.names
    a = ch.launcher(names)
    t0 = time.monotonic()
    time.sleep(delay)
    at = time.time()
    ch.inject(fault, target, a)
    problems = []
    try:
        code = a.p.wait(timeout=DEADLINE_S + 10 + max(0.0, delay))
    except subprocess.TimeoutExpired:
        problems.append(f"still running {DEADLINE_S + 10} s after the fault")
        a.signal(signal.SIGKILL)
        code = a.p.wait(timeout=30)
    seconds = time.monotonic() - t0
    _, _, err = a.finish(timeout=30)
    moment = moment_of(err, at)
    if not allowed(fault, moment, code):
        problems.append(f"exit {code}, documented {OUTCOMES[(fault, moment)]}")
    text = err + a.stdout()
    if code != 0 and fault != "sigterm" and target not in text:
        problems.append(f"{target} not named")
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not ch.left(), 15, "the job's processes to go", interval=0.2)
    if ch.left():
        problems.append(f"left: {ch.left()}")
    ch.undo(fault, target)
    again, again_s, again_err = ch.clean_run(names)
    if again != 0:
        problems.append(f"the next clean run exited {again}: {again_err[-1500:]}")
    return {
        "run": run,
        "fault": fault,
        "target": target,
        "delay_s": round(delay, 2),
        "moment": moment,
        "code": code,
        "seconds": round(seconds, 2),
        "next_clean_s": round(again_s, 2),
        "problems": problems,
        "tail": "" if not problems else err[-1500:],
    }


if __name__ == "__main__":
    sys.exit(main())
