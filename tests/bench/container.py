"""Container benchmarks: image size the agent adds, and container start → sshd ready.
Run by tests/bench/run.py, or alone. Prints, never asserts."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.engines import AGENT, BASE, DEMO
from tests.support.engines import podman_session as session
from tests.support.interrupt import run_main


def size(pm: Any, image: str) -> int:
    return int(pm("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())


def main() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with session() as pm:
        base, agent = size(pm, BASE), size(pm, AGENT)
        out["image_mb"] = {
            "base": round(base / 1e6, 1),
            "agent": round(agent / 1e6, 1),
            "added_by_agent_layer": round((agent - base) / 1e6, 1),
            "note": "the base has no Python: the agent image adds python3 "
            "and python3-venv (Debian) and the agent's venv",
        }
        venv = pm("run", "--rm", "--entrypoint", "du", AGENT, "-sm", "/opt/mpi-bootstrap")
        out["image_mb"]["agent_venv_only"] = int(venv.stdout.split()[0])
        times = []
        for i in range(5):
            with tempfile.TemporaryDirectory() as xdir:
                Path(xdir).chmod(0o777)
                t0 = time.monotonic()
                cid = pm(
                    "run",
                    "-d",
                    "--hostname",
                    f"bench-worker-{i}",
                    "-e",
                    "MPI_BOOTSTRAP_ROLE=worker",
                    "-e",
                    "MPI_BOOTSTRAP_EXCHANGE_DIR=/x",
                    "-v",
                    f"{xdir}:/x",
                    DEMO,
                ).stdout.strip()
                record = Path(xdir) / f"bench-worker-{i}.json"
                while not record.exists() and time.monotonic() - t0 < 60:
                    time.sleep(0.005)
                times.append(time.monotonic() - t0)
                pm("rm", "-f", cid)
        out["container_start_to_sshd_ready_ms"] = {
            "median": round(statistics.median(times) * 1000),
            "max": round(max(times) * 1000),
            "runs": len(times),
            "measured": "podman run → the worker's record published (written only after "
            "its sshd answered)",
        }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
