"""Benchmark code that runs INSIDE the benchmark's network namespace.

run.py starts it as `ip netns exec NAME .venv/bin/python tests/bench/inner.py MODE ...`,
so glibc's getaddrinfo reads the namespace's resolv.conf (`nameserver 127.0.0.1`) and
every lookup goes to the dnsmasq on that namespace's loopback, nowhere else.
Each mode prints one JSON object on stdout.

    round          one wait_for() round over a names file (benchmark 1)
    bash-round     the shell loop users copy today, one round (benchmark 1 baseline)
    latency        late 8th record: wait_for() detection latency (benchmark 2)
    bash-latency   the same with the shell loop and a fixed sleep (benchmark 2 baseline)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mpi_bootstrap.core import model
from mpi_bootstrap.system import dns
from tests.support.dnsmasq import write_hosts_file

# The shell loop people put in front of mpirun today (one round).
BASH_ROUND = (
    'fails=0; for h in $(cat "$1"); do getent hosts "$h" >/dev/null '
    '|| fails=$((fails+1)); done; echo "$fails"'
)
# The same, repeated with a fixed sleep until every name resolves (at most $3 rounds).
BASH_WAIT = (
    'r=0; while :; do ok=1; for h in $(cat "$1"); do getent hosts "$h" >/dev/null '
    '|| ok=0; done; [ "$ok" = 1 ] && exit 0; r=$((r+1)); '
    '[ "$r" -ge "$3" ] && exit 1; sleep "$2"; done'
)


def read_names(path: str) -> list[str]:
    with open(path, encoding="ascii") as fh:
        return [line.strip() for line in fh if line.strip()]


def warm_up(names: list[str]) -> None:
    """Load glibc's NSS modules (libnss_dns…) once, as any real process would."""
    socket.getaddrinfo(names[0], None, socket.AF_UNSPEC, socket.SOCK_STREAM)


# ---------------------------------------------------------------- benchmark 1


def udp_rcvbuf_errors() -> int:
    """This namespace's count of UDP datagrams dropped on a full receive buffer."""
    with open("/proc/net/snmp", encoding="ascii") as fh:
        udp = [line.split() for line in fh if line.startswith("Udp:")]
    return int(dict(zip(udp[0], udp[1], strict=True)).get("RcvbufErrors", 0))


def cmd_round(a: argparse.Namespace) -> dict[str, object]:
    names = read_names(a.names)
    warm_up(names)
    drops = udp_rcvbuf_errors()
    start = time.perf_counter()
    result = dns.wait_for(
        names,
        lookup=dns.SystemResolver(),
        deadline=a.deadline,
        interval=a.interval,
        concurrency=a.concurrency,
    )
    wall = time.perf_counter() - start
    return {
        "hosts": len(names),
        "concurrency": a.concurrency,
        "seconds": wall,
        "reported_elapsed": result.elapsed,
        "lookups": result.lookups,
        "ok": result.ok,
        "unresolved": len(result.unresolved),
        "udp_rcvbuf_drops": udp_rcvbuf_errors() - drops,
    }


def cmd_bash_round(a: argparse.Namespace) -> dict[str, object]:
    names = read_names(a.names)
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", "-c", BASH_ROUND, "bash", a.names],
        capture_output=True,
        text=True,
        timeout=a.timeout,
        check=False,
    )
    wall = time.perf_counter() - start
    fails = int(done.stdout.strip() or -1)
    return {
        "hosts": len(names),
        "seconds": wall,
        "failed": fails,
        "ok": done.returncode == 0 and fails == 0,
    }


# ---------------------------------------------------------------- benchmark 2


def _qname(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".")) + b"\0"


class Probe:
    """Direct A queries to the namespace's dnsmasq (not through glibc): is `name` there?"""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(("127.0.0.1", 53))
        self.sock.settimeout(0.2)
        self.qid = 0

    def answers(self, name: str) -> bool:
        self.qid = (self.qid + 1) & 0xFFFF
        self.sock.send(
            struct.pack("!HHHHHH", self.qid, 0x0100, 1, 0, 0, 0)
            + _qname(name)
            + struct.pack("!HH", 1, 1)
        )
        try:
            while True:
                data = self.sock.recv(512)
                if len(data) >= 12 and struct.unpack("!H", data[:2])[0] == self.qid:
                    break
        except TimeoutError:
            return False
        rcode = data[3] & 0x0F
        ancount = struct.unpack("!H", data[6:8])[0]
        return rcode == 0 and ancount > 0

    def close(self) -> None:
        self.sock.close()


def _late_writer(
    hostsdir: str, filename: str, record: tuple[str, str], at: float, marks: dict[str, float]
) -> None:
    """At monotonic time `at`, write the late record; then note when dnsmasq answers it."""
    time.sleep(max(0.0, at - time.monotonic()))
    name = record[0]
    write_hosts_file(hostsdir, filename, [record])
    marks["write"] = time.monotonic()
    probe = Probe()
    try:
        end = marks["write"] + 5.0
        for _ in range(5000):  # at most 5 s of 1 ms polls
            if probe.answers(name):
                marks["visible"] = time.monotonic()
                return
            if time.monotonic() > end:
                return
            time.sleep(0.001)
    finally:
        probe.close()


def _max_per_window(stamps: list[float], window: float = 1.0) -> int:
    best, j = 0, 0
    for i in range(len(stamps)):
        while stamps[i] - stamps[j] >= window:
            j += 1
        best = max(best, i - j + 1)
    return best


def cmd_latency(a: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(a.seed)
    resolver = dns.SystemResolver()
    trials = []
    for k in range(a.trials):
        names = [f"lat{k}-worker-{i}.lat{k}.default.svc.cluster.local" for i in range(a.hosts)]
        late = names[-1]
        warm_up(names)
        calls: list[float] = []

        def lookup(name: str, _calls: list[float] = calls) -> model.Answer:
            _calls.append(time.monotonic())  # list.append is atomic under the GIL
            return resolver(name)

        marks: dict[str, float] = {}
        start = time.monotonic()
        # Jitter (0-50 ms, one re-poll period at 20 lookups/s) so the record does not
        # always land at the same phase of the re-poll clock.
        at = start + a.delay + rng.uniform(0.0, 0.05)
        writer = threading.Thread(
            target=_late_writer,
            daemon=True,
            args=(a.hostsdir, f"late-lat{k}", (late, f"198.19.1.{k + 1}"), at, marks),
        )
        writer.start()
        result = dns.wait_for(
            names, lookup=lookup, deadline=a.deadline, interval=a.interval, concurrency=64
        )
        returned = time.monotonic()
        writer.join(timeout=6)
        stamps = sorted(calls)
        first_round_end = stamps[a.hosts - 1] if len(stamps) >= a.hosts else start
        later = stamps[a.hosts :]
        span = returned - first_round_end
        # Re-poll rate: intervals between re-polls (no fencepost: n lookups, n-1 gaps).
        gaps = later[-1] - later[0] if len(later) > 1 else 0.0
        trials.append(
            {
                "ok": result.ok and "visible" in marks,
                "lookups": result.lookups,
                "write_after_start": marks.get("write", float("nan")) - start,
                "visible_after_write": marks.get("visible", float("nan"))
                - marks.get("write", float("nan")),
                "latency_from_visible": returned - marks.get("visible", float("nan")),
                "latency_from_write": returned - marks.get("write", float("nan")),
                "lookups_after_first_round": len(later),
                "rate_after_first_round": len(later) / span if span > 0 else 0.0,
                "repoll_rate": (len(later) - 1) / gaps if gaps > 0 else 0.0,
                "max_lookups_in_1s_after_first_round": _max_per_window(later),
            }
        )
    return {
        "hosts": a.hosts,
        "interval": a.interval,
        "budget_per_s": dns.lookup_rate(a.hosts, a.interval),
        "trials": trials,
    }


def cmd_bash_latency(a: argparse.Namespace) -> dict[str, object]:
    trials = []
    phases = [float(p) for p in a.phases.split(",")]
    for k, phase in enumerate(phases):
        names = [f"bash{k}-worker-{i}.bash{k}.default.svc.cluster.local" for i in range(a.hosts)]
        names_file = os.path.join(a.workdir, f"bash{k}.names")
        with open(names_file, "w", encoding="ascii") as fh:
            fh.write("\n".join(names) + "\n")
        marks: dict[str, float] = {}
        start = time.monotonic()
        # The first round takes milliseconds; the record lands `phase` of the way
        # through the sleep that follows it.
        at = start + a.first_round + phase * a.interval
        proc = subprocess.Popen(
            ["bash", "-c", BASH_WAIT, "bash", names_file, f"{a.interval:g}", str(a.max_rounds)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        writer = threading.Thread(
            target=_late_writer,
            daemon=True,
            args=(a.hostsdir, f"late-bash{k}", (names[-1], f"198.19.2.{k + 1}"), at, marks),
        )
        writer.start()
        try:
            code = proc.wait(timeout=a.max_rounds * (a.interval + 2))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child
            proc.wait()
            code = -9
        returned = time.monotonic()
        writer.join(timeout=6)
        trials.append(
            {
                "ok": code == 0 and "visible" in marks,
                "phase": phase,
                "latency_from_visible": returned - marks.get("visible", float("nan")),
                "latency_from_write": returned - marks.get("write", float("nan")),
            }
        )
    return {"hosts": a.hosts, "interval": a.interval, "trials": trials}


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("round")
    r.add_argument("--names", required=True)
    r.add_argument("--concurrency", type=int, default=64)
    r.add_argument("--deadline", type=float, default=120.0)
    r.add_argument("--interval", type=float, default=3.0)
    b = sub.add_parser("bash-round")
    b.add_argument("--names", required=True)
    b.add_argument("--timeout", type=float, default=90.0)
    lat = sub.add_parser("latency")
    lat.add_argument("--hostsdir", required=True)
    lat.add_argument("--trials", type=int, default=10)
    lat.add_argument("--hosts", type=int, default=8)
    lat.add_argument("--delay", type=float, default=1.0)
    lat.add_argument("--interval", type=float, default=3.0)
    lat.add_argument("--deadline", type=float, default=20.0)
    lat.add_argument("--seed", type=int, default=1)
    bl = sub.add_parser("bash-latency")
    bl.add_argument("--hostsdir", required=True)
    bl.add_argument("--workdir", required=True)
    bl.add_argument("--phases", default="0.1667,0.5,0.8333")
    bl.add_argument("--hosts", type=int, default=8)
    bl.add_argument("--interval", type=float, default=3.0)
    bl.add_argument("--first-round", type=float, default=0.05)
    bl.add_argument("--max-rounds", type=int, default=4)
    a = p.parse_args()
    handler = {
        "round": cmd_round,
        "bash-round": cmd_bash_round,
        "latency": cmd_latency,
        "bash-latency": cmd_bash_latency,
    }[a.mode]
    print(json.dumps(handler(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
