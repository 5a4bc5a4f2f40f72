"""PID 1 benchmarks: the resident supervisor's RSS while mpirun runs, SIGTERM latency, and
the agent beside Debian's tini and dumb-init on the same process tree.

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

from tests.support.interrupt import run_main
from tests.support.netns import Netns

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
    with Netns(
        "mpib-bench",
        ifaces={"eth0": "10.250.0.1/24"},
        resolv_conf="nameserver 127.0.0.1\n",
        hosts=hosts,
    ) as ns:
        p = subprocess.Popen(
            [
                *ns.prefix(),
                "env",
                "-i",
                "PATH=/usr/bin:/bin",
                f"HOME={tmp}",
                f"MPI_BOOTSTRAP_STATE_DIR={tmp}/state",
                AGENT,
                "--hostfile",
                str(hostfile),
                "--output-hostfile",
                str(tmp / "out"),
                "--log-format",
                "json",
                "launcher",
                "--",
                "sleep",
                "5",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # ip netns exec execs: p.pid is the agent. Wait until mpirun's rank sleeps.
            def rank_running() -> bool:
                return any(
                    "sleep" in Path(f"/proc/{d}/comm").read_text()
                    for c in children(p.pid)
                    for d in [c, *children(c)]
                    if Path(f"/proc/{d}").exists()
                )

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
    return {
        "supervisor_rss_mib": round(agent / 1024, 1),
        "bare_python_rss_mib": round(bare_rss / 1024, 1),
        "ratio": round(agent / bare_rss, 2),
        "target_mib": 16,
        "supervisor_cmdline": cmdline.decode()[:120],
    }


# The same process tree under each init: PROGRAM as its only child. The agent's
# resident supervisor runs as the hand-off starts it (python -I -S).
RESIDENT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from mpi_bootstrap.pid1.resident import main; sys.exit(main())"
)


def init_argv(init: str, *program: str) -> list[str]:
    if init == "agent":
        return [PY, "-I", "-S", "-c", RESIDENT.format(root=str(ROOT)), "--", *program]
    if init == "tini":
        return ["tini", "-s", "--", *program]  # -s: subreaper when not PID 1
    return ["dumb-init", "--single-child", *program]


INITS = ("agent", "tini", "dumb-init")
# A child that prints the monotonic time at which each SIGUSR1 reaches it.
STAMPER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *a: print(time.monotonic(), flush=True))\n"
    "print('READY', flush=True)\n"
    "while True:\n    signal.pause()\n"
)


def as_pid1(argv: list[str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv], text=True, **kw
    )


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait()


def idle_rss(init: str) -> float:
    """RSS (MiB) of the init while its child sleeps."""
    p = as_pid1(init_argv(init, "sleep", "60"), stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: bool(children(p.pid)))
        agent = children(p.pid)[0]
        wait_for(lambda: bool(children(agent)))
        time.sleep(0.5)
        return round(rss_kib(agent) / 1024, 1)
    finally:
        stop(p)


def forward_latency(init: str, runs: int = 50) -> dict[str, float]:
    """SIGUSR1 sent to PID 1 → the child's handler runs (CLOCK_MONOTONIC on both sides)."""
    p = as_pid1(
        init_argv(init, PY, "-c", STAMPER), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert p.stdout is not None
    try:
        assert p.stdout.readline().strip() == "READY"
        agent = children(p.pid)[0]
        lat = []
        for _ in range(runs):
            t0 = time.monotonic()
            os.kill(agent, signal.SIGUSR1)
            lat.append(float(p.stdout.readline()) - t0)
            time.sleep(0.01)
        return {
            "median_ms": round(statistics.median(lat) * 1000, 3),
            "max_ms": round(max(lat) * 1000, 3),
        }
    finally:
        stop(p)


def term_latency(init: str = "agent", runs: int = 20) -> dict[str, Any]:
    """SIGTERM to PID 1 with a cooperative child (`sleep`), until PID 1 has exited."""
    times = []
    for _ in range(runs):
        p = as_pid1(init_argv(init, "sleep", "60"), stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda p=p: bool(children(p.pid)))
            agent = children(p.pid)[0]
            wait_for(
                lambda agent=agent: any(
                    Path(f"/proc/{c}/comm").read_text().strip() == "sleep" for c in children(agent)
                )
            )
            t0 = time.perf_counter()
            os.kill(agent, signal.SIGTERM)
            p.wait(timeout=10)
            times.append(time.perf_counter() - t0)
        finally:
            stop(p)
    return {
        "median_ms": round(statistics.median(times) * 1000, 1),
        "max_ms": round(max(times) * 1000, 1),
        "runs": runs,
        "target_ms": 100,
    }


def startup_window(argv: list[str], runs: int = 30) -> dict[str, float]:
    """From the exec (Popen returns once it has succeeded) until SIGTERM is blocked or
    has a handler (SigBlk/SigCgt of /proc/PID/status, polled as fast as possible): the
    time in which a SIGTERM to a PID 1 would be dropped by the kernel."""
    bit = 1 << (signal.SIGTERM - 1)
    times = []
    for _ in range(runs):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.perf_counter()
        try:
            while True:
                try:
                    status = Path(f"/proc/{p.pid}/status").read_text()
                except OSError:
                    break
                masks = dict(
                    line.split(":", 1)
                    for line in status.splitlines()
                    if line.startswith(("SigBlk", "SigCgt"))
                )
                if any(int(v, 16) & bit for v in masks.values()):
                    times.append(time.perf_counter() - t0)
                    break
                if time.perf_counter() - t0 > 5:
                    break
        finally:
            stop(p)  # type: ignore[arg-type]
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "runs": len(times),
    }


def beside_tini(tmp: Path) -> dict[str, Any]:
    """The agent, tini and dumb-init on the same process tree (issue: PID 1 at tini's
    standard): RSS with a sleeping child, SIGUSR1 forwarding latency, SIGTERM → exit,
    and the start-up window (for the agent: the `mpi-bootstrap` command, whose entry
    point blocks the terminating signals first)."""
    hostfile = tmp / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    window_argv = {
        "agent": [
            AGENT,
            "--hostfile",
            str(hostfile),
            "--output-hostfile",
            str(tmp / "o"),
            "--dns-wait-seconds",
            "0",
            "--mpirun",
            "/bin/false",
            "launcher",
            "--",
            "true",
        ],
        "tini": ["tini", "-s", "--", "sleep", "1"],
        "dumb-init": ["dumb-init", "sleep", "1"],
    }
    out: dict[str, Any] = {}
    for init in INITS:
        out[init] = {
            "rss_mib": idle_rss(init),
            "forward": forward_latency(init),
            "sigterm_to_exit": term_latency(init, runs=10),
            "startup_window": startup_window(window_argv[init]),
        }
    return out


def main() -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = {
            "supervisor_rss": supervisor_rss(Path(tmp)),
            "sigterm_latency": term_latency(),
            "beside_tini": beside_tini(Path(tmp)),
        }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
