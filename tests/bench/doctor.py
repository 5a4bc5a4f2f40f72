"""Doctor benchmark: `mpi-bootstrap doctor` over 64 hosts with one of two nameservers
down: the total is bounded by the doctor's deadline, not hosts × timeout. Run by
tests/bench/run.py, or alone. Prints, never asserts."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.conftest import AGENT
from tests.support.cluster import DNS_ADDRESS, Cluster
from tests.support.interrupt import run_main


def main() -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as d,
        Cluster(["job-launcher", "job-worker-0"], dns=True) as c,
    ):
        work = Path(d)
        launcher = c.pods[0]
        # The first nameserver is an address on the pod network where nothing answers.
        launcher.netns.write_etc(
            "resolv.conf",
            "search default.svc.cluster.local "
            "svc.cluster.local cluster.local\nnameserver 10.250.0.3\n"
            f"nameserver {DNS_ADDRESS}\noptions ndots:5 timeout:2\n",
        )
        hf = work / "hostfile"
        hf.write_text("".join(f"job-worker-{i}.job.default.svc slots=1\n" for i in range(64)))
        t0 = time.monotonic()
        done = launcher.run(
            [AGENT, "doctor", "--json"],
            {"PATH": "/usr/bin:/bin", "HOME": str(work), "MPI_HOSTFILE": str(hf)},
            timeout=300,
        )
        elapsed = time.monotonic() - t0
        report = json.loads(done.stdout)
    down = sum(1 for f in report["findings"] if f["check"] == "nameserver 10.250.0.3")
    out = {
        "hosts": 64,
        "elapsed_s": round(elapsed, 2),
        "doctor_deadline_s": 10,
        "serial_worst_case_s": 64 * 4 * 2,
        "findings_about_the_dead_nameserver": down,
        "problems": report["problems"],
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
