"""The faults the chaos and loaded benchmarks inject (tests/support/faults.py) do what they
say, and are undone: measured with UDP echoes between three pods (a, b, c)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, Pod
from tests.support.faults import Faults
from tests.support.wait import wait_until

pytestmark = [pytest.mark.timeout(120)]

PORT = 9001
ECHO = f"""
import signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as PID 1, nothing is done by default
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", {PORT}))
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""
# n datagrams, one at a time, each awaited up to `wait` s: "answered median_ms".
PING = """
import socket, statistics, sys, time
to, n, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(wait)
rtt = []
for i in range(n):
    t = time.monotonic()
    s.sendto(str(i).encode(), (to, PORT))
    try:
        while s.recv(64) != str(i).encode():
            pass
        rtt.append((time.monotonic() - t) * 1000)
    except TimeoutError:
        pass
print(len(rtt), statistics.median(rtt) if rtt else -1)
""".replace("PORT", str(PORT))
# A TCP transfer of 4 MiB: segments larger than a frame, checksums left to the kernel.
SINK = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 9002))
s.listen()
c, _ = s.accept()
n = 0
while data := c.recv(1 << 20):
    n += len(data)
print(n)
"""


def ping(a: Pod, b: Pod, n: int = 4, wait: float = 0.5) -> tuple[int, float]:
    done = a.netns.run(
        [sys.executable, "-c", PING, b.address, str(n), str(wait)], capture_output=True
    )
    answered, median = done.stdout.split()
    return int(answered), float(median)


def states(pod: Pod) -> set[str]:
    """The states (R, S, T, ...) of the pod's processes, `unshare` aside."""
    out = set()
    for pid in pod.netns.pids():
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        if "(unshare" not in stat[0]:
            out.add(stat[1].split()[0])
    return out


@pytest.fixture
def three(netns: None) -> Iterator[tuple[Cluster, Faults]]:
    with Cluster(["a", "b", "c"], pid1=True) as c:
        for pod in c.pods[1:]:
            c.start(pod, [sys.executable, "-c", ECHO])
        wait_until(lambda: ping(c.pods[0], c.pods[1], 1)[0] == 1, 10, "b's echo")
        wait_until(lambda: ping(c.pods[0], c.pods[2], 1)[0] == 1, 10, "c's echo")
        yield c, Faults(c)


class TestNetwork:
    """Cut off, lost frames, delay: what a pod's peers see, and the undo."""

    def test_cut_off_and_back(self, three: tuple[Cluster, Faults]) -> None:
        """A pod cut off answers nothing; undone, it answers again."""
        c, f = three
        a, b, _ = c.pods
        fault = f.cut_off(b)
        assert ping(a, b)[0] == 0
        fault.undo()
        wait_until(lambda: ping(a, b, 1)[0] == 1, 10, "b to answer again")

    def test_drop_all_and_some(self, three: tuple[Cluster, Faults]) -> None:
        """100% lost: no answer; 50% of what the pod sends: some answers, not all (40
        datagrams: the odds of all or none are 2^-40); undone: every one."""
        c, f = three
        a, b, _ = c.pods
        fault = f.drop(b, 100)
        assert ping(a, b)[0] == 0
        fault.undo()
        f.drop(b, 50, inbound=False)
        assert 0 < ping(a, b, 40, 0.1)[0] < 40
        f.undo_all()
        assert ping(a, b, 10)[0] == 10

    def test_delay(self, three: tuple[Cluster, Faults]) -> None:
        """100 ms on a and b: a round trip a↔b takes 200 ms (each way one delayed pod),
        a↔c 100 ms; a TCP transfer passes the delay line whole; undone, no delay."""
        c, f = three
        a, b, cc = c.pods
        fault = f.delay([a, b], 100)
        answered, rtt = ping(a, b)
        assert answered == 4 and 195 <= rtt < 400
        answered, rtt = ping(a, cc)
        assert answered == 4 and 95 <= rtt < 300
        sink = subprocess.Popen(
            [*b.netns.prefix(), sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True
        )
        try:
            to = f"('{b.address}', 9002)"
            send = f"import socket; socket.create_connection({to}).sendall(b'x' * (4 << 20))"
            wait_until(
                lambda: (
                    a.netns.run([sys.executable, "-c", send], capture_output=True).returncode == 0
                ),
                10,
                "the sink to listen",
                interval=0.2,
            )
            assert sink.communicate(timeout=60)[0].strip() == str(4 << 20)
        finally:
            sink.kill()
            sink.wait()
        fault.undo()
        assert ping(a, b)[1] < 50


class TestProcesses:
    """Frozen, killed, busy: the pod's processes."""

    def test_freeze_for_a_while(self, three: tuple[Cluster, Faults]) -> None:
        """Frozen: every process of the pod stopped (T), its echo silent; thawed by itself
        after the given seconds."""
        c, f = three
        a, b, _ = c.pods
        f.freeze(b, 1.5)
        assert states(b) == {"T"}
        assert ping(a, b, 1)[0] == 0
        wait_until(lambda: "T" not in states(b), 5, "b to be thawed")
        assert ping(a, b, 1)[0] == 1

    def test_kill_pod(self, three: tuple[Cluster, Faults]) -> None:
        """Killed: the pod's PID 1 (the echo here) is gone, and with it the namespace."""
        c, f = three
        killed = f.kill_pod(c.pods[1])
        assert len(killed) == 1
        c.procs[0].wait(timeout=10)
        assert states(c.pods[1]) == set()

    def test_cpu_hog_and_close(self, netns: None) -> None:
        """Busy loops run in the pod; the cluster's close ends them, thaws a frozen pod and
        removes the delay line, without an undo by the test."""
        with Cluster(["a", "b"], pid1=True) as c:
            f = Faults(c)
            hog = f.cpu_hog(c.pods[1], 2)
            # (each enters the pod's netns a moment after its start: `ip netns exec`)
            wait_until(lambda: len(c.pods[1].netns.pids()) == 2, 10, "two busy loops in b")
            time.sleep(0.2)
            assert "R" in states(c.pods[1])
            f.delay(c.pods, 10)
            delayline = c.switch.pids()
            f.freeze(c.pods[0])
            assert hog.active
        assert not hog.active
        assert all(not Path(f"/proc/{pid}").exists() for pid in delayline)
