"""The worker's two ssh servers, paired on the same pods: OpenSSH's sshd and the agent's
own (ssh/server.py, MPI_BOOTSTRAP_SSH_SERVER=agent).

    python tests/bench/server_pair.py 16 32 64 --pairs 3

For each N: one cluster of N worker pods (tests/bench/scale.py's Scale: the `dir`
exchange, names from hosts files, one slot each); PAIRS rounds, each with both servers,
alternating which goes first. A server's turn: the workers started at once (seconds
until every record is published: time to ready), each worker pod's memory at rest (its
agent and its server: USS, PSS), then the agent's launch of /bin/hostname on every worker
(launcher start to its exit). At the largest N, a second launch whose ranks run
`sleep SLEEP`: the launcher's monitor says its liveness round trips (every worker's pong
to each ping, from the launch's first ping, while the workers' ssh sessions are served)
as p50 and p99. Prints each pair's ratio (agent's / sshd's) and their median; JSON with
--json. Never asserts a time. Needs root, iproute2, OpenSSH, Open MPI 4 and the agent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.scale import PATH, NeighbourTable, Scale, _agent
from tests.support import logs
from tests.support.interrupt import run_main

SERVERS = {"sshd": {}, "agent": {"MPI_BOOTSTRAP_SSH_SERVER": "agent"}}


def turn(s: Scale, server: str, sleep: float) -> dict[str, Any]:
    """One server's turn on the cluster's pods (module docstring)."""
    s.worker_env = SERVERS[server]
    out: dict[str, Any] = {"ready_s": round(s.start_workers(), 3)}
    time.sleep(1.0)  # at rest: start-up done
    out["memory"] = s.memory()
    job = s.agent_job()
    out |= {k: job[k] for k in ("total_s", "busy_cpu_s", "exit_code", "all_hosts_ran")}
    s.end_workers()
    if sleep:
        s.start_workers()
        pod = s.c.pods[0]
        done = pod.run(
            [s.agent, "launcher", "--mpirun", s.mpirun, "--", "sleep", f"{sleep:g}"],
            s.env(pod, MPI_HOSTFILE=str(s.hostfile), MPI_BOOTSTRAP_LOG_LEVEL="info"),
            timeout=600,
        )
        trips = logs.event(done.stderr, "liveness round trips") or {}
        out["liveness"] = {k: trips.get(k) for k in ("pongs", "p50_ms", "p99_ms")}
        out["liveness"]["exit_code"] = done.returncode
        s.end_workers()
    return out


def one_size(n: int, pairs: int, sleep: float, mpirun: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mpib-pair-", dir="/run"))
    work.chmod(0o755)  # sshd's StrictModes
    table_ = NeighbourTable(n + 1)
    s = Scale(n, work, _agent(), mpirun)
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(pairs):
            order = list(SERVERS)[:: 1 - 2 * (i % 2)]
            rounds.append({server: turn(s, server, sleep) for server in order})
            print(f"{n} workers, pair {i + 1}: {json.dumps(rounds[-1])}", flush=True)
    finally:
        s.close()
        table_.__exit__()
        shutil.rmtree(work, ignore_errors=True)
    return {"workers": n, "rounds": rounds, "ratios": ratios(rounds)}


def ratios(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's agent/sshd ratio, pair by pair, and their median."""
    figures = {
        "launch": lambda r: r["total_s"],
        "ready": lambda r: r["ready_s"],
        "uss": lambda r: r["memory"]["uss_mib_median"],
    }
    out = {}
    for name, get in figures.items():
        each = [round(get(r["agent"]) / get(r["sshd"]), 3) for r in rounds]
        out[name] = {"pairs": each, "median": round(statistics.median(each), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sizes", nargs="+", type=int)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=8.0, help="the ranks' sleep at the largest N")
    ap.add_argument("--mpirun", default=shutil.which("mpirun", path=PATH) or "mpirun")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = [
        one_size(n, args.pairs, args.sleep if n == max(args.sizes) else 0, args.mpirun)
        for n in args.sizes
    ]
    for r in results:
        print(f"{r['workers']} workers, agent's own / sshd: {json.dumps(r['ratios'])}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
