"""Soak: many launches against the same worker pods (tests/support/longrun.py).

    make soak RUNS=200            (or: python tests/bench/soak.py --runs 200)

16 worker pods (netns, the agent as each pod's PID 1) and a launcher pod; for each of the
`dir` and `net` exchanges, RUNS launcher runs that cycle success / a rank exits 3 / a
check fails (the program missing on one worker) / SIGTERM while the ranks run. After
every 20 runs, per worker pod: PSS of the agent and sshd, open fds, processes, sshd's
children, lines in authorized_keys, files in the state directory; the exchange
directory's files; per launcher pod: its state directory's files, ControlMaster sockets,
its processes; and job processes left anywhere. Prints the series, every run whose exit
code is not the documented one, and what grew after the first sample; JSON with --json.
Never asserts a time. Needs root, iproute2, OpenSSH, Open MPI 4 (or --mpi's) and the agent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import add_worker_env, worker_env
from tests.conftest import REAL_MPIS
from tests.support.interrupt import run_main
from tests.support.longrun import EXPECTED, Soak, flat, run_soak

SERIES = (
    "pss_kib",
    "uss_kib",
    "fds",
    "processes",
    "sshd_children",
    "authorized_keys_lines",
    "state_files",
    "exchange_files",
    "launcher_state_files",
    "launcher_sockets",
    "launcher_processes",
    "job_processes_left",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--exchange", nargs="+", default=["dir", "net"])
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument(
        "--together", action="store_true", help="the first launcher started with the workers"
    )
    ap.add_argument("--mpi", default="openmpi4", choices=sorted(REAL_MPIS), help="whose mpirun")
    add_worker_env(ap)
    args = ap.parse_args()
    own = worker_env(args)
    bindir = None if args.mpi == "openmpi4" else REAL_MPIS[args.mpi].bindir
    results = {}
    for exchange in args.exchange:
        with tempfile.TemporaryDirectory(prefix="mpib-soak-", dir="/run") as d:
            t0 = time.monotonic()
            soak = Soak(Path(d), args.workers, exchange, own, bindir)
            try:
                outcomes = run_soak(
                    soak,
                    args.runs,
                    args.every,
                    say=lambda s, x=exchange: print(f"[{x}] {s}", flush=True),
                    together=args.together,
                )
            finally:
                soak.close()
            wrong = [o for o in outcomes if not o.ok]
            by_kind: dict[str, list[float]] = {}
            for o in outcomes:
                by_kind.setdefault(o.kind, []).append(o.seconds)
            results[exchange] = {
                "runs": len(outcomes),
                "workers": args.workers,
                "wrong_exit": [(o.run, o.kind, o.code, EXPECTED[o.kind]) for o in wrong],
                "seconds_by_kind": {
                    k: round(sorted(v)[len(v) // 2], 2) for k, v in by_kind.items()
                },
                "samples": soak.samples,
                "grew": flat(soak.samples[1:] or soak.samples),
                "wall_s": round(time.monotonic() - t0, 1),
            }
    for exchange, r in results.items():
        print(
            f"\n{exchange}: {r['runs']} runs on {r['workers']} workers in {r['wall_s']} s; "
            f"exit codes not as documented: {len(r['wrong_exit'])} {r['wrong_exit'][:5]}"
        )
        print(
            "median seconds by kind: "
            + ", ".join(f"{k} {v}" for k, v in r["seconds_by_kind"].items())
        )
        print("| after run | " + " | ".join(SERIES) + " |")
        print("|---" * (len(SERIES) + 1) + "|")
        for s in r["samples"]:
            cells = [s[k]["max"] if isinstance(s[k], dict) else s[k] for k in SERIES]
            print(f"| {s['run']} | " + " | ".join(str(c) for c in cells) + " |")
        print("grew after the first sample: " + ("; ".join(r["grew"]) or "nothing"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
