"""Chaos: one fault at a random moment of each run, on many worker pods.

    make chaos CHAOS_RUNS=50 [SEED=N] [CHAOS_ARGS=...]   (or: python tests/bench/chaos.py)

64 worker pods (netns, the agent as each pod's PID 1, the `net` exchange, names from
dnsmasq as in Kubernetes, each worker's state directory on a tmpfs of its own) and a
launcher pod; Open MPI 4 (Debian's) unless `--mpi` names another. Each run draws, from
the printed seed, one fault of two families:

- launch faults (tests/bench/chaos_launch.py): a launch of `sh -c 'sleep 1'` on every
  worker, the fault at a moment drawn over a clean launch's length, into one worker or
  the launcher: kill -9 the pod's PID 1, kill -9 its sshd, eth0 down, DNS record
  removed, stopped 20 s, state filesystem full, net1 down, SIGTERM to the launcher;
- job faults (tests/bench/chaos_job.py): ranks that allreduce every 0.2 s for long, the
  fault at a moment drawn over twice a clean launch's time to its ranks (about half
  land while ranks run), on a worker or on the launcher: cut off, 100% loss, frozen for
  20 s, frozen for good, killed. The harness waits GIVE_UP seconds after the fault
  (`--give-up`, 150) and records `still running` if the launcher still runs then.

The moment is read back from the launcher's log: `before checks` (it had not yet logged
`checks passed`) or `ranks running` (it had). What each fault × where × moment may end
with is data: tests/bench/chaos_outcomes.py; a run that ends otherwise is printed as
"not as documented" (the bench never asserts). After each run the fault is undone, what
the job left on the pods is killed, and a clean run must succeed. Every run is written
to the JSON file (`--json`) as it ends; a summary with medians and maxima per fault ×
where × moment closes the output. `--seed N --runs 1 --skip K` replays run K+1 (with the
same --family, --faults and pods). `--family launch` draws as this bench did before the
job faults came: its earlier seeds replay.

Ended by SIGTERM or SIGINT, it removes every pod, daemon and file it made first
(tests/support/interrupt.py; tests/test_hygiene.py checks).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import chaos_job, chaos_launch
from tests.bench.chaos_outcomes import (
    EITHER,
    JOB_FAULTS,
    JOB_OUTCOMES,
    LAUNCH_FAULTS,
    LAUNCH_OUTCOMES,
    WHERE,
)
from tests.bench.chaos_pods import Chaos
from tests.conftest import REAL_MPIS
from tests.support import logs
from tests.support.interrupt import run_main

GIVE_UP_S = 150.0


def args_of(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--skip", type=int, default=0, help="draw and skip this many runs first")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--mpi", default="openmpi4", choices=sorted(REAL_MPIS))
    ap.add_argument("--family", default="both", choices=("both", "launch", "job"))
    ap.add_argument("--where", default="both", choices=("both", *WHERE), help="job faults' pod")
    ap.add_argument(
        "--faults", nargs="+", default=[], help="draw only these faults (of the families)"
    )
    ap.add_argument("--env", nargs="*", default=[], help="K=V for every agent (e.g. a setting)")
    ap.add_argument(
        "--together",
        action="store_true",
        help="the first clean run's launcher started with the workers, as a cluster does",
    )
    ap.add_argument(
        "--give-up",
        type=float,
        default=GIVE_UP_S,
        help="seconds after a job fault the harness waits before it records `still running`",
    )
    return ap.parse_args(argv)


def faults_of(args: argparse.Namespace) -> list[str]:
    family = {"launch": LAUNCH_FAULTS, "job": JOB_FAULTS, "both": LAUNCH_FAULTS + JOB_FAULTS}
    faults = [f for f in family[args.family] if not args.faults or f in args.faults]
    if not faults:
        raise SystemExit(f"no fault of {args.family} in {args.faults}")
    return faults


def to_ranks(ch: Chaos) -> float:
    """A clean job's launch: seconds from the launcher's start to `checks passed`."""
    t0 = time.time()
    code, _, err = ch.clean_run(ch.ticking(1))
    passed = logs.event(err, "checks passed", partial=True)
    if code != 0 or passed is None:
        raise SystemExit(f"the clean job run exited {code}: {err[-3000:]}")
    return logs.stamp(passed) - t0


def main(argv: list[str] | None = None) -> int:
    args = args_of(argv)
    faults = faults_of(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mpib-chaos-", dir="/run") as d:
        t0 = time.monotonic()
        env = dict(kv.split("=", 1) for kv in args.env)
        ch = Chaos(Path(d), args.workers, REAL_MPIS[args.mpi], env=env)
        try:
            print(f"cluster {ch.c.id}: namespaces mpib-*-{ch.c.id}-*, files in {d}", flush=True)
            ch.start_workers(wait=not args.together)
            print(f"{args.workers} workers started in {time.monotonic() - t0:.1f} s", flush=True)
            code, clean_s, err = ch.clean_run()
            if code != 0:
                raise SystemExit(f"the first clean run exited {code}: {err[-3000:]}")
            window = 2 * to_ranks(ch)
            print(f"clean run: {clean_s:.2f} s; job faults drawn over {window:.2f} s", flush=True)
            for i in range(args.skip + args.runs):
                fault = rng.choice(faults)
                if fault in JOB_FAULTS:
                    where = rng.choice(WHERE if args.where == "both" else (args.where,))
                    target = rng.choice(ch.names)
                    spec = (fault, where, target, rng.uniform(0, window))
                else:
                    target, delay = rng.choice(ch.names), rng.uniform(0, clean_s)
                if i < args.skip:
                    continue
                if fault in JOB_FAULTS:
                    r = chaos_job.one_run(ch, i + 1, spec, window=window, give_up=args.give_up)
                else:
                    r = chaos_launch.one_run(ch, i + 1, fault, target, delay)
                results.append(r)
                print(json.dumps(r), flush=True)
                if args.json:  # as it goes: a run stopped early keeps what it measured
                    args.json.write_text(json.dumps({"seed": seed, "runs": results}, indent=1))
        finally:
            ch.close()
    summary(seed, results, args.give_up)
    return 0


def summary(seed: int, results: list[dict[str, Any]], give_up: float) -> None:
    bad = [r for r in results if r["problems"]]
    print(f"\nseed {seed}: {len(results)} runs, {len(bad)} not as documented")
    launch = [r for r in results if r["family"] == "launch"]
    if launch:
        print(launch_table(launch))
    job = [r for r in results if r["family"] == "job"]
    if job:
        print(job_table(job, give_up))
    for r in bad:
        print(
            f"run {r['run']} ({r['fault']} on {r['target']} at {r['delay_s']} s): "
            f"{'; '.join(r['problems'])}"
        )


def launch_table(runs: list[dict[str, Any]]) -> str:
    table: dict[tuple[str, str], list[int]] = {}
    for r in runs:
        table.setdefault((r["fault"], r["moment"]), []).append(r["code"])
    out = ["| fault | moment | runs | exit codes seen | documented |", "|---|---|---|---|---|"]
    for (fault, moment), codes in sorted(table.items()):
        doc = ", ".join(str(c) for c in sorted(LAUNCH_OUTCOMES[(fault, moment)], key=str))
        seen = ", ".join(f"{c}×{codes.count(c)}" for c in sorted(set(codes)))
        out.append(f"| {fault} | {moment} | {len(codes)} | {seen} | {doc} |")
    return "\n".join(out)


def job_table(runs: list[dict[str, Any]], give_up: float) -> str:
    """Per fault × where × moment: the outcomes seen (exit code, and ranks left or gone)
    and the time it took (median, max): to the launcher's exit for a worker fault, until
    no rank was left for a fault on the launcher."""
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        rows.setdefault((r["fault"], r["where"], r["moment"]), []).append(r)
    out = [
        "| fault | where | moment | runs | outcome: exit code (ranks) | time median | max "
        "| documented |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {f: i for i, f in enumerate(JOB_FAULTS)}
    for key in sorted(rows, key=lambda k: (order[k[0]], k[1] == "launcher", k[2])):
        rs = rows[key]
        outcomes = [f"{r['code']} (ranks {'left' if r['ranks_left'] else 'gone'})" for r in rs]
        seen = ", ".join(f"{o}×{outcomes.count(o)}" for o in sorted(set(outcomes)))
        took = [r["took_s"] for r in rs if r["took_s"] is not None]
        med = f"{statistics.median(took):.1f} s" if took else f"> {give_up:g} s"
        top = f"{max(took):.1f} s" if len(took) == len(rs) else f"> {give_up:g} s"
        e = JOB_OUTCOMES[key]
        doc = ", ".join(sorted(map(str, e.codes)))
        doc += f" (ranks {e.ranks})" if e.ranks != EITHER else ""
        doc += f" within {e.within_s:g} s" if e.within_s is not None else ""
        out.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {seen} | {med} | {top} | {doc} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
