"""Loaded: one long job on a saturated, lossy, slow cluster must end as it would on an idle
one — exit 0, no false alarm.

    make loaded [LOADED_MINUTES=30]      (or: python tests/bench/loaded.py --minutes 30)

WORKERS worker pods (default 8) and a launcher pod, as the chaos bench builds them
(tests/bench/chaos_pods.py), with the agent's own launch deadline. Once the ranks run
(`--load-from ranks`, the default: the launcher has logged `checks passed`), or from
before the launch (`--load-from launch`), every pod gets (tests/support/faults.py):
its CPU saturated (`--hogs` busy loops in each pod, 1 by default: with no CPU limits
here, the pods' own processes then compete with them for the machine's cores), 20% of
the frames it sends lost on the bridge (`--loss`, on both networks: eth0 and net1), and
every frame it sends delayed 100 ms (`--delay-ms`, by the delay line: this kernel has no
netem). Optionally (`--freeze-at M`) one worker is stopped for 20 s at minute M and
continued. Then one job: ranks that allreduce every 0.2 s for MINUTES
(tests/support/ticker.c).

The run passes when the launcher exits 0, every rank reports its rounds, and no agent
raised an alarm: no `worker lost` from the launcher, no `launcher lost` or `ended launch`
from a worker. Prints the outcome (and the rounds per second the ranks managed, the load
made visible); JSON with --json. Ended by SIGTERM or SIGINT, it removes everything it
made. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.chaos_pods import Chaos, exit_code
from tests.conftest import REAL_MPIS
from tests.support import logs
from tests.support.interrupt import run_main

ROUNDS = re.compile(r"rank (\d+)/(\d+) on (\S+): (\d+) rounds in ([\d.]+) s")
ALARMS = ("worker lost", "launcher lost", "ended launch")


def args_of(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--hogs", type=int, default=1, help="busy loops in each pod")
    ap.add_argument("--loss", type=int, default=20, help="%% of the frames each pod sends lost")
    ap.add_argument("--delay-ms", type=float, default=100, help="0: no delay line")
    ap.add_argument("--freeze-at", type=float, default=None, help="minute to stop a worker 20 s")
    ap.add_argument("--load-from", choices=("ranks", "launch"), default="ranks")
    ap.add_argument("--mpi", default="openmpi4", choices=sorted(REAL_MPIS))
    ap.add_argument("--env", nargs="*", default=[], help="K=V for every agent (e.g. a setting)")
    ap.add_argument("--json", type=Path)
    return ap.parse_args(argv)


def load(ch: Chaos, args: argparse.Namespace) -> None:
    print(
        f"load from the {args.load_from}: {args.hogs} busy per pod, {args.loss}% of the frames"
        f" lost, {args.delay_ms:g} ms delay; a {args.minutes:g}-minute job",
        flush=True,
    )
    for pod in ch.c.pods:
        if args.hogs:
            ch.faults.cpu_hog(pod, args.hogs)
        if args.loss:
            ch.faults.drop(pod, args.loss, inbound=False)  # once per frame, as netem's
    if args.delay_ms:
        ch.faults.delay(ch.c.pods, args.delay_ms)


def freeze_later(ch: Chaos, minute: float, t0: float) -> threading.Timer:
    pod = ch.pod(ch.names[len(ch.names) // 2])

    def freeze() -> None:
        print(f"{time.monotonic() - t0:.0f} s: {pod.name} stopped for 20 s", flush=True)
        ch.faults.freeze(pod, 20)

    timer = threading.Timer(minute * 60, freeze)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    args = args_of(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="mpib-loaded-", dir="/run") as d:
        ch = Chaos(Path(d), args.workers, REAL_MPIS[args.mpi], env=env, deadline=None)
        try:
            print(f"cluster {ch.c.id}: namespaces mpib-*-{ch.c.id}-*, files in {d}", flush=True)
            ch.start_workers()
            if args.load_from == "launch":
                load(ch, args)
            t0 = time.monotonic()
            a = ch.launcher(ch.names, ch.ticking(seconds))
            if args.load_from == "ranks":
                a.wait_event("checks passed", timeout=300)
                load(ch, args)
            timer = freeze_later(ch, args.freeze_at, t0) if args.freeze_at is not None else None
            a.p.wait(timeout=seconds + 600)
            _, out, err = a.finish(timeout=30)
            code = exit_code(a)
            if timer is not None:
                timer.cancel()
            result = outcome(ch, code, out, err, seconds=time.monotonic() - t0, args=args)
        finally:
            ch.close()
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


def outcome(
    ch: Chaos, code: int, out: str, err: str, *, seconds: float, args: argparse.Namespace
) -> dict[str, Any]:
    ranks = [(int(m[1]), int(m[4]), float(m[5])) for m in ROUNDS.finditer(out)]
    alarms = {e: len(logs.named(err, e, partial=True)) for e in ALARMS[:1]}
    for w in ch.workers.values():
        for e in ALARMS[1:]:
            alarms[e] = alarms.get(e, 0) + len(logs.named(w.stderr(), e, partial=True))
    rates = [r / s for _, r, s in ranks if s > 0]
    passed = code == 0 and len(ranks) == args.workers and not any(alarms.values())
    return {
        "passed": passed,
        "code": code,
        "seconds": round(seconds, 1),
        "ranks_reported": len(ranks),
        "workers": args.workers,
        "rounds_per_s": round(min(rates), 2) if rates else None,  # 5/s unloaded
        "alarms": alarms,
        "load": {
            "from": args.load_from,
            "hogs_per_pod": args.hogs,
            "loss_pct": args.loss,
            "delay_ms": args.delay_ms,
        },
        "freeze_at_min": args.freeze_at,
        "loadavg": os.getloadavg(),
        "tail": "" if passed else err[-3000:],
    }


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
