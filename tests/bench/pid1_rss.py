"""PID 1's memory while a job runs (docs/benchmarks.md, "PID 1's memory"): the agent as
PID 1 of its own PID namespace (`unshare --pid --fork --mount-proc`), `mpi-bootstrap
launcher` with preflight off on a one-host hostfile running `mpirun -np 1 sleep 4`
(Open MPI 4); VmRSS of /proc/PID/status read once the rank sleeps (the resident
supervisor by then), the median over --runs. State under /run, removed after.

    python tests/bench/pid1_rss.py [--agent .venv/bin/mpi-bootstrap] [--runs 5]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def one(agent: str, work: Path, i: int) -> float:
    """VmRSS (MiB) of the agent as PID 1 while the job's rank sleeps."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "MPI_BOOTSTRAP_PREFLIGHT": "false",
           "MPI_BOOTSTRAP_STATE_DIR": str(work / f"state{i}")}  # fmt: skip
    argv = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        agent,
        "--hostfile",
        str(work / "hostfile"),
        "--output-hostfile",
        str(work / f"out{i}"),
        "launcher",
        "--",
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "1",
        "sleep",
        "4",
    ]
    p = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kids = _children(p.pid)
            names = []
            for d in _descendants(kids[0]) if kids else []:
                with contextlib.suppress(OSError):
                    names.append(Path(f"/proc/{d}/comm").read_text().strip())
            if "sleep" in names:
                time.sleep(0.5)
                status = Path(f"/proc/{kids[0]}/status").read_text().splitlines()
                return int(next(s for s in status if s.startswith("VmRSS")).split()[1]) / 1024
            time.sleep(0.05)
        raise RuntimeError("the rank never ran")
    finally:
        p.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", default=".venv/bin/mpi-bootstrap")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mpib-pid1-rss-", dir="/run"))
    try:
        (work / "hostfile").write_text("localhost slots=1\n")
        found = [one(str(Path(args.agent).resolve()), work, i) for i in range(args.runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"PID 1 VmRSS while a job runs: median {statistics.median(found):.1f} MiB "
          f"(min {min(found):.1f}, max {max(found):.1f}, {args.runs} runs)")  # fmt: skip


if __name__ == "__main__":
    main()
