"""Workers ready one after another (`scale.py --stagger S`), as pods come up in a cluster
(image pulls, node start-up) while MPI Operator starts the launcher at once.

Worker i becomes ready — its agent starts and its DNS record appears (dnsmasq, the pods'
resolv.conf with Kubernetes' search list) — i·S/N s after the job starts (worker 0 at
once, the last at (N-1)·S/N). Per round, with fresh names and a fresh exchange directory
(so that nothing of the round before is found):

- agent: the launcher, started at 0: `mpi-bootstrap launcher -- /bin/hostname`;
- bare: what a careful script does, started at 0: a DNS wait at 20 lookups/s (`getent
  hosts`, each name until it resolves, one after the other), a wait for each worker's
  record (its sshd's host key and port: the sshd is up), then mpirun with the agent's
  flags (scale.py's bare run), ssh's defaults or the `--kex` given.

Each run's `after_last_ready_s` is its end minus the last worker's readiness; `total_s`
its whole time. Where the pods' start-up outruns the machine (128 agents started over 10 s
on 2 cores), a worker's sshd is up well after its agent started: `after_last_up_s` is the
run's end minus the last worker's record (written once its sshd is up, as a readiness
probe would pass). Never asserts a time.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import logs

BARE_LOOKUPS_PER_S = 20


class Stagger:
    """One round's workers, started one after another on a thread of their own."""

    def __init__(self, scale: Any, rnd: int, spread_s: float) -> None:
        self.s, self.spread = scale, spread_s
        self.names = [f"{w}.r{rnd}.default.svc" for w in scale.workers]
        self.ready: list[float] = []  # monotonic, in order
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def hostfile(self) -> Path:
        path = self.s.work / "hostfile-stagger"
        path.write_text("".join(f"{n} slots=1\n" for n in self.names))
        return path

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def _run(self) -> None:
        s, n = self.s, len(self.names)
        dns = s.c.dnsmasq
        try:
            for i, (pod, name) in enumerate(zip(s.c.pods[1:], self.names, strict=True)):
                delay = self.t0 + i * self.spread / n - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                with open(s.work / f"{pod.name}.log", "a") as out:
                    p = subprocess.Popen(
                        pod.argv([s.agent, "worker"], s.env(pod)),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                s.c.adopt(pod, p)  # signalled as the pod's program, stopped by close()
                dns.add([(f"{name}.cluster.local", pod.address)], wait=False)
                self.ready.append(time.monotonic())
        except BaseException as exc:  # said by the round
            self.error = exc

    def last_ready(self) -> float:
        self.thread.join(timeout=self.spread + 60)
        if self.error is not None or len(self.ready) != len(self.names):
            raise RuntimeError(f"the stagger did not finish: {self.error!r}")
        return self.ready[-1]

    def after_last_up(self, end_wall: float) -> float:
        """The run's end (wall clock) minus the newest record's: the last sshd up."""
        up: float = max((self.s.xdir / f"{w}.json").stat().st_mtime for w in self.s.workers)
        return round(end_wall - up, 3)

    def end(self, timeout: float) -> None:
        """The round's workers ended: by themselves within `timeout` (a job that
        succeeded wrote job-done), else stopped."""
        self.s.end_workers(timeout)


def agent_round(s: Any, rnd: int, spread: float, **extra: str) -> dict[str, Any]:
    st = Stagger(s, rnd, spread)
    s.xdir = s.work / f"x{rnd}"
    s.xdir.mkdir(mode=0o755)
    pod = s.c.pods[0]
    env = s.env(pod, MPI_HOSTFILE=str(st.hostfile()), **extra)
    argv = [s.agent, "launcher", "--mpirun", s.mpirun, "--", "/bin/hostname"]
    t0, wall0 = time.monotonic(), time.time()
    st.start(t0)
    done = pod.run(argv, env, timeout=600)
    end, end_wall = time.monotonic(), time.time()
    last = st.last_ready()
    up = st.after_last_up(end_wall)
    st.end(60)
    ev = {e["event"]: e for e in logs.events(done.stderr, partial=True)}
    phases = {
        k: round(logs.stamp(ev[k]) - wall0, 3)
        for k in ("mpirun start", "preflight ok", "checks passed", "child adopted")
        if k in ev
    }
    return {
        "total_s": round(end - t0, 3),
        "after_last_ready_s": round(end - last, 3),
        "after_last_up_s": up,
        "last_ready_s": round(last - t0, 3),
        "exit_code": done.returncode,
        "all_hosts_ran": sorted(set(done.stdout.split())) == sorted(s.workers),
        "phases_s": phases,
        "pipelined": bool(ev.get("mpirun start", {}).get("pipelined")),
        "stderr_tail": done.stderr[-800:] if done.returncode else "",
    }


def bare_round(s: Any, rnd: int, spread: float, argv: list[str], kex: str) -> dict[str, Any]:
    st = Stagger(s, rnd, spread)
    s.xdir = s.work / f"x{rnd}"
    s.xdir.mkdir(mode=0o755)
    pod = s.c.pods[0]
    wait = (
        f"for h in {' '.join(st.names)}; do "
        f"until getent hosts $h >/dev/null; do sleep {1 / BARE_LOOKUPS_PER_S}; done; done; "
        f"for w in {' '.join(s.workers)}; do "
        f"until [ -s {s.xdir}/$w.json ]; do sleep 0.05; done; done"
    )
    t0 = time.monotonic()
    st.start(t0)
    waited = pod.run(["sh", "-c", wait], s.env(pod), timeout=600)
    s.hostfile = st.hostfile()
    result = s.bare(argv, kex=kex, names=dict(zip(s.workers, st.names, strict=True)))
    end, end_wall = time.monotonic(), time.time()
    last = st.last_ready()
    up = st.after_last_up(end_wall)
    st.end(0.1)  # no job-done after a bare run: stopped
    return {
        **result,
        "total_s": round(end - t0, 3),
        "after_last_ready_s": round(end - last, 3),
        "after_last_up_s": up,
        "last_ready_s": round(last - t0, 3),
        "waited_exit": waited.returncode,
        "kex": kex or "ssh default",
    }


def rounds(s: Any, runs: int, spread: float, argv: list[str], kex: str) -> dict[str, Any]:
    """`runs` rounds of the agent, of the bare run with ssh's defaults and (`kex`) with
    the agent's key exchange, alternating."""
    out: dict[str, Any] = {"agent": [], "bare": [], "bare_kex": []}
    for r in range(runs):
        base = 3 * r
        out["bare"].append(bare_round(s, base, spread, argv, ""))
        out["agent"].append(agent_round(s, base + 1, spread))
        if kex:
            out["bare_kex"].append(bare_round(s, base + 2, spread, argv, kex))
        print(
            json.dumps(
                {
                    k: (v[-1]["after_last_ready_s"], v[-1]["after_last_up_s"])
                    for k, v in out.items()
                    if v
                }
            )
        )
    return out
