"""The data check (launcher/datacheck.py, dataplane/port.py, pid1/dataserve.py) attacked
for real in a simulated cluster, as the second outside review did (its findings 2 to 4):
a stranger pod holding the check's port from its own namespace, and a compromised worker
answering the check with forged reports. Each test fails on the code the review
attacked, and passes only when the attack fails; each has a control that shows the
honest path still works. SECURITY.md cites these classes. (Its finding 1, the doctor's
planted ssh config: tests/test_attacks.py::TestDoctorTrustsNoPlantedFile.)
"""

from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpi_bootstrap.worker.main import CONTROL_FIFO
from tests.conftest import REAL_MPIS
from tests.support import logs
from tests.support.cluster import Cluster, Pod
from tests.support.job import Agent, Job, sshd_of
from tests.support.podnet import LISTEN
from tests.support.wait import holds_for, wait_until

pytestmark = [pytest.mark.timeout(240)]

W3 = ["job-worker-0", "job-worker-1", "job-worker-2"]
NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # as high as this machine allows
OMPI4 = REAL_MPIS["openmpi4"]


# ---------------------------------------------------------------- a stranger on the port

# What the stranger runs in its own pod: `push` holds one connection to the port, sending
# until the worker stops taking bytes and never reading; `flood` opens 1,500 and holds
# them silent (more descriptors than select() can watch). Either way it then says when
# the worker closes one, and holds on.
STRANGER = r"""
import resource, select, socket, sys, time
addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
conns = []
if mode == "push":
    s = socket.create_connection((addr, port), timeout=5)
    s.setblocking(False)
    pushed, last = 0, time.monotonic()
    while time.monotonic() - last < 1.0:
        try:
            pushed += s.send(b"x" * 65536)
            last = time.monotonic()
        except BlockingIOError:
            time.sleep(0.01)
    conns.append(s)
    print(f"held {addr}:{port}, pushed {pushed} bytes, reads nothing", flush=True)
else:
    for i in range(1500):  # paced (500 a second) so that none is lost to a full backlog
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((addr, port))
        conns.append(s)
        if i % 50 == 49:
            time.sleep(0.1)
    p = select.poll()
    for s in conns:
        p.register(s, select.POLLOUT)
    up, end = 0, time.monotonic() + 10  # as many as the worker will take
    while up < len(conns) and time.monotonic() < end:
        for fd, _ in p.poll(500):
            p.unregister(fd)
            up += 1
    print(f"held {up} of {len(conns)} connections to {addr}:{port}", flush=True)
p = select.poll()  # the end of a connection, without reading what it holds
for s in conns:
    p.register(s, select.POLLRDHUP)
if p.poll(120_000):
    print("closed by the worker", flush=True)
time.sleep(120)
"""


def data_port(pod: Pod) -> int:
    """The port the data check's session opened on `pod`'s data address, once it has."""

    def listening() -> int | None:
        out = pod.netns.run(["ss", "-Htln", "src", pod.data_address], capture_output=True)
        m = re.search(rf"{re.escape(pod.data_address)}:(\d+)", out.stdout)
        return int(m.group(1)) if m else None

    return wait_until(listening, 60, f"the data check's port on {pod.name}")


@pytest.fixture
def five(netns: None, realmpi: None) -> Iterator[Cluster]:
    """A launcher, three workers and a stranger: a pod on the same networks, in no job."""
    with Cluster(["job-launcher", *W3, "stranger"]) as c:
        yield c


class Window:
    """The data check's window held open: worker-2's sshd stopped (SIGSTOP), so the
    launcher waits for it while worker-0 and worker-1 have opened their ports. How long a
    stranger has is then up to the test, not to a race."""

    def __init__(self, c: Cluster, work: Path, **extra: str) -> None:
        self.c = c
        self.job = Job(c, work, OMPI4)
        for w in self.job.start_workers(c.pods[1:4]):
            self.job.wait_ready(w)
            # Descriptors as container runtimes give them (Docker's and containerd 1.x's
            # default: 1048576), not a soft 1024: past 1023, select() fails.
            subprocess.run(
                ["prlimit", f"--pid={w.p.pid}", f"--nofile={NOFILE}:{NOFILE}"], check=True
            )
        self.sshd = sshd_of(c.pods[3])
        self.extra = extra

    def open(self) -> Agent:
        import os

        os.kill(self.sshd, signal.SIGSTOP)
        return self.job.launcher(["/bin/true"], slots=1, names=W3, **self.extra)

    def attack(self, mode: str) -> Agent:
        """The stranger, holding worker-0's data port (it knows only the address)."""
        w0 = self.c.pods[1]
        stranger = Agent(
            self.c,
            self.c.pods[4],
            [sys.executable, "-c", STRANGER, w0.data_address, str(data_port(w0)), mode],
            {"PATH": "/usr/bin:/bin"},
        )
        wait_until(
            lambda: "held" in stranger.stdout(), 30, lambda: f"the stranger: {stranger.stdout()}"
        )
        return stranger

    def close(self) -> None:
        import os

        os.kill(self.sshd, signal.SIGCONT)


class TestDataCheckPort:
    """Finding 2: one stranger holding the data check's port (sending, never reading) or
    flooding it stopped the job (exit 69, a timeout). The port now answers only the
    workers the launcher names, never blocks on a peer and holds few connections."""

    @pytest.mark.parametrize("mode", ["push", "flood"])
    def test_stranger_costs_the_check_nothing(self, five: Cluster, work: Path, mode: str) -> None:
        """With the stranger connected to worker-0's port through the whole check, the job
        runs (exit 0), the check passes, and the worker closes the stranger's
        connection(s) once the launcher has said who may probe it."""
        window = Window(five, work)
        launcher = window.open()
        stranger = window.attack(mode)
        # The window stays open a while with the stranger in it (at scale it lasts seconds):
        # long enough for a worker to take in the 1,500 connections, if it would (the
        # kernel's backlog lets them in at the pace of the clients' SYN retries).
        hold = {"push": 3, "flood": 5}[mode]
        holds_for(lambda: launcher.p.poll() is None, hold, "the launcher waiting for worker-2")
        window.close()
        code, _, err = launcher.finish(timeout=120)
        assert code == 0, err
        assert logs.event(err, "data check ok") is not None, err
        wait_until(lambda: "closed by the worker" in stranger.stdout(), 20, "the stranger shut out")

    def test_control(self, five: Cluster, work: Path) -> None:
        """The same window with no stranger: the job runs and the check passes."""
        window = Window(five, work)
        launcher = window.open()
        data_port(five.pods[1])
        window.close()
        code, _, err = launcher.finish(timeout=120)
        assert code == 0 and logs.event(err, "data check ok") is not None, err


class TestSessionBound:
    """Finding 3: a session (then run by the worker's Python) outlived its bound while a
    stranger held its port: still listening 75 s after the launcher exited. A session now
    ends by its bound whatever its peers and its launcher do (and an alarm ends the
    process past it)."""

    def test_ends_by_its_bound(self, five: Cluster, work: Path) -> None:
        """The launcher is stopped (SIGSTOP: its sessions see no end of input) while the
        stranger holds worker-0's port; the session's port still closes within its bound
        (the launcher's deadline + 5 s here, then the alarm's 5 s)."""
        window = Window(five, work, MPI_DNS_WAIT_SECONDS="8")
        launcher = window.open()
        window.attack("push")
        launcher.signal(signal.SIGSTOP)
        w0 = five.pods[1]
        try:
            wait_until(
                lambda: (
                    w0.netns.run(
                        ["ss", "-Htln", "src", w0.data_address], capture_output=True
                    ).stdout.strip()
                    == ""
                ),
                8 + 5 + 5 + 10,
                "worker-0's data check port to close",
            )
        finally:
            launcher.signal(signal.SIGKILL)
            window.close()


# ---------------------------------------------------------------- a forged report

# What the compromised worker runs, as root in its pod, in place of its PID 1's service of
# the data check (pid1/dataserve.py): the control FIFO made afresh at the path sshd names
# to sessions; to the session that asks for the check, it answers REPORT and then, once
# it has the launcher's line, RESULT (a claim before it is answered, and not taken).
FORGER = r"""
import os, sys
fifo, report, result = sys.argv[1:4]
os.unlink(fifo)
os.mkfifo(fifo, 0o600)
fd = os.open(fifo, os.O_RDWR)
print("ready", flush=True)
state, buf = os.path.dirname(fifo), b""
while True:
    while b"\n" not in buf:
        buf += os.read(fd, 4096)
    line, _, buf = buf.partition(b"\n")
    words = line.decode().split()
    if words[0] == "claim":  # not taken: no liveness for this worker
        with open(f"{state}/control-{words[3]}.out", "w") as answer:
            answer.write("forged\n")
        continue
    pid = words[4]
    break
inp = open(f"{state}/probe-{pid}.in", "rb")
out = open(f"{state}/probe-{pid}.out", "wb")
out.write(report.encode() + b"\n")
out.flush()
print("line", inp.readline().decode().strip(), flush=True)
if result:
    out.write(result.encode() + b"\n")
    out.flush()
inp.read()
"""

W1_DATA = "10.251.0.12"  # job-worker-1's data address, as its record says
STRANGER_PORT = 4444


def forged(**fields: object) -> str:
    """A report as job-worker-1's session would send it, with `fields` changed."""
    real = {
        "nic": "net1",
        "mtu": 1500,
        "addresses": [W1_DATA],
        "rdma": [],
        "memlock": -1,
        "port": STRANGER_PORT,
    }
    return json.dumps({**real, **fields})


# (report, result line after the launcher's line, what the launcher must say)
FORGERIES = {
    # a `port` with spaces: other workers' probe lines would carry the attacker's targets
    "inject": (forged(port=f"1:1500 evil=10.251.0.14:{STRANGER_PORT}"), "", "port is not 1..65535"),
    # the honest workers sent to probe an address of the attacker's choosing
    "redirect": (
        forged(addresses=["10.251.0.14"]),
        "",
        "reports net1 at 10.251.0.14 MTU 1500, but its record says net1 10.251.0.12",
    ),
    "list": ("[]", "", "not a JSON object"),
    "mtu-dict": (forged(mtu={}), "", "data.mtu is not 68..65536"),
    "no-address": (forged(addresses=[]), "", "addresses is empty"),
    "result-list": (forged(), "[]", "probe result that is refused (not a JSON object)"),
}


@pytest.fixture(scope="class")
def compromised(
    tmp_path_factory: pytest.TempPathFactory, netns: None, realmpi: None
) -> Iterator[tuple[Cluster, Job]]:
    """Three workers (worker-1 about to be compromised) and a stranger, kept for the
    class: every forged run fails, so the workers stay up."""
    work = tmp_path_factory.mktemp("compromised")
    work.chmod(0o755)
    with Cluster(["job-launcher", *W3, "stranger"]) as c:
        job = Job(c, work, OMPI4)
        for w in job.start_workers(c.pods[1:4]):
            job.wait_ready(w)
        yield c, job


class TestDataCheckReport:
    """Finding 4: the launcher used a worker's report without validating it: a `port` with
    spaces injected targets into honest workers' probe lines, mistyped fields crashed the
    launcher (exit 70). Each value is now checked like a record's field and must agree
    with the worker's record; anything else refuses that worker (69, naming it)."""

    @pytest.mark.parametrize("forgery", list(FORGERIES))
    def test_forged_report_refuses_the_worker(
        self, compromised: tuple[Cluster, Job], forgery: str
    ) -> None:
        """Exit 69 naming job-worker-1 and what is wrong; no internal error, no mpirun, and no
        honest worker probes the address the forgery names."""
        c, job = compromised
        report, result, said = FORGERIES[forgery]
        w1 = c.pods[2]
        fifo = job.state(w1.name) / CONTROL_FIFO
        forger = Agent(c, w1, [sys.executable, "-c", FORGER, str(fifo), report, result], {})
        listener = Agent(
            c, c.pods[4], [sys.executable, "-c", LISTEN, "10.251.0.14", str(STRANGER_PORT)], {}
        )
        try:
            wait_until(lambda: "ready" in forger.stdout(), 20, lambda: f"forger: {forger.stderr()}")
            wait_until(lambda: "listening" in listener.stdout(), 20, "the stranger's listener")
            done = job.launch(
                ["/bin/true"], slots=1, names=W3, timeout=60, MPI_DNS_WAIT_SECONDS="20"
            )
        finally:
            listener.signal(signal.SIGKILL)
            forger.signal(signal.SIGKILL)
            listener.finish(timeout=10)
            forger.finish(timeout=10)
        assert done.returncode == 69, done.stderr
        assert "internal error" not in done.stderr
        assert "job-worker-1: the data check's session sent a" in done.stderr, done.stderr
        assert said in done.stderr, done.stderr
        assert logs.no_rank_started(done.stderr)
        assert "connection from" not in listener.stdout(), listener.stdout()

    def test_control(self, compromised: tuple[Cluster, Job]) -> None:
        """Worker-1 no longer forging (its FIFO gone: it is left out of the check, said):
        the same job runs."""
        _, job = compromised
        (job.state("job-worker-1") / CONTROL_FIFO).unlink(missing_ok=True)
        done = job.launch(["/bin/true"], slots=1, names=W3, timeout=120)
        assert done.returncode == 0, done.stderr
        assert logs.event(done.stderr, "data check ok") is not None
