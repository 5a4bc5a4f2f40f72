"""SSH benchmarks: worker start → sshd accepting + record published; preflight over
16 workers in parallel versus one by one. Run by tests/bench/run.py (`make bench`), or
alone: `python tests/bench/ssh.py`. Prints numbers, never asserts them."""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.interrupt import run_main

AGENT = str(ROOT / ".venv" / "bin" / "mpi-bootstrap")
PY = str(ROOT / ".venv" / "bin" / "python")
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - a benchmark's own token

# Runs inside the worker pod: start the agent, wait for the record and the banner.
READY = """
import json, os, socket, subprocess, sys, time
agent, xdir, host, env = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
record = os.path.join(xdir, host + ".json")
t0 = time.perf_counter()
p = subprocess.Popen([agent, "worker"], env=env, stderr=subprocess.DEVNULL)
port = None
while time.perf_counter() - t0 < 20:
    if port is None and os.path.exists(record):
        port = json.load(open(record))["port"]
    if port is not None:
        try:
            with socket.create_connection(("10.250.0.11", port), 0.5) as c:
                if c.recv(8) == b"SSH-2.0-":
                    break
        except OSError:
            pass
    time.sleep(0.002)
print(time.perf_counter() - t0)
p.send_signal(15); p.wait(10)
os.unlink(record)
"""


def worker_ready(runs: int = 10) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="mpib-bench-ssh-", dir="/run"))
    times = []
    try:
        with Cluster(["job-launcher", "job-worker-0"]) as c:
            pod = c.pods[1]
            xdir = tmp / "x"
            xdir.mkdir()
            for i in range(runs):
                env = {
                    "PATH": "/usr/bin:/bin",
                    "HOME": str(tmp),
                    "MPI_BOOTSTRAP_STATE_DIR": str(tmp / f"state{i}"),
                    "MPI_BOOTSTRAP_EXCHANGE_DIR": str(xdir),
                }
                done = pod.run(
                    [PY, "-c", READY, AGENT, str(xdir), pod.name, json.dumps(env)], timeout=60
                )
                times.append(float(done.stdout.strip()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "median_ms": round(statistics.median(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "runs": runs,
        "target_ms": 300,
    }


def preflight_16() -> dict[str, Any]:
    names = ["job-launcher", *(f"job-worker-{i}" for i in range(16))]
    tmp = Path(tempfile.mkdtemp(prefix="mpib-bench-pf-", dir="/run"))
    try:
        with Cluster(names) as c:
            for pod in c.pods[1:]:
                # net exchange: workers stay up across launches (dir would end them)
                env = {
                    "PATH": "/usr/bin:/bin",
                    "HOME": str(tmp),
                    "MPI_BOOTSTRAP_STATE_DIR": str(tmp / pod.name),
                    "MPI_BOOTSTRAP_TOKEN": TOKEN,
                }
                c.start(pod, [AGENT, "worker"], env)
            deadline = time.monotonic() + 60
            while len(list(tmp.glob("job-worker-*/record.json"))) < 16:
                if time.monotonic() > deadline:
                    raise TimeoutError("workers did not publish")
                time.sleep(0.1)
            launcher = c.pods[0]
            hf = tmp / "hostfile"
            hf.write_text("".join(f"{n} slots=1\n" for n in names[1:]))
            state = tmp / "launcher"
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp),
                "MPI_HOSTFILE": str(hf),
                "MPI_BOOTSTRAP_OUTPUT_HOSTFILE": str(tmp / "out"),
                "MPI_BOOTSTRAP_STATE_DIR": str(state),
                "MPI_BOOTSTRAP_LOG_FORMAT": "json",
                "MPI_BOOTSTRAP_TOKEN": TOKEN,
            }
            parallel = []
            for _ in range(3):
                done = launcher.run([AGENT, "launcher", "--", "true"], env, timeout=120)
                parallel += [e["elapsed_s"] for e in logs.named(done.stderr, "preflight ok")]
            # One by one, the same ssh command and remote check the agent uses.
            from mpi_bootstrap.launcher import remotecheck
            from mpi_bootstrap.launcher.mpi import ORTE, MPIInfo

            script = remotecheck.RemoteCheck(
                MPIInfo(ORTE, "4.1.4", "/usr/bin/mpirun", "", "detected", "/usr"),
                prefix=None,
                want_ld=None,
            ).script()
            serial_argv = [
                "sh",
                "-c",
                " ; ".join(
                    f"ssh -F {state}/ssh_config {n} {subprocess.list2cmdline([script])} >/dev/null"
                    for n in names[1:]
                ),
            ]
            serial = []
            for _ in range(3):
                t0 = time.perf_counter()
                launcher.run(serial_argv, {"PATH": "/usr/bin:/bin", "HOME": str(tmp)})
                serial.append(time.perf_counter() - t0)
            for p in c.procs:
                p.send_signal(signal.SIGTERM)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    par, ser = statistics.median(parallel), statistics.median(serial)
    return {
        "workers": 16,
        "parallel_ms": round(par * 1000, 1),
        "serial_ms": round(ser * 1000, 1),
        "ratio": round(ser / par, 1),
    }


def main() -> dict[str, Any]:
    out = {"worker_ready": worker_ready(), "preflight_16": preflight_16()}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
