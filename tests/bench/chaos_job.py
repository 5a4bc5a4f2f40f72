"""The chaos bench's job faults (tests/bench/chaos.py): one fault, on a worker or on the
launcher, at a moment drawn over twice a clean launch's time to its ranks, so that about
half land while ranks run (tests/support/ticker.c: an allreduce every 0.2 s, for longer
than the harness waits; for `frozen-20s`, until some seconds after the thaw).

    cut-off      the pod's links cut at the switch (tests/support/faults.py cut_off)
    loss100      every frame to and from the pod lost on the bridge (drop 100)
    frozen-20s   every process of the pod stopped for 20 s, then continued
    frozen       every process of the pod stopped, for good
    killed       the pod's PID 1 killed (kill -9): the pod is gone

Per run: the fault, where, the moment (`before checks` / `ranks running`, from the
launcher's log), the launcher's exit code (`still running` if it ran GIVE_UP seconds
after the fault: the harness then ends it), and the time the run took to settle: for a
worker fault, from the fault to the launcher's exit (the detection time); for a fault on
the launcher, from the fault until no rank of the job is left on any worker (its ranks,
polled). Also what the agents said about it (the launcher's `worker lost`: whom, what it
saw; the workers' `launcher lost` and `ended launch`), what the job left on the pods,
and whether the next launch — the fault undone, the leftovers killed — succeeds, and
whether it cleared an earlier launch (`earlier launch cleared`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.bench.chaos_outcomes import RUNNING, job_problems
from tests.bench.chaos_pods import Chaos, exit_code, moment_of
from tests.support import logs
from tests.support.faults import Fault
from tests.support.job import Agent
from tests.support.wait import wait_until

THAW_S = 20  # frozen-20s
SETTLED_S = 2.0  # a launcher fault's run is over once no rank has been seen for this long


def job_seconds(fault: str, window: float, give_up: float) -> float:
    """How long the ranks run: past the thaw for frozen-20s (the job must go on to its own
    end), past the harness's patience for the others (only a detection ends them)."""
    return window + THAW_S + 15 if fault == "frozen-20s" else give_up + window + 60


def inject(ch: Chaos, fault: str, pod: Any) -> Fault | None:
    f = ch.faults
    if fault == "cut-off":
        return f.cut_off(pod)
    if fault == "loss100":
        return f.drop(pod, 100)
    if fault == "frozen-20s":
        return f.freeze(pod, THAW_S)
    if fault == "frozen":
        return f.freeze(pod)
    if fault == "killed":
        f.kill_pod(pod)
        return None
    raise ValueError(fault)


def _netns_inodes(ch: Chaos) -> set[int]:
    return {os.stat(f"/run/netns/{p.netns.name}").st_ino for p in ch.c.pods[1:]}


def ranks_on_workers(ch: Chaos, inodes: set[int]) -> int:
    """The job's ranks running on the worker pods: one look at /proc (a process per pod
    would cost more than the poll's interval with 64 pods on 2 cores)."""
    n = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != ch.rank_name:
                continue
            net = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        n += int(net[5:-1]) in inodes  # "net:[4026532456]"
    return n


def watch(
    ch: Chaos, a: Agent, *, fault: str, where: str, t_fault: float, give_up: float
) -> tuple[int | str, float | None, float | None]:
    """Until the run has settled or the harness gives up: (the launcher's exit code or
    RUNNING, seconds from the fault to its exit, seconds until no rank was left)."""
    inodes = _netns_inodes(ch)
    ended_s = gone_s = None
    while (now := time.monotonic()) < t_fault + give_up:
        if ended_s is None and a.p.poll() is not None:
            ended_s = now - t_fault
        ranks = ranks_on_workers(ch, inodes)
        if ranks:
            gone_s = None
        elif gone_s is None:
            gone_s = now - t_fault
        if where == "worker" and ended_s is not None:
            break
        can_end = ended_s is not None or fault == "frozen"  # a frozen launcher never exits
        settled = gone_s is not None and now - t_fault - gone_s >= SETTLED_S
        if where == "launcher" and can_end and settled:
            break
        time.sleep(0.2)
    code: int | str = RUNNING
    if a.p.poll() is not None:
        a.finish(timeout=10)  # its output read to the end
        code = exit_code(a)
    return code, _r(ended_s), _r(gone_s)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def worker_events(ch: Chaos, marks: dict[str, int]) -> dict[str, int]:
    """How many workers logged each of the liveness events since `marks`."""
    counts: dict[str, int] = {}
    for name, w in ch.workers.items():
        text = "".join(w.lines[marks.get(name, 0) :])
        for e in {e["event"] for e in logs.events(text, partial=True)}:
            if e in ("launcher lost", "ended launch"):
                counts[e] = counts.get(e, 0) + 1
    return counts


def settle(ch: Chaos, a: Agent, handle: Fault | None) -> None:
    """The run ended or given up: the launcher killed if it still runs, the fault undone,
    every job process left killed, the workers ready (the killed one started again)."""
    if a.p.poll() is None:
        a.signal(signal.SIGKILL)  # the launcher pod's PID 1: all of the launch goes
        a.p.wait(timeout=30)
    if handle is not None:
        handle.undo()
    if ch.left():
        ch.clear_leftovers()
    for name, w in list(ch.workers.items()):
        up = w if w.p.poll() is None else ch.start_worker(ch.pod(name))
        ch.wait_ready(up)


def one_run(
    ch: Chaos,
    run: int,
    spec: tuple[str, str, str, float],
    *,
    window: float,
    give_up: float,
    say: Any = print,
) -> dict[str, Any]:
    fault, where, target, delay = spec
    pod = ch.launcher_pod if where == "launcher" else ch.pod(target)
    marks = {name: len(w.lines) for name, w in ch.workers.items()}
    job_s = job_seconds(fault, window, give_up)
    a = ch.launcher(ch.names, ch.ticking(job_s))
    time.sleep(delay)
    at, t_fault = time.time(), time.monotonic()
    handle = inject(ch, fault, pod)
    say(f"run {run}: {fault} on {pod.name} ({where}) at {delay:.2f} s")
    code, ended_s, gone_s = watch(ch, a, fault=fault, where=where, t_fault=t_fault, give_up=give_up)
    if code != RUNNING:  # mpirun's teardown of the other ranks may still be under way
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not ranks_on_workers(ch, _netns_inodes(ch)), 10, "ranks to go")
    err = a.stderr()
    moment = moment_of(err, at)
    left = ch.left()
    ranks_left = any(ch.rank_name in names for name, names in left.items() if name != "launcher")
    lost = logs.event(err, "worker lost", partial=True) or {}
    took = ended_s if where == "worker" else gone_s
    problems = job_problems((fault, where, moment), code, ranks_left, took)
    if code == 75 and pod.name not in str(lost.get("host", "")) + err:
        problems.append(f"{pod.name} not named")
    dead = [n for n, w in ch.workers.items() if w.p.poll() is not None and n != pod.name]
    if dead:  # (the agents' own choice only with MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS)
        problems.append(f"workers exited: {dead}")
    events = worker_events(ch, marks)
    settle(ch, a, handle)
    again, again_s, again_err = ch.clean_run(ch.ticking(1))
    if again != 0:
        problems.append(f"the next clean run exited {again}: {again_err[-1500:]}")
    return {
        "run": run,
        "family": "job",
        "fault": fault,
        "where": where,
        "target": pod.name,
        "delay_s": round(delay, 2),
        "job_s": round(job_s, 1),
        "moment": moment,
        "code": code,
        "ended_s": ended_s,
        "ranks_gone_s": gone_s,
        "took_s": took,
        "ranks_left": ranks_left,
        "left": left,
        "worker_lost": {k: lost.get(k) for k in ("host", "address", "seen", "silent_s") if lost},
        "worker_events": events,
        "next_clean_code": again,
        "next_clean_s": round(again_s, 2),
        "next_cleared": len(logs.named(again_err, "earlier launch cleared", partial=True)),
        "problems": problems,
        "tail": "" if not problems else err[-1500:],
    }
