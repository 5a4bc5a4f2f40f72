"""Issue 3 benchmarks: the resident supervisor's RSS while mpirun runs, and SIGTERM latency.

Run by tests/bench/run.py (`make bench`); also `python tests/bench/pid1.py` alone.
Prints numbers, never asserts them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.netns import Netns  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
AGENT = str(ROOT / ".venv" / "bin" / "mpi-bootstrap")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_for(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.01)


def supervisor_rss(tmp: Path) -> dict[str, Any]:
    """RSS of the agent process (same PID before and after the hand-off) while a real
    Open MPI 4 mpirun runs `sleep`, versus a bare sleeping Python, both read from
    /proc/PID/status VmRSS."""
    hostfile = tmp / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    hosts = f"127.0.0.1 localhost {socket.gethostname()}\n"
    with Netns("mpib-bench", ifaces={"eth0": "10.250.0.1/24"},
               resolv_conf="nameserver 127.0.0.1\n", hosts=hosts) as ns:
        p = subprocess.Popen(
            [*ns.prefix(), "env", "-i", "PATH=/usr/bin:/bin", f"HOME={tmp}",
             f"MPI_BOOTSTRAP_STATE_DIR={tmp}/state", AGENT, "--hostfile", str(hostfile),
             "--output-hostfile", str(tmp / "out"), "--log-format", "json", "launcher",
             "--", "sleep", "5"], stderr=subprocess.PIPE, text=True)
        try:
            # ip netns exec execs: p.pid is the agent. Wait until mpirun's rank sleeps.
            def rank_running() -> bool:
                return any("sleep" in Path(f"/proc/{d}/comm").read_text()
                           for c in children(p.pid) for d in [c, *children(c)]
                           if Path(f"/proc/{d}").exists())
            wait_for(rank_running)
            time.sleep(0.5)
            agent = rss_kib(p.pid)
            cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        finally:
            p.wait(timeout=30)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        bare_rss = rss_kib(bare.pid)
    finally:
        bare.kill()
        bare.wait()
    return {"supervisor_rss_mib": round(agent / 1024, 1),
            "bare_python_rss_mib": round(bare_rss / 1024, 1),
            "ratio": round(agent / bare_rss, 2), "target_mib": 16,
            "supervisor_cmdline": cmdline.decode()[:120]}


def term_latency(runs: int = 20) -> dict[str, Any]:
    """SIGTERM to the supervisor (PID 1 of its namespace) with a cooperative child
    (`sleep`), until the agent has exited."""
    times = []
    for _ in range(runs):
        p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", PY, "-m",
                              "mpi_bootstrap.proc", "--", "sleep", "60"],
                             stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda p=p: bool(children(p.pid)))
            agent = children(p.pid)[0]
            wait_for(lambda agent=agent: any(
                Path(f"/proc/{c}/comm").read_text().strip() == "sleep"
                for c in children(agent)))
            t0 = time.perf_counter()
            os.kill(agent, signal.SIGTERM)
            p.wait(timeout=10)
            times.append(time.perf_counter() - t0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"median_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1), "runs": runs, "target_ms": 100}


def main() -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = {"supervisor_rss": supervisor_rss(Path(tmp)), "sigterm_latency": term_latency()}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
