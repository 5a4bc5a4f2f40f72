"""`make demo`: a real MPI job through the agent on a simulated cluster on this machine.

A launcher pod and worker pods (network namespaces with eth0 on a control bridge and
net1 on a data bridge, their own hostnames, the agent as PID 1 of each), dnsmasq serving
MPI Operator's names, the agent's worker role running a private sshd in every worker,
and `mpi-bootstrap launcher -- ./allreduce` in the launcher pod. It prints the job's
output and a summary, removes everything, and exits with the job's code.

    python tests/demo.py [--mpi openmpi4|openmpi5|mpich|intel] [--workers N]
                         [--slots N] [--rewrite none|fqdn|ip] [--json]
    python tests/demo.py --print-needs [--mpi …]   # the MPI venvs that run needs

`make demo` asks `--print-needs` first and installs only those venvs: the default
(Open MPI 4, from Debian) needs none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import MPI_VENVS, REAL_MPIS
from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.interrupt import run_main
from tests.support.job import Job
from tests.support.programs import LINE, compile_allreduce


def needs(mpi: str) -> list[str]:
    """The PyPI MPI venvs (`.venv-mpi/NAME`) a demo with `mpi` needs. Intel MPI's wheel
    has no compiler or header: the program is built with MPICH's (programs.py)."""
    kinds = ["mpich", mpi] if mpi == "intel" else [mpi]
    out = []
    for kind in kinds:
        bindir = Path(REAL_MPIS[kind].where)  # only where it is: nothing is run
        if bindir.parent.parent == MPI_VENVS:
            out.append(str(bindir.parent.relative_to(ROOT)))
    return out


def rank_lines(stdout: str) -> str:
    """The job's output as a person reads it: each rank's line says rank, host and
    result; the start time the program also prints (for the summary) is dropped."""
    return "".join(
        m[0] + "\n" if (m := LINE.match(line)) else line + "\n" for line in stdout.splitlines()
    )


def run_job(
    mpi: str = "openmpi4",
    workers: int = 2,
    slots: int = 2,
    rewrite: str = "none",
    echo: bool = True,
) -> dict[str, Any]:
    m = REAL_MPIS[mpi]
    if not os.access(m.mpirun, os.X_OK):
        raise SystemExit(f"{m.mpirun} missing: run `make demo` (it installs the MPI)")
    # Below /run, which only root writes: the state directories there are reached by
    # their paths (the project's rules: tests and benches keep state under /run).
    work = Path(tempfile.mkdtemp(prefix="mpib-demo-", dir="/run"))
    work.chmod(0o755)
    names = ["demo-launcher", *(f"demo-worker-{i}" for i in range(workers))]
    try:
        exe = compile_allreduce(m, work)
        with Cluster(names, dns=True, pid1=True, job="demo") as c:
            # The dir exchange; the hostfile names the workers <pod>.demo.default.svc.
            job = Job(c, work, m)
            job.start_workers()
            pods_up = time.time()
            done = job.launch(
                [str(exe)], slots=slots, names=names[1:], timeout=300, MPI_BOOTSTRAP_REWRITE=rewrite
            )
            written = job.output.read_text() if done.returncode == 0 else ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if echo:
        sys.stdout.write(rank_lines(done.stdout))
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
    ev = logs.events(done.stderr, partial=True)
    starts = [float(s) for s in re.findall(r" start (\d+\.\d+)", done.stdout)]
    by = {e["event"]: e for e in ev}
    ranks = [m_ for m_ in LINE.finditer(done.stdout)]
    summary: dict[str, Any] = {
        "mpi": f"{by.get('MPI', {}).get('vendor', m.vendor)} "
        f"{by.get('MPI', {}).get('version', m.version)}",
        "hosts": [line.split()[0].split(":")[0] for line in written.splitlines()],
        "rewrite": rewrite,
        "ranks_ok": sum(1 for r in ranks if r[6] == "OK"),
        "ranks": len(ranks),
        "exit_code": done.returncode,
        "pods_up_to_first_rank_s": round(min(starts) - pods_up, 3) if starts else None,
    }
    if "MPI" in by and "mpirun start" in by:
        t0 = logs.stamp(by["MPI"])
        summary["launcher_phases_s"] = {
            phase: round(logs.stamp(by[name]) - t0, 3)
            for phase, name in (
                ("dns", "DNS done"),
                ("records", "records"),
                ("sshd_ready", "sshd ready"),
                ("preflight", "preflight ok"),
                ("mpirun_start", "mpirun start"),
            )
            if name in by
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mpi", default="openmpi4", choices=sorted(REAL_MPIS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rewrite", default="none", choices=("none", "fqdn", "ip"))
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--print-needs",
        action="store_true",
        help="print the MPI venvs this run needs, and run nothing",
    )
    args = parser.parse_args()
    if args.print_needs:
        print(" ".join(needs(args.mpi)))
        return 0
    if os.geteuid() != 0:
        print("the demo builds network namespaces: run it as root", file=sys.stderr)
        return 1
    s = run_job(args.mpi, args.workers, args.slots, args.rewrite, echo=not args.json)
    if args.json:
        print(json.dumps(s))
    else:
        print()
        print(f"MPI:            {s['mpi']}")
        print(f"hosts:          {', '.join(s['hosts']) or '(no hostfile written)'}")
        print(f"rewrite:        {s['rewrite']}")
        print(f"ranks:          {s['ranks_ok']} of {s['ranks']} computed the right sum")
        if s["pods_up_to_first_rank_s"] is not None:
            print(
                f"time to launch: {s['pods_up_to_first_rank_s']:.2f} s from pods up to the "
                "first rank running"
            )
        if "launcher_phases_s" in s:
            print(
                "launcher:       "
                + ", ".join(f"{k} at {v:.2f} s" for k, v in s["launcher_phases_s"].items())
            )
        print(f"job exit code:  {s['exit_code']}")
    return int(s["exit_code"])


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
