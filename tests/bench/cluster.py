"""Benchmarks on the simulated cluster: pods up → first rank running, per MPI;
and for 16 workers, launcher start → mpirun start split into DNS, records, sshd
readiness and preflight. Run by tests/bench/run.py, or alone. Prints, never asserts."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.demo import run_job
from tests.support.interrupt import run_main


def main() -> dict[str, Any]:
    per_mpi = {}
    for mpi in ("openmpi4", "openmpi5", "mpich", "intel"):
        runs = [run_job(mpi, echo=False) for _ in range(3)]
        times = [r["pods_up_to_first_rank_s"] for r in runs if r["exit_code"] == 0]
        per_mpi[mpi] = {
            "median_s": statistics.median(times) if times else None,
            "runs_ok": len(times),
            "runs": len(runs),
        }
    big = [run_job("openmpi4", workers=16, slots=1, echo=False) for _ in range(2)]
    phases = [b["launcher_phases_s"] for b in big if "launcher_phases_s" in b]
    split = {}
    if phases:
        last = 0.0
        # (no sshd_ready: with preflight, its first ssh is the wait for each sshd)
        for key in ("dns", "records", "preflight", "mpirun_start"):
            if not all(key in p for p in phases):
                continue
            at = statistics.median(p[key] for p in phases)
            split[key] = round(at - last, 3)
            last = at
        split["total_to_mpirun_start"] = round(last, 3)
    out = {
        "pods_up_to_first_rank": per_mpi,
        "workers16_phases_s": split,
        "workers16_ok": sum(b["exit_code"] == 0 for b in big),
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
