"""A job's whole life (core/liveness.py, pid1/monitor.py, pid1/watch.py): a worker lost
while ranks run ends the job in seconds, named (exit 75); a lost launcher frees the
workers; a restarted launcher clears the last launch. Real pods (network, UTS and PID
namespaces: the agent is each pod's PID 1), real sshd, the four real MPIs, a training
loop (tests/support/train.c: an allreduce every 0.2 s). Bounds are short here (5 s);
docs/benchmarks.md has the default's figures (`make chaos`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpi_bootstrap.core import liveness
from tests.conftest import AGENT, NO_SSHD, REAL_MPIS, RealMPI
from tests.support import logs
from tests.support.cluster import Cluster, Pod
from tests.support.job import Agent, Job, pod_processes
from tests.support.programs import compile_program
from tests.support.wait import holds_for, wait_until

BOUND = 5
SOURCE = Path(__file__).parent / "support" / "train.c"
DAEMONS = {"orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy"}


class Trains(dict[str, Path]):
    """The training loop, built for a real MPI the first time a test asks for it (one
    liveness test runs with only its own MPI installed)."""

    def __init__(self, realmpi: dict[str, RealMPI], where: Path) -> None:
        super().__init__()
        self.realmpi, self.where = realmpi, where

    def __missing__(self, kind: str) -> Path:
        self[kind] = compile_program(self.realmpi[kind], self.where, SOURCE)
        return self[kind]


@pytest.fixture(scope="module")
def trains(realmpi: dict[str, RealMPI], root: None) -> Iterator[dict[str, Path]]:
    """The training loop, for each real MPI asked (in a directory every pod can read)."""
    import shutil

    d = Path(tempfile.mkdtemp(prefix="mpib-train-", dir="/run"))
    d.chmod(0o755)
    try:
        yield Trains(realmpi, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


class World:
    """A launcher pod, two worker pods (and a spare launcher pod), each agent its pod's
    PID 1; workers up and ready with the dir exchange."""

    def __init__(self, c: Cluster, work: Path, m: RealMPI, train: Path, **worker_env: str):
        self.c, self.m, self.train = c, m, train
        self.job = Job(c, work, m)
        # The exchange the launcher takes too (dir by default: Job's directory).
        self.exchange = {k: v for k, v in worker_env.items() if k in NET}
        self.workers = [
            Agent(c, pod, [AGENT, "worker"], self.job.env(pod, **worker_env)) for pod in c.pods[1:3]
        ]
        self.job.workers += self.workers
        for w in self.workers:
            self.job.wait_ready(w, **self.exchange)

    def launcher(self, steps: int = 100000, pod: Pod | None = None, **extra: str) -> Agent:
        env = {
            "MPI_BOOTSTRAP_LIVENESS_SECONDS": str(BOUND),
            "MPI_BOOTSTRAP_TERMINATION_LOG": str(self.job.work / "termination-log"),
            **self.exchange,
            **extra,
        }
        if pod is None:
            return self.job.launcher([str(self.train), str(steps), "200"], slots=1, **env)
        argv = self.job.launcher_argv([str(self.train), str(steps), "200"])
        hostfile = self.job.hostfile(1)
        return Agent(
            self.c,
            pod,
            argv,
            self.job.env(
                pod,
                MPI_HOSTFILE=str(hostfile),
                MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(self.job.work / f"{pod.name}-hostfile"),
                **env,
            ),
        )

    def running(self, launcher: Agent, steps: int = 3) -> None:
        """Until every rank has done `steps` steps (the ranks run)."""
        wait_until(
            lambda: launcher.stdout().count(f"step {steps} ") >= 2 or launcher.p.poll() is not None,
            60,
            launcher.stderr,
        )
        assert launcher.p.poll() is None, launcher.stderr()

    def left(self, pod: Pod) -> list[str]:
        """The job's processes still in `pod`: ranks and MPI daemons."""
        return [n for n in pod_processes(pod) if n in DAEMONS or n == self.train.name[:15]]


@pytest.fixture
def world(
    request: pytest.FixtureRequest,
    real_mpi: RealMPI,
    trains: dict[str, Path],
    tmp_path: Path,
    netns: None,
) -> Iterator[World]:
    tmp_path.chmod(0o755)
    extra = getattr(request, "param", {})
    with Cluster(
        ["job-launcher", "job-worker-0", "job-worker-1", "job-launcher-2"],
        pid1=True,
        private_root=True,
    ) as c:
        yield World(c, tmp_path, real_mpi, trains[real_mpi.kind], **extra)


# The net exchange (no job-done poll wakes the workers' loops, as dir's does).
NET = {"MPI_BOOTSTRAP_EXCHANGE": "net", "MPI_BOOTSTRAP_TOKEN": secrets.token_hex(16)}


def cut_off(pod: Pod) -> None:
    """Every link of the pod down: no FIN, no RST, nothing."""
    for iface in ("eth0", "net1"):
        pod.netns.exec_checked(["ip", "link", "set", iface, "down"])


def silence(pod: Pod) -> None:
    """Nothing more of the pod's present TCP connections leaves it (an nftables table in
    its own namespace, gone with it): as if their FIN and RST were lost on the way."""
    listed = pod.netns.run(["ss", "-Htn"], capture_output=True).stdout  # established ones
    rules = []
    for line in listed.splitlines():
        local, peer = line.split()[3:5]
        (address, port), own = peer.rsplit(":", 1), local.rsplit(":", 1)[1]
        if not address.startswith("127."):
            rules.append(f"    ip daddr {address} tcp sport {own} tcp dport {port} drop\n")
    assert rules, listed
    ruleset = (
        "table inet mpib_silence {\n  chain out {\n"
        "    type filter hook output priority 0;\n" + "".join(rules) + "  }\n}\n"
    )
    subprocess.run([*pod.netns.prefix(), "nft", "-f", "-"], input=ruleset, text=True, check=True)


def freeze(pod: Pod, signum: int = signal.SIGSTOP) -> None:
    """Every process of the pod stopped (its kernel still answers), or continued."""
    for pid in pod.netns.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def kill_pod(world: World, index: int) -> None:
    """The worker pod's PID 1 killed: the kernel ends every process of the pod."""
    os.kill(world.c.pid_of(world.workers[index].p), signal.SIGKILL)


# Each MPI's own reaction to a lost daemon (Open MPI 4 waits, Open MPI 5 aborts, hydra
# waits forever) on every MPI with one fault; the faults themselves (what the monitor
# sees: the agent's logic, MPI-free) on one Open MPI and one hydra.
LOST = [
    *(pytest.param(m, "cut-off", id=f"{m}-cut-off") for m in ("openmpi4", "openmpi5")),
    *(pytest.param(m, "cut-off", id=f"{m}-cut-off") for m in ("mpich", "intel")),
    *(
        pytest.param(m, f, id=f"{m}-{f}")
        for m in ("openmpi4", "mpich")
        for f in ("frozen", "killed")
    ),
]


class TestLostWorker:
    """Worker 1 lost while every rank runs its steps: the launcher ends the job (75) within
    the bound, naming the pod, its address and what was seen; the termination message
    says so (no talk of start-up, no signal for an exit code); worker 0's daemon and ranks
    are ended too."""

    @pytest.mark.parametrize(("real_mpi", "fault"), LOST, indirect=["real_mpi"])
    def test_ends_the_job_named(self, world: World, fault: str) -> None:
        launcher = world.launcher()
        world.running(launcher)
        victim = world.c.pods[2]
        start = time.monotonic()
        if fault == "cut-off":
            cut_off(victim)
        elif fault == "frozen":
            freeze(victim)
        else:
            kill_pod(world, 1)
        try:
            code, _, err = launcher.finish(timeout=BOUND + 60)
        finally:
            if fault == "frozen":
                freeze(victim, signal.SIGCONT)
        took = time.monotonic() - start
        assert code == 75, err
        assert took < BOUND + 20, f"{took:.1f} s"  # ends; the figures are the bench's
        lost = logs.named(err, "worker lost")
        assert [e["host"] for e in lost] == ["job-worker-1"], err
        assert lost[0]["address"] == victim.address
        assert "job-worker-1" in err and "lost while the job ran" in err
        assert "did not start" not in err
        message = (world.job.work / "termination-log").read_text()
        assert "exit 75 (a worker was lost while the job ran)" in message
        assert "host: job-worker-1" in message and "phase: ranks running" in message
        wait_until(
            lambda: not world.left(world.c.pods[1]),
            15,
            lambda: f"worker 0's launch to end: {world.left(world.c.pods[1])}",
        )
        # (By mpirun itself where it could still reach them, else by the `stop`.)
        ended = logs.named(world.workers[0].stderr(), "ended launch")
        assert all(e["reason"] == "worker lost" for e in ended), world.workers[0].stderr()

    @pytest.mark.parametrize("world", [NO_SSHD], ids=["agent-ssh-server"], indirect=True)
    @pytest.mark.parametrize(
        ("real_mpi", "fault"),
        [("openmpi4", "killed"), ("mpich", "frozen"), ("openmpi5", "cut-off")],
        indirect=["real_mpi"],
    )
    def test_on_the_agents_ssh_server(self, world: World, fault: str) -> None:
        """The same where the workers serve ssh themselves: a closed channel (hydra's
        proxy keeps its own for the whole job) is not read as a lost worker; a lost one is."""
        assert logs.event(world.workers[0].stderr(), "ssh server", server="agent")
        self.test_ends_the_job_named(world, fault)


@pytest.mark.parametrize("real_mpi", ["openmpi4", "mpich"], indirect=True)  # MPI-free
class TestNoFalseAlarm:
    """A pod stopped for less than the bound, then continued, is no lost pod: the job runs
    to its own end (0)."""

    @pytest.mark.parametrize("who", [2, 0], ids=["a-worker", "the-launcher"])
    def test_stopped_then_continued(self, world: World, who: int) -> None:
        launcher = world.launcher(steps=40)
        world.running(launcher)
        freeze(world.c.pods[who])
        time.sleep(BOUND - 2)  # the fault's length: less than the bound
        freeze(world.c.pods[who], signal.SIGCONT)
        code, out, err = launcher.finish(timeout=120)
        assert code == 0, err
        assert out.count("step 40 ") == 2
        assert not logs.named(err, "worker lost")
        for w in world.workers:
            assert not logs.named(w.stderr(), "launcher lost"), w.stderr()


@pytest.mark.parametrize("real_mpi", ["openmpi4", "mpich"], indirect=True)
class TestLostLauncher:
    """The launcher's pod cut off while ranks run: each worker notices (the bound), waits
    its grace, then ends what the launch started there — no rank is left — and stays up
    for the next launcher (or exits, if told to)."""

    @pytest.mark.parametrize(
        "world",
        [
            {
                "MPI_BOOTSTRAP_LIVENESS_SECONDS": str(BOUND),
                "MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS": "3",
                **exchange,
            }
            for exchange in ({}, NET)
        ],
        ids=["dir", "net"],
        indirect=True,
    )
    def test_frees_the_workers(self, world: World) -> None:
        launcher = world.launcher()
        world.running(launcher)
        cut_off(world.c.pods[0])
        for w in world.workers:
            wait_until(
                lambda w=w: not world.left(w.pod),
                BOUND + 3 + 30,
                lambda w=w: f"{w.pod.name} to end the launch: {world.left(w.pod)}",
            )
            assert logs.named(w.stderr(), "launcher lost"), w.stderr()
            # said once its loop's next turn finds them gone (at most 0.1 s later)
            ended = wait_until(
                lambda w=w: logs.named(w.stderr(), "ended launch"), 5, "'ended launch'"
            )
            assert ended[-1]["reason"] == "launcher lost" and ended[-1]["processes"] > 0
            assert w.p.poll() is None  # still up for the next launcher
        assert launcher.finish(timeout=60)[0] == 75  # it lost every worker meanwhile

    @pytest.mark.parametrize(
        "world",
        [
            {
                "MPI_BOOTSTRAP_LIVENESS_SECONDS": str(BOUND),
                "MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS": "3",
            }
        ],
        indirect=True,
    )
    def test_lost_as_the_ranks_start(self, world: World) -> None:
        """Cut off the moment its gate lets the ranks go (the mark `.all` made), before
        the resident PID 1 it hands mpirun to can ping anyone: every watch was armed
        before that (pid1/monitor.py `arm`), so each worker still ends the launch. Before,
        a watch counted silence only after the monitor's first ping, and the ranks of a
        launcher lost in between ran on (`make chaos`: all 16 workers' ranks left).
        Cut off that early, mpirun's ssh may not have reached a worker yet: one with
        nothing of the job at the cut has nothing to end, but loses the launcher too."""
        launcher = world.launcher()
        mark = world.job.state("job-launcher") / "gate" / ".all.ok"
        wait_until(lambda: mark.exists() or launcher.p.poll() is not None, 60, launcher.stderr)
        cut_off(world.c.pods[0])
        running = {w.pod.name: world.left(w.pod) for w in world.workers}
        assert logs.named(launcher.stderr(), "watches armed"), launcher.stderr()
        for w in world.workers:
            wait_until(
                lambda w=w: logs.named(w.stderr(), "launcher lost") and not world.left(w.pod),
                BOUND + 3 + 30,
                lambda w=w: f"{w.pod.name} to end the launch: {world.left(w.pod)} {w.stderr()}",
            )
            if running[w.pod.name]:  # what ran at the cut was ended by the watch
                wait_until(lambda w=w: logs.named(w.stderr(), "ended launch"), 10, w.stderr)

    @pytest.mark.parametrize(
        "world",
        [
            {
                "MPI_BOOTSTRAP_LIVENESS_SECONDS": str(BOUND),
                "MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS": "3",
                "MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS": "true",
            }
        ],
        indirect=True,
    )
    def test_exits_when_told(self, world: World) -> None:
        launcher = world.launcher()
        world.running(launcher)
        cut_off(world.c.pods[0])
        for w in world.workers:
            code, _, err = w.finish(timeout=BOUND + 3 + 30)
            assert code == 75 and logs.named(err, "ended launch"), err
        launcher.finish(timeout=60)


@pytest.mark.parametrize("real_mpi", ["openmpi4", "intel"], indirect=True)
class TestRestartedLauncher:
    """A launcher started again while the last launch's ranks still run on the workers
    (the old launcher cut off, in this pod or another): its preflight ends them on each
    worker before its own ranks can start, and says how many; its own job then runs."""

    @pytest.mark.parametrize("again", [0, 3], ids=["same-pod", "new-pod"])
    def test_clears_the_last_launch(self, world: World, again: int) -> None:
        first = world.launcher()
        world.running(first)
        old = {w.pod.name: _processes(w.pod) for w in world.workers}
        cut_off(world.c.pods[0])
        if again == 0:
            # The same pod: what its killed launcher's connections would still send once
            # the links are back (the kernel's FIN and RST) never leaves it. Else the
            # daemons ended the last launch themselves before any claim (Intel MPI's
            # proxies did, CI25), and the claim this test is about need not have run.
            silence(world.c.pods[0])
        first.p.kill()  # the old launcher is gone; its ranks are not (bound: 30 s)
        # (Intel MPI's proxy on worker 1 hangs off worker 0's, and may go by itself.)
        stale = {w.pod.name for w in world.workers if world.left(w.pod)}
        assert stale, [pod_processes(w.pod) for w in world.workers]
        if again == 0:  # the same pod, restarted (MPI Operator's OnFailure): links back
            for iface in ("eth0", "net1"):
                world.c.pods[0].netns.exec_checked(["ip", "link", "set", iface, "up"])
        second = world.launcher(steps=10, pod=world.c.pods[again] if again else None)
        code, out, err = second.finish(timeout=120)
        assert code == 0, err
        assert out.count("step 10 ") == 2
        cleared = {e["host"] for e in logs.named(err, "earlier launch cleared")}
        assert cleared and cleared <= {w.pod.name for w in world.workers}, err
        for w in world.workers:
            # What was there before and still is: the pod itself (unshare, the agent as
            # its PID 1) and its ssh server (sshd, or the agent's own); not the last
            # launch's daemon, ranks or sessions.
            now, pod = _processes(w.pod), {w.p.pid, world.c.pid_of(w.p)}
            before = old[w.pod.name]  # the same process: the same pid and start time
            same = {p: n for p, (t, n) in now.items() if before.get(p, ("",))[0] == t}
            left = {p: n for p, n in same.items() if p not in pod and not _ssh_server(p)}
            assert set(left.values()) <= {"sshd"}, left
            ended = [e["reason"] for e in logs.named(w.stderr(), "ended launch")]
            assert ("superseded" in ended) == (w.pod.name in cleared), w.stderr()

    @pytest.mark.parametrize("world", [NO_SSHD], ids=["agent-ssh-server"], indirect=True)
    @pytest.mark.parametrize("again", [0, 3], ids=["same-pod", "new-pod"])
    def test_clears_the_last_launch_on_the_agents_ssh_server(
        self, world: World, again: int
    ) -> None:
        """The same where the workers serve ssh themselves: the claim's session is one of
        the server's own."""
        self.test_clears_the_last_launch(world, again)

    @pytest.mark.parametrize("world", [NET], ids=["net"], indirect=True)
    def test_clears_the_last_launch_with_net(self, world: World) -> None:
        """The same with the net exchange, the new launcher in a new pod: its hello
        replaces the old launcher's key on each worker, then its claim clears the old
        launch (the claim rides preflight's ssh session on every exchange)."""
        self.test_clears_the_last_launch(world, 3)


def _ssh_server(pid: int) -> bool:
    """Whether `pid` is the agent's own ssh server (ssh/server.py)."""
    try:
        return b"mpi_bootstrap.ssh.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _processes(pod: Pod) -> dict[int, tuple[str, str]]:
    """The pod's processes as one read of each /proc/PID/stat: (start time, name) by pid.
    The start time tells a process from a later one given its pid again (pid_max is
    32768 here, and the suite starts processes fast); one gone before its read is not
    there."""
    out = {}
    for pid in pod.netns.pids():
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            i, j = stat.index("("), stat.rindex(")")  # (its name may hold either)
            out[pid] = (stat[j + 2 :].split()[19], stat[i + 1 : j])
    return out


@pytest.mark.parametrize("real_mpi", ["openmpi4"], indirect=True)
class TestStrangers:
    """The watch's UDP ports take datagrams from anyone: what no launcher of this launch
    signed changes nothing — garbage, a flood, and the earlier launch's own datagrams
    replayed (its pings, its final `stop`) while the next launch runs."""

    def test_replay_and_flood_change_nothing(self, world: World, tmp_path: Path) -> None:
        pod = world.workers[0].pod
        capture = tmp_path / "first.pcap"
        dump = subprocess.Popen(
            [
                *pod.netns.prefix(),
                "tcpdump",
                "-i",
                "eth0",
                "-U",
                "--immediate-mode",
                "-w",
                str(capture),
                "udp",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: "listening on" in (dump.stderr.readline() or "x"), 10, "tcpdump")
            # Ended by SIGTERM, as a launcher restarted by its Job: a job that succeeded
            # would write job-done, on which the workers end (the dir exchange).
            first = world.launcher()
            world.running(first)
            time.sleep(2 * liveness.PING_S)  # pings and pongs on the wire
            first.signal(signal.SIGTERM)
            assert first.finish(timeout=60)[0] == 143
            time.sleep(0.5)  # the last datagrams written (--immediate-mode, -U)
        finally:
            dump.terminate()
            dump.wait(timeout=10)
        port = logs.named(world.workers[0].stderr(), "watch")[0]["port"]
        second = world.launcher(steps=40)
        world.running(second)
        stranger = Stranger(world.c.pods[3], pod.address, port)
        stranger.replay(capture)
        stranger.flood(20000)
        holds_for(lambda: second.p.poll() is None, 3, "the second launch running")
        code, out, err = second.finish(timeout=120)
        assert code == 0 and out.count("step 40 ") == 2, err
        said = world.workers[0].stderr()
        assert not logs.named(said, "launcher lost"), said
        assert all(
            e["reason"] in ("superseded", "job over") for e in logs.named(said, "ended launch")
        ), said


def key_holders(c: Cluster) -> list[str]:
    """Processes of the pods that hold a session key where another process could read it
    while ranks run: a 64-hex word in their argv or environment, or the hand-off's spec
    (which carries the key) still open in a memfd (SECURITY.md, promise 36)."""
    import re

    found = []
    for pod in c.pods:
        for pid in pod.netns.pids():
            with contextlib.suppress(OSError):
                for what in ("cmdline", "environ"):
                    if re.search(rb"\b[0-9a-f]{64}\b", Path(f"/proc/{pid}/{what}").read_bytes()):
                        found.append(f"{pod.name} {pid} {what}")
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    with contextlib.suppress(OSError):
                        if "mpi-bootstrap-plan" in os.readlink(fd):
                            found.append(f"{pod.name} {pid} {fd}")
    return found


# Sniffs, in the switch's namespace, the frames arriving from a pod on its port (IF): the
# liveness datagrams of KIND from SRC (to DST, if given) — what a stranger on the pod
# network who saw the traffic has (SECURITY.md's threat model).
#  - `forge AS OUT`: each one re-sent at once with the source address AS, out of the
#    switch's port OUT (to the pod behind it): a pong of one worker as another's;
#  - `relay`: each one's payload written to stdout in hex, for a stranger pod to send on.
SNIFF = r"""
import binascii, socket, struct, sys, time
iface, kind, src, dst, seconds, mode, *more = sys.argv[1:]
rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL: a
rx.bind((iface, 0))  # bridge port's frames reach no tap of one protocol (the bridge takes them)
rx.settimeout(0.5)
if mode == "forge":
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind((more[1], 0))
end, n = time.monotonic() + float(seconds), 0
while time.monotonic() < end:
    try:
        frame = rx.recv(65535)
    except TimeoutError:
        continue
    ip = frame[14:]
    ihl = (ip[0] & 15) * 4
    if frame[12:14] != b"\x08\x00" or ip[9] != 17 or socket.inet_ntoa(ip[12:16]) != src:
        continue
    if dst != "-" and socket.inet_ntoa(ip[16:20]) != dst:
        continue
    payload = ip[ihl + 8:]
    if b'"t":"%s"' % kind.encode() not in payload:
        continue
    n += 1
    if mode == "relay":
        print(binascii.hexlify(payload).decode(), flush=True)
        continue
    head = bytearray(ip[:ihl])
    head[12:16], head[10:12] = socket.inet_aton(more[0]), b"\0\0"
    total = sum(struct.unpack("!%dH" % (ihl // 2), bytes(head)))
    total = (total & 0xFFFF) + (total >> 16)
    head[10:12] = struct.pack("!H", ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF)
    udp = bytearray(ip[ihl:ihl + 8])
    udp[6:8] = b"\0\0"  # no UDP checksum (IPv4 allows it)
    tx.send(frame[:14] + bytes(head) + bytes(udp) + payload)
print("sniffed", n, file=sys.stderr)
"""
# In a stranger's pod: each hex payload of stdin sent to HOST:PORT from its own address;
# on its end, how many datagrams came back (a worker's pongs).
RELAY = r"""
import binascii, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
back = 0
for line in sys.stdin:
    s.sendto(binascii.unhexlify(line.strip()), (host, port))
    try:
        while s.recv(2048):
            back += 1
    except BlockingIOError:
        pass
print(back)
"""


@pytest.mark.parametrize("real_mpi", ["openmpi4"], indirect=True)
class TestSeenTraffic:
    """A stranger on the pod network who saw the liveness traffic (security review 4,
    SECURITY.md promise 36): each worker's datagrams are signed with a key of its own (the
    launch's key and that worker's address), so one worker's pong re-sent with another's
    source address, and the launcher's pings to one worker relayed to another, verify for
    no one. Before, every worker of a launch signed with the one session key."""

    def test_a_pong_resent_as_another_workers(self, world: World) -> None:
        """Every pong of worker 1, re-sent at once with worker 0's source address: the
        job runs to its end (0), nobody is lost. Before: worker 0 was declared lost ("its
        agent restarted": worker 1's boot id), 75, within a round."""
        launcher = world.launcher(steps=40)
        world.running(launcher)
        assert not key_holders(world.c), "a process holds the launch's key where others read"
        w0, w1 = world.c.pods[1], world.c.pods[2]
        argv = ["pong", w1.address, world.c.pods[0].address, "8", "forge", w0.address]
        forger = subprocess.run(
            [
                *world.c.switch.prefix(),
                "python3",
                "-c",
                SNIFF,
                f"p{w1.index}-eth0",
                *argv,
                f"p{world.c.pods[0].index}-eth0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        code, out, err = launcher.finish(timeout=120)
        assert code == 0 and out.count("step 40 ") == 2, err
        assert not logs.named(err, "worker lost"), err
        assert int(forger.stderr.split()[-1]) >= 2, forger.stderr  # pongs re-sent as worker 0's

    def test_pings_for_another_worker_relayed(self, world: World) -> None:
        """Worker 0 cut off from its launcher (a partition: it still reaches the rest of
        the pod network) while a stranger relays it the launcher's pings to worker 1 from
        its own address: worker 0 answers none of them and loses its launcher. Before, it
        took each as a sign of life and answered it, and kept its ranks."""
        from tests.support.faults import Faults

        launcher = world.launcher()
        world.running(launcher)
        w0, w1, stranger = world.c.pods[1], world.c.pods[2], world.c.pods[3]
        port = logs.named(world.workers[0].stderr(), "watch")[0]["port"]
        Faults(world.c).partition(world.c.pods[0], w0)
        seconds = str(BOUND + 4)
        sniff = subprocess.Popen(
            [
                *world.c.switch.prefix(),
                "python3",
                "-c",
                SNIFF,
                f"p{world.c.pods[0].index}-eth0",
                "ping",
                world.c.pods[0].address,
                w1.address,
                seconds,
                "relay",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        relay = subprocess.run(
            stranger.argv(["python3", "-c", RELAY, w0.address, str(port)]),
            stdin=sniff.stdout,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        sniff.wait(timeout=30)
        assert sniff.stderr is not None
        relayed = int(sniff.stderr.read().split()[-1])
        assert relayed >= 2, f"the stranger relayed {relayed} pings"
        assert relay.returncode == 0 and relay.stdout.strip() == "0", relay  # none answered
        world.workers[0].wait_event("launcher lost", timeout=BOUND + 10)
        launcher.finish(timeout=60)


class Stranger:
    """Someone else on the pod network, sending UDP datagrams to a worker's watch."""

    def __init__(self, pod: Pod, address: str, port: int) -> None:
        self.pod, self.address, self.port = pod, address, port

    def send(self, script: str) -> None:
        done = self.pod.run(["python3", "-c", script], timeout=60)
        assert done.returncode == 0, done.stderr

    def replay(self, capture: Path) -> None:
        """Every UDP payload of the capture, again, to the worker's watch port."""
        self.send(
            "import socket, struct\n"
            f"data = open({str(capture)!r}, 'rb').read()[24:]\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "while len(data) >= 16:\n"
            "    n = struct.unpack('<I', data[8:12])[0]; frame = data[16:16 + n]\n"
            "    data = data[16 + n:]\n"
            "    payload = frame[14 + 20 + 8:]\n"
            f"    s.sendto(payload, ({self.address!r}, {self.port}))\n"
        )

    def flood(self, n: int) -> None:
        self.send(
            "import socket, os, json\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "junk = [os.urandom(64), b'{}', json.dumps({'v': 1, 't': 'stop', 's': '0' * 16, "
            "'n': 99, 'm': 'x'}).encode()]\n"
            f"for i in range({n}):\n"
            f"    s.sendto(junk[i % 3], ({self.address!r}, {self.port}))\n"
        )


@pytest.mark.usefixtures("netns", "realmpi")  # an Open MPI 4 job's worker
class TestControlFifo:
    """What comes through a worker's control FIFO (pid1/watch.py) other than a claim
    answered on a FIFO of its own is dropped, and ends nothing: a line that is not a
    claim, and a claim whose answer path is a link planted to somewhere else."""

    def test_refuses_what_is_not_a_claim(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o755)
        with Cluster(["job-worker-0"], pid1=True, private_root=True) as c:
            pod = c.pods[0]
            job = Job(c, tmp_path, REAL_MPIS["openmpi4"])
            w = Agent(c, pod, [AGENT, "worker"], job.env(pod))
            job.wait_ready(w)
            state = job.state(pod.name)
            bystander = c.start(pod, ["sleep", "300"])  # what a wrong claim would end
            target = tmp_path / "not-a-fifo"
            target.write_text("untouched\n")
            (state / "control-4242.out").symlink_to(target)
            with open(state / "control", "w") as fifo:
                fifo.write(f"claim {'0' * 64} 30 4242\n")
                fifo.write("claim short 1\n")
                fifo.write(f"rm -rf / {'a' * 5000}\n")
            w.wait_event("claim refused", pid=4242)
            w.wait_event("control refused")
            assert target.read_text() == "untouched\n"
            holds_for(lambda: bystander.poll() is None, 1, "the bystander running")
            assert not logs.named(w.stderr(), "ended launch"), w.stderr()
            assert not logs.named(w.stderr(), "claimed"), w.stderr()


@pytest.mark.parametrize("world", [{}, NO_SSHD], ids=["openssh", "agent-ssh-server"], indirect=True)
@pytest.mark.parametrize("real_mpi", ["mpich"], indirect=True)
class TestClaimWriter:
    """A claim is what it says: a writer outside the worker's PID namespace (a sidecar
    sharing its state directory, of the agent's user) that names a PID of the pod below
    its sshd ends nothing (security review 5, finding 5a: it named a process of the
    running launch's session, whose daemon and rank were ended, and the launcher exited
    75)."""

    def test_a_claim_naming_another_pid_ends_nothing(self, world: World) -> None:
        launcher = world.launcher(steps=60)
        world.running(launcher)
        w = world.workers[0]
        # MPICH's proxy keeps its ssh session for the whole job: a process below sshd
        proxy = next(p for p in w.pod.netns.pids() if _comm(p) == "hydra_pmi_proxy")
        status = Path(f"/proc/{proxy}/status").read_text().splitlines()
        pid = int(next(s for s in status if s.startswith("NSpid:")).split()[-1])  # the pod's
        state = world.job.state(w.pod.name)
        os.mkfifo(state / f"control-{pid}.out", 0o600)  # where the forger reads the answer
        answer = os.open(state / f"control-{pid}.out", os.O_RDWR | os.O_NONBLOCK)
        try:
            with open(state / "control", "w") as fifo:
                fifo.write(f"claim {secrets.token_hex(32)} 30 {pid}\n")
            w.wait_event("claim refused", pid=pid)
        finally:
            os.close(answer)
        code, _, err = launcher.finish(timeout=120)
        assert code == 0, err
        # (the job's own end, once it wrote job-done, may end what its sessions left)
        ended = [e for e in logs.named(w.stderr(), "ended launch") if e["reason"] != "job over"]
        assert not ended, w.stderr()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
