"""What one ssh handshake costs the launcher: client CPU per `ssh HOST true`, by key
exchange and by key type (the agent's ed25519 against MPI Operator's ECDSA P-521, which
the `secret` exchange also makes every worker's host key).

    python tests/bench/handshake.py [--runs 40] [--json FILE]

A real sshd in a network namespace of its own (loopback only), a real ssh client; the
client's CPU is read from the kernel's accounting of finished children (user + system).
Prints numbers, never asserts them (docs/benchmarks.md, "The key exchange").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.netns import Netns
from tests.support.wait import wait_until

KEXES = (
    "sntrup761x25519-sha512@openssh.com",
    "curve25519-sha256",
    "ecdh-sha2-nistp256",
    "mlkem768x25519-sha256",
)
KEYS = {"ed25519": ["-t", "ed25519"], "ecdsa-p521": ["-t", "ecdsa", "-b", "521"]}


def keygen(path: Path, kind: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-f", str(path), *KEYS[kind]], check=True)


def offered() -> set[str]:
    return set(
        subprocess.run(
            ["ssh", "-Q", "kex"], capture_output=True, text=True, check=True
        ).stdout.split()
    )


def measure(ns: Netns, work: Path, kind: str, kex: str, runs: int) -> dict[str, float]:
    """Median client CPU and wall time of `runs` handshakes with key type `kind`."""
    host, client = work / f"host-{kind}", work / f"client-{kind}"
    for key in (host, client):
        if not key.exists():
            keygen(key, kind)
    auth = work / f"auth-{kind}"
    auth.write_text(Path(f"{client}.pub").read_text())
    auth.chmod(0o600)
    cfg = work / f"sshd-{kind}"
    cfg.write_text(
        f"Port 2299\nListenAddress 127.0.0.1\nHostKey {host}\nAuthorizedKeysFile "
        f"{auth}\nUsePAM no\nPidFile {work}/sshd-{kind}.pid\nStrictModes no\n"
    )
    sshd = subprocess.Popen(
        [*ns.prefix(), "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL
    )
    try:
        argv = [
            *ns.prefix(),
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            "2299",
            "-i",
            str(client),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            f"KexAlgorithms={kex}",
            "-o",
            "ControlPath=none",
            "127.0.0.1",
            "true",
        ]
        wait_until(
            lambda: subprocess.run(argv, capture_output=True, check=False).returncode == 0,
            10,
            "sshd",
        )
        cpu, wall = [], []
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            wall.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return {
            "cpu_ms": round(statistics.median(cpu) * 1000, 1),
            "wall_ms": round(statistics.median(wall) * 1000, 1),
        }
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mpib-handshake-", dir="/run"))
    out: dict[str, dict[str, float]] = {}
    try:
        with Netns("mpib-hs") as ns:
            for kind in KEYS:
                for kex in KEXES:
                    if kex not in offered():
                        print(f"{kind:11} {kex:36} (this ssh does not offer it)")
                        continue
                    out[f"{kind} {kex}"] = m = measure(ns, work, kind, kex, args.runs)
                    print(
                        f"{kind:11} {kex:36} client CPU {m['cpu_ms']:6.1f} ms, "
                        f"wall {m['wall_ms']:6.1f} ms",
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
