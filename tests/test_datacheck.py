"""The data-plane check: the workers test the data NIC among themselves before mpirun
(launcher/datacheck.py driving dataplane/probe.py over ssh), records carry each data
NIC, and an RDMA data NIC pins NCCL_IB_HCA. Every fault on the simulated cluster is
caused for real: a pod without net1, net1 on another bridge, a link down, a firewall
rejecting TCP, an MTU mismatch and a path that drops jumbo frames."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mpi_bootstrap.core import datanet, records
from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.model import Answer, ClientKey
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.launcher import checks, pipeline, remotecheck, session
from mpi_bootstrap.launcher.plan import Gathered, Plan, build_plan
from mpi_bootstrap.launcher.session import Session
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.ssh.datacheck import mismatch
from mpi_bootstrap.system import parallel
from mpi_bootstrap.worker.main import CONTROL_FIFO
from tests.conftest import AGENT, REAL_MPIS
from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.job import Job
from tests.support.machine import HOST, MPIS
from tests.support.probes import answers, ask
from tests.support.wait import wait_until

HOSTFILE = "pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n"
ADDRESSES = {"pi-worker-0.pi.default.svc": "10.1.0.10", "pi-worker-1.pi.default.svc": "10.1.0.11"}
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "NCCL_DEBUG": "INFO"}
OMPI4 = MPIS["openmpi4"]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL4FbUREZCX4XJ0cFCw6lRx4ehfW10t1GxS1s/M0/Gl2"


class TestPairs:
    """Which workers probe which: O(N), every ring edge both ways, repeatable."""

    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 16, 512])
    def test_ring_both_ways_and_one_random(self, n: int) -> None:
        """Every worker probes both ring neighbours and, past 3 workers, one other: never
        itself, at most 3 per worker, the same pairs for the same seed."""
        pairs = datanet.pairs(n, seed=7)
        assert len(pairs) == len(set(pairs)) <= 3 * n
        assert all(i != j for i, j in pairs)
        for i in range(n if n > 1 else 0):
            assert (i, (i + 1) % n) in pairs and (i, (i - 1) % n) in pairs
        if n > 3:
            assert len(pairs) == 3 * n
        assert pairs == datanet.pairs(n, seed=7)


class TestRecords:
    """A worker's record carries its data NIC, validated like every other field."""

    def test_round_trip(self) -> None:
        """The data NIC survives encoding; a record without one still decodes."""
        nic = datanet.DataNIC("net1", ("10.251.0.11",), 9000, ("mlx5_0",))
        rec = records.Record("w0", ("10.250.0.11",), 2222, KEY, "root", nic)
        assert records.decode(json.dumps(rec.to_dict()), "x") == rec
        plain = records.Record("w0", ("10.250.0.11",), 2222, KEY, "root")
        assert "data" not in plain.to_dict()
        assert records.decode(json.dumps(plain.to_dict()), "x") == plain

    @pytest.mark.parametrize(
        "data",
        [
            {"nic": "net1", "addresses": [], "mtu": 9000},
            {"nic": "net1; rm", "addresses": [], "mtu": 9000, "rdma": []},
            {"nic": "net1", "addresses": ["x"], "mtu": 9000, "rdma": []},
            {"nic": "net1", "addresses": [], "mtu": True, "rdma": []},
            {"nic": "net1", "addresses": [], "mtu": 10**6, "rdma": []},
            {"nic": "net1", "addresses": [], "mtu": 1500, "rdma": ["a/b"]},
            [],
        ],
    )
    def test_bad_data_refused(self, data: Any) -> None:
        """A malformed data NIC makes the whole record invalid, naming the field."""
        rec = records.Record("w0", (), 2222, KEY, "root").to_dict()
        with pytest.raises(records.RecordError, match="data"):
            records.record_from({**rec, "data": data})

    @pytest.mark.parametrize(
        "ifaces",
        [["net1;id"], ["eth0", "eth0"], [f"n{i}" for i in range(65)], ["a" * 16], "eth0", [1]],
    )
    def test_bad_ifaces_refused(self, ifaces: Any) -> None:
        """The interfaces a record lists are names, each once, at most 64; else the whole
        record is refused, naming the field. A list that is fine round-trips."""
        rec = records.Record("w0", (), 2222, KEY, "root").to_dict()
        with pytest.raises(records.RecordError, match="ifaces"):
            records.record_from({**rec, "ifaces": ifaces})
        good = records.Record("w0", (), 2222, KEY, "root", None, ("lo", "eth0", "net1"))
        assert records.decode(json.dumps(good.to_dict()), "x") == good


def plan_with(
    nics: dict[str, datanet.DataNIC | None],
    *flags: str,
    env: dict[str, str] | None = None,
    exchange: str = "dir",
    rdma: dict[str, tuple[str, ...]] | None = None,
    ifaces: dict[str, tuple[str, ...] | None] | None = None,
) -> Plan:
    """A launcher plan for test_plan's two workers whose records carry `nics` (by short
    name) and list `ifaces` (by short name; lo, eth0, net1 unless given), the launcher
    having eth0 and net1."""
    return build_plan(
        *facts_with(nics, *flags, env=env, exchange=exchange, rdma=rdma, ifaces=ifaces)
    )


def facts_with(
    nics: dict[str, datanet.DataNIC | None],
    *flags: str,
    env: dict[str, str] | None = None,
    exchange: str = "dir",
    rdma: dict[str, tuple[str, ...]] | None = None,
    ifaces: dict[str, tuple[str, ...] | None] | None = None,
) -> tuple[Config, Gathered]:
    """plan_with's config and facts."""
    listed = {"pi-worker-0": POD, "pi-worker-1": POD, **(ifaces or {})}
    environ = {
        **BASE_ENV,
        "MPI_BOOTSTRAP_EXCHANGE": exchange,
        "MPI_BOOTSTRAP_EXCHANGE_DIR": "/shared/x",
        **(env or {}),
    }
    config = Config.from_env(environ, [*flags, "launcher", "--", "python3", "t.py"], host=HOST)
    recs = {
        n: records.Record(
            n.split(".")[0],
            (a,),
            2222,
            KEY,
            "root",
            nics.get(n.split(".")[0]),
            listed[n.split(".")[0]],
        )
        for n, a in ADDRESSES.items()
    }
    facts = Gathered(
        environ=environ,
        hostfile=hf.parse(HOSTFILE, "/etc/mpi/hostfile"),
        answers={n: Answer(n, addresses=(a,)) for n, a in ADDRESSES.items()},
        mpi=OMPI4,
        interfaces=frozenset({"lo", "eth0", "net1"}),
        is_root=True,
        is_pid1=True,
        client=ClientKey("/run/id", KEY, None),
        records=recs,
        remote=tuple(ADDRESSES),
        rdma=rdma or {},
    )
    return config, facts


def decision(plan: Plan, setting: str) -> Any:
    return next(d for d in plan.decisions if d.setting == setting)


POD = ("lo", "eth0", "net1")
NIC0 = datanet.DataNIC("net1", ("10.2.0.10",), 9000, ("mlx5_3",))
NIC1 = datanet.DataNIC("net1", ("10.2.0.11",), 9000, ("mlx5_1",))


class TestPlan:
    """--explain shows each worker's data NIC; the check and NCCL_IB_HCA are planned."""

    def test_data_nics_explained(self) -> None:
        """Each worker's data NIC, as published, is a decision; the check is on."""
        plan = plan_with({"pi-worker-0": NIC0, "pi-worker-1": NIC1})
        shown = decision(plan, "data NIC pi-worker-0.pi.default.svc")
        assert shown.value == "net1"
        assert "its record: net1 10.2.0.10 MTU 9000, RDMA mlx5_3" in shown.reason
        assert "the data check probes net1" in shown.reason and "WARNING" not in shown.reason
        assert decision(plan, "data check").value == "on"
        assert plan.data_check == {h: ("net1",) for h in ADDRESSES}

    def test_missing_nic_flagged(self) -> None:
        """A worker where the ranks' NCCL_SOCKET_IFNAME selects nothing is flagged in
        --explain, naming the value and the interfaces it has, and planned to fail (69)."""
        other = datanet.DataNIC("dranet0", ("10.3.0.1",), 1500)
        plan = plan_with(
            {"pi-worker-0": None, "pi-worker-1": other},
            ifaces={"pi-worker-0": ("lo", "eth0"), "pi-worker-1": ("lo", "eth0", "dranet0")},
        )
        why = (
            "pi-worker-0.pi.default.svc has no interface NCCL_SOCKET_IFNAME==net1 selects (it "
            "has lo, eth0 up with an address): NCCL fails there"
        )
        assert why in decision(plan, "data NIC pi-worker-0.pi.default.svc").reason
        assert "WARNING" in decision(plan, "data NIC pi-worker-1.pi.default.svc").reason

    def test_record_without_a_list(self) -> None:
        """An older worker's record lists no interfaces: it is taken to have the
        launcher's data NIC, and nothing is refused on that guess."""
        plan = plan_with({"pi-worker-0": NIC0}, ifaces={"pi-worker-0": None})
        d = decision(plan, "data NIC pi-worker-0.pi.default.svc")
        assert (d.value, d.source) == ("net1", "as the launcher's")
        assert plan.data_check["pi-worker-0.pi.default.svc"] == ("net1",)

    @pytest.mark.parametrize(
        ("flags", "env", "why"),
        [
            (("--data-check", "off"), {}, "disabled"),
            ((), {"MPI_BOOTSTRAP_DATA_CHECK": "false"}, "disabled"),
            (("--preflight", "off"), {}, "needs preflight"),
        ],
    )
    def test_off(self, flags: tuple[str, ...], env: dict[str, str], why: str) -> None:
        """Switched off by flag or variable, or without preflight's ssh: no check."""
        plan = plan_with({"pi-worker-0": NIC0}, *flags, env=env)
        assert decision(plan, "data check").value == "off"
        assert why in decision(plan, "data check").reason
        assert plan.data_check == {}

    def test_ib_hca_from_the_rdma_devices(self) -> None:
        """NCCL_IB_HCA names exactly the RDMA devices behind the data NIC (`=`: no prefix
        match), from the records and the launcher's own sysfs, and is forwarded."""
        plan = plan_with(
            {"pi-worker-0": NIC0, "pi-worker-1": NIC1},
            rdma={"net1": ("mlx5_0",), "eth0": ("mlx5_9",)},
        )
        assert plan.env_set["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_3"
        assert "NCCL_IB_HCA" in plan.forwarded
        d = decision(plan, "NCCL_IB_HCA")
        assert "launcher: mlx5_0" in d.reason and "pi-worker-0.pi.default.svc: mlx5_3" in d.reason

    def test_pipelined_launch_refuses_a_changed_environment(self) -> None:
        """The pipelined launch started mpirun from the first worker's record (no RDMA
        behind its data NIC); the second's lists mlx5_1, so NCCL_IB_HCA would differ:
        the launch fails (69) naming the variable, before any rank. Alike: the Plan of
        every fact is the one started. Where mpirun waited for every worker, the Plan of
        every fact replaces the first."""
        plain = datanet.DataNIC("net1", ("10.2.0.10",), 9000)
        config, one = facts_with({"pi-worker-0": plain})
        one = dataclasses.replace(one, records={w: r for w, r in one.records.items() if "-0." in w})
        first = build_plan(config, one)
        assert "NCCL_IB_HCA" not in first.env_set
        job = checks.Job(first, config, first.environment(one.environ), log=lambda *a, **k: None)
        _, every = facts_with({"pi-worker-0": plain, "pi-worker-1": NIC1})
        with pytest.raises(PeerUnavailableError, match="NCCL_IB_HCA==mlx5_1") as err:
            pipeline._final(job, every, None, started=True)
        assert "MPI_BOOTSTRAP_PIPELINE=off" in err.value.message
        _, alike = facts_with({"pi-worker-0": plain, "pi-worker-1": plain})
        assert pipeline._final(job, alike, None, started=True).p.argv == first.argv
        # mpirun waited for every worker: the Plan of every fact replaces the first
        final = pipeline._final(job, every, None, started=False)
        assert final.p.env_set["NCCL_IB_HCA"] == "=mlx5_1" and final.env["NCCL_IB_HCA"]

    def test_user_ib_hca_wins(self) -> None:
        """A user's NCCL_IB_HCA is left alone, and --explain says so."""
        plan = plan_with({"pi-worker-0": NIC0}, env={"NCCL_IB_HCA": "mlx5_7"})
        assert "NCCL_IB_HCA" not in plan.env_set
        assert decision(plan, "NCCL_IB_HCA").value == "(user's)"
        assert "WARNING: it selects none" in decision(plan, "NCCL_IB_HCA").reason
        plan = plan_with({"pi-worker-0": NIC0}, env={"NCCL_IB_HCA": "^=mlx5_1:1"})
        assert "it selects mlx5_3" in decision(plan, "NCCL_IB_HCA").reason

    def test_several_data_nics_in_rounds(self) -> None:
        """A prefix that takes two data NICs on a worker: its check probes both, one round
        each (a worker with one sits out the second), the control interface in none."""
        plan = plan_with(
            {},
            env={"NCCL_SOCKET_IFNAME": "eth,net"},
            ifaces={"pi-worker-0": ("lo", "eth0", "net1", "net2")},
        )
        w0, w1 = ADDRESSES
        assert plan.data_check == {w0: ("net1", "net2"), w1: ("net1",)}
        assert decision(plan, f"data NIC {w0}").value == "eth0, net1, net2"
        assert checks.data_rounds(plan.data_check) == [{w0: "net1", w1: "net1"}, {w0: "net2"}]

    def test_no_rdma_no_ib_hca(self) -> None:
        """Without RDMA devices NCCL_IB_HCA is not set."""
        plain = datanet.DataNIC("net1", ("10.2.0.10",), 1500)
        plan = plan_with({"pi-worker-0": plain, "pi-worker-1": plain})
        assert "NCCL_IB_HCA" not in plan.env_set


class TestFailures:
    """What a failure says: the pair, the addresses, the NIC and the kind."""

    def test_messages(self) -> None:
        """Each kind of failure reads as one precise line."""
        mtu = {
            "peer": "w4",
            "address": "10.2.0.14",
            "port": 40000,
            "mtu": 9000,
            "reaches": 1500,
            "ok": False,
            "kind": "mtu",
        }
        assert datanet.probe_problem("net1", "w3", mtu) == (
            "net1 on w3 reaches w4 (10.2.0.14:40000) only up to 1500 bytes: the MTU is 9000 "
            "(a smaller MTU somewhere on the path; jumbo frames not on every node?)"
        )
        refused = {**mtu, "kind": "refused"}
        assert datanet.probe_problem("net1", "w3", refused) == (
            "net1 on w3 cannot reach w4 (10.2.0.14:40000): refused"
        )
        assert datanet.probe_problem("net1", "w3", {"ok": True}) is None
        missing = {"nic": "net1", "error": "missing", "have": ["eth0", "lo"]}
        assert datanet.listener_problem("w2", missing) == (
            "w2 has no net1 (it has eth0, lo): NCCL_SOCKET_IFNAME=net1 fails there; attach "
            "the data network to it"
        )

    def test_mtu_mismatch(self) -> None:
        """Workers whose MTU differs from the rest are named; equal MTUs pass."""
        facts = {f"w{i}": {"mtu": 9000} for i in range(4)}
        assert mismatch("net1", facts) is None
        facts["w2"] = {"mtu": 1500}
        assert mismatch("net1", facts) == (
            "MTU mismatch: net1 has MTU 9000 on 3 workers but not on w2 (1500): jumbo "
            "frames must be on every node or none"
        )


def _fake_sysfs(root: Path, nic: str, *devices: str) -> Path:
    for dev in devices:
        (root / "class" / "net" / nic / "device" / "infiniband" / dev).mkdir(parents=True)
    return root


def probe_session(nic: str, seconds: float, sysfs: str) -> list[str]:
    """A data check session in a process of its own, on its stdin and stdout, as the
    worker's PID 1 runs one in a forked copy (pid1/dataserve.py)."""
    code = (
        "import sys; from mpi_bootstrap.dataplane import probe; "
        "sys.exit(probe.session(sys.argv[1], float(sys.argv[2]), sys.argv[3]))"
    )
    return [sys.executable, "-c", code, nic, str(seconds), sysfs]


class TestRDMA:
    """The RDMA device behind a netdev, from a sysfs tree given as a parameter, and the
    locked-memory limit checked in a real process under `prlimit`."""

    def test_mapping(self, tmp_path: Path) -> None:
        """`class/net/NIC/device/infiniband/*` names the devices; no tree, none."""
        root = _fake_sysfs(tmp_path, "dranet0", "mlx5_2")
        assert dataprobe.rdma_devices("dranet0", str(root)) == ["mlx5_2"]
        assert dataprobe.rdma_devices("net1", str(root)) == []

    def session_facts(self, sysfs: Path, memlock: str) -> dict[str, Any]:
        """The first line a real session prints for `lo`, run under prlimit."""
        argv = ["prlimit", f"--memlock={memlock}", *probe_session("lo", 5, str(sysfs))]
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
            assert p.stdout is not None and p.stdin is not None
            line = p.stdout.readline()
            p.stdin.close()
            assert p.wait(timeout=10) == 0
        return dict(json.loads(line))

    def test_small_memlock_refused(self, tmp_path: Path) -> None:
        """With an RDMA device behind the NIC, a 64 KiB locked-memory limit is named by host,
        limit and device; the same session as reported with IPC_LOCK's unlimited passes
        (raising the limit needs CAP_SYS_RESOURCE, which a test machine may lack)."""
        root = _fake_sysfs(tmp_path, "lo", "mlx5_0")
        small = self.session_facts(root, "65536:65536")
        assert small["memlock"] == 65536 and small["rdma"] == ["mlx5_0"]
        assert datanet.listener_problem("w1", small) == (
            "w1: locked-memory limit is 64 KiB but lo is RDMA device mlx5_0: NCCL's IB "
            "transport needs it unlimited (give the container IPC_LOCK, or `ulimit -l "
            "unlimited`)"
        )
        assert datanet.listener_problem("w1", {**small, "memlock": -1}) is None
        assert datanet.listener_problem("w1", {**small, "memlock": 2 << 30}) is None

    def test_memlock_without_rdma_not_checked(self, tmp_path: Path) -> None:
        """Without an RDMA device the limit does not matter (NCCL's sockets don't lock)."""
        facts = self.session_facts(tmp_path, "65536:65536")
        assert facts["rdma"] == [] and datanet.listener_problem("w1", facts) is None


# On the simulated cluster -------------------------------------------------------------

W3 = ["job-worker-0", "job-worker-1", "job-worker-2"]


@pytest.fixture
def cluster(netns: None) -> Iterator[Cluster]:
    with Cluster(["job-launcher", *W3]) as c:
        yield c


def run_job(c: Cluster, work: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """One job on fresh workers, which have ended when it returns: the next job's take
    their pods' state directories (one agent holds a state directory at a time)."""
    job = Job(c, work, REAL_MPIS["openmpi4"])
    workers = job.start_workers()
    try:
        for w in workers:
            job.wait_ready(w)
        return job.launch(["/bin/true"], slots=1, names=W3, timeout=120, **extra)
    finally:
        for w in workers:
            if w.p.poll() is None:  # after a failure: they stay up for the next launcher
                w.signal()
            w.finish(timeout=30)


def outer(c: Cluster, i: int, *cmd: str) -> None:
    """`ip link set` on the bridge side of worker i's net1 (pods[i + 1])."""
    c.switch.exec_checked(["ip", "link", "set", f"p{i + 1}-net1", *cmd])


def set_mtu(c: Cluster, mtu: int) -> None:
    for pod in c.pods:
        c.switch.exec_checked(["ip", "link", "set", f"p{pod.index}-net1", "mtu", str(mtu)])
        pod.netns.exec_checked(["ip", "link", "set", "net1", "mtu", str(mtu)])


def other_bridge(c: Cluster) -> None:
    c.switch.exec_checked(["ip", "link", "add", "br-other", "type", "bridge"])
    c.switch.exec_checked(["ip", "link", "set", "br-other", "up"])
    outer(c, 1, "master", "br-other")


def reject_tcp(c: Cluster) -> None:
    ns = c.pods[2].netns  # its own netns: the rules go with it
    ns.exec_checked(["nft", "add", "table", "inet", "mpib"])
    ns.exec_checked(
        ["nft", "add", "chain", "inet", "mpib", "in", "{ type filter hook input priority 0 ; }"]
    )
    ns.exec_checked(
        [
            "nft",
            "add",
            "rule",
            "inet",
            "mpib",
            "in",
            "iifname",
            "net1",
            "meta",
            "l4proto",
            "tcp",
            "reject",
            "with",
            "tcp",
            "reset",
        ]
    )


def one_at_1500(c: Cluster) -> None:
    set_mtu(c, 9000)
    outer(c, 1, "mtu", "1500")
    c.pods[2].netns.exec_checked(["ip", "link", "set", "net1", "mtu", "1500"])


def jumbo_dropped(c: Cluster) -> None:
    set_mtu(c, 9000)
    outer(c, 1, "mtu", "1500")  # the pod's own net1 stays at 9000: a black hole


FAULTS: dict[str, tuple[Callable[[Cluster], None], list[str]]] = {
    "no net1": (
        lambda c: c.pods[2].netns.exec_checked(["ip", "link", "del", "net1"]),
        [
            "job-worker-1 has no interface NCCL_SOCKET_IFNAME==net1 selects (it has lo, eth0 "
            "up with an address)"
        ],
    ),
    "another bridge": (other_bridge, ["net1 on job-worker-1 cannot reach", "no route"]),
    # Down before the worker starts: NCCL takes no interface that is not RUNNING.
    "link down": (
        lambda c: outer(c, 1, "down"),
        ["job-worker-1 has no interface NCCL_SOCKET_IFNAME==net1 selects (it has lo, eth0 "],
    ),
    "tcp rejected": (reject_tcp, ["cannot reach job-worker-1 (10.251.0.12:", "refused"]),
    "mtu mismatch": (
        one_at_1500,
        ["MTU mismatch: net1 has MTU 9000 on 2 workers but not on job-worker-1 (1500)"],
    ),
    "jumbo dropped": (jumbo_dropped, ["job-worker-1", "only up to 1500 bytes: the MTU is 9000"]),
}


@pytest.mark.usefixtures("realmpi")  # Open MPI 4 runs each job
@pytest.mark.timeout(180)
class TestOnTheCluster:
    """Real workers, real sshd, real sockets between the pods' data NICs."""

    def test_happy_path_and_records(self, cluster: Cluster, work: Path) -> None:
        """The check passes on a healthy data network, before mpirun; the workers' records
        carry net1 with its address and MTU; the sessions' ports are closed after. Each
        worker's PID 1 served its session (its sshd names the FIFO: SetEnv), but the one
        whose FIFO is gone, which is left out of the check and said."""
        job = Job(cluster, work, REAL_MPIS["openmpi4"])
        workers = job.start_workers()
        for w in workers:
            job.wait_ready(w)
        (job.state("job-worker-2") / CONTROL_FIFO).unlink()
        done = job.launch(["/bin/true"], slots=1, names=W3, timeout=120)
        assert done.returncode == 0, done.stderr
        served = [logs.event(w.stderr(), "data probe served", partial=True) for w in workers]
        assert [e is not None for e in served] == [True, True, False], served
        assert all(not list(job.state(h).glob("probe-*")) for h in W3)
        unserved = logs.event(done.stderr, "data check not served")
        assert unserved is not None and "job-worker-2" in unserved["hosts"]
        ok = logs.event(done.stderr, "data check ok")
        assert ok is not None and ok["workers"] == 2 and ok["mtu"] == [1500]
        names = [e["event"] for e in logs.events(done.stderr)]
        assert names.index("data check ok") < names.index("checks passed")
        rec = json.loads((work / "exchange" / "job-worker-0.json").read_text())
        assert rec["data"] == {"nic": "net1", "addresses": ["10.251.0.11"], "mtu": 1500, "rdma": []}
        assert rec["ifaces"] == ["lo", "eth0", "net1"]  # what NCCL could use, in its order
        for pod in cluster.pods[1:]:
            listening = pod.netns.run(
                ["ss", "-Htlnu", "src", pod.data_address], capture_output=True
            )
            assert listening.returncode == 0 and listening.stdout.strip() == "", listening

    def test_ipv6_only_data_network(self, cluster: Cluster, work: Path) -> None:
        """A data NIC with IPv6 addresses only: the records carry them, the check probes over
        IPv6 (TCP, then full-MTU datagrams that may not fragment), and a firewall there is
        named with the peer's IPv6 address."""
        for pod in cluster.pods:
            pod.netns.exec_checked(["ip", "-4", "addr", "flush", "dev", "net1"])
            pod.netns.exec_checked(
                ["ip", "-6", "addr", "add", f"fd00:251::{pod.index}/64", "dev", "net1", "nodad"]
            )
        done = run_job(cluster, work)
        assert done.returncode == 0, done.stderr
        ok = logs.event(done.stderr, "data check ok")
        assert ok is not None and ok["probes"] == 6 and ok["mtu"] == [1500]
        rec = json.loads((work / "exchange" / "job-worker-0.json").read_text())
        assert rec["data"]["addresses"] == [f"fd00:251::{cluster.pods[1].index}"]
        reject_tcp(cluster)  # the same firewall, now meeting IPv6
        done = run_job(cluster, work)
        assert done.returncode == 69, done.stderr
        assert f"cannot reach job-worker-1 ([fd00:251::{cluster.pods[2].index}]:" in done.stderr
        assert "refused" in done.stderr and logs.no_rank_started(done.stderr)

    @pytest.mark.parametrize("fault", sorted(FAULTS))
    def test_fault_named_before_mpirun(self, cluster: Cluster, work: Path, fault: str) -> None:
        """Each fault, caused for real, exits 69 before mpirun starts, naming the pair, the
        NIC and the kind."""
        cause, said = FAULTS[fault]
        cause(cluster)
        done = run_job(cluster, work)
        assert done.returncode == 69, done.stderr
        assert logs.no_rank_started(done.stderr)
        for words in said:
            assert words in done.stderr, done.stderr

    def test_doctor_runs_the_same_check(self, cluster: Cluster, work: Path) -> None:
        """`doctor --json` reports this pod's data NIC and, over the pinned ssh config a
        launcher wrote, the same test between the workers: the missing net1 is a finding."""
        cluster.pods[2].netns.exec_checked(["ip", "link", "del", "net1"])
        job = Job(cluster, work, REAL_MPIS["openmpi4"])
        for w in job.start_workers():
            job.wait_ready(w)
        assert job.launch(["/bin/true"], slots=1, names=W3).returncode == 69
        env = job.launcher_env(slots=1, names=W3)
        done = cluster.pods[0].run([AGENT, "doctor", "--json"], env, timeout=60)
        findings = json.loads(done.stdout)["findings"]
        nic = next(f for f in findings if f["check"] == "data NIC")
        assert nic["ok"] and nic["detail"].startswith(
            "NCCL_SOCKET_IFNAME==net1 takes exactly net1: net1; net1 10.251.0.10 MTU 1500, "
            "RDMA none"
        ), nic
        bad = [f for f in findings if f["host"] == "data network" and not f["ok"]]
        assert [f["detail"] for f in bad] == [
            "job-worker-1 has no net1 (it has eth0, lo): NCCL_SOCKET_IFNAME==net1 fails there; "
            "attach the data network to it"
        ], findings
        assert done.returncode == 1

    @pytest.mark.parametrize("fault", ["net2", "no data NIC"])
    def test_doctor_applies_the_rule_on_each_worker(
        self, cluster: Cluster, work: Path, fault: str
    ) -> None:
        """With NCCL_SOCKET_IFNAME=^lo,docker0 the doctor tests each worker on the data NIC
        NCCL picks there, as the launcher does from its record: a worker whose data NIC is
        net2 is probed on net2; one with only the control interface is left out of the
        check, not called a failure (the launcher runs that job)."""
        ns = cluster.pods[2].netns
        if fault == "net2":
            ns.exec_checked(["ip", "link", "set", "net1", "down"])
            ns.exec_checked(["ip", "link", "set", "net1", "name", "net2"])
            ns.exec_checked(["ip", "link", "set", "net2", "up"])
        else:
            ns.exec_checked(["ip", "link", "del", "net1"])
        job = Job(cluster, work, REAL_MPIS["openmpi4"])
        for w in job.start_workers():
            job.wait_ready(w)
        value = {"NCCL_SOCKET_IFNAME": "^lo,docker0"}
        # Its ranks fail (1), so the workers stay up for the doctor (a job done ends them).
        launched = job.launch(["/bin/false"], slots=1, names=W3, **value)
        assert launched.returncode == 1 and logs.event(launched.stderr, "checks passed")
        env = job.launcher_env(slots=1, names=W3, **value)
        done = cluster.pods[0].run([AGENT, "doctor", "--json"], env, timeout=60)
        findings = json.loads(done.stdout)["findings"]
        net = [f for f in findings if f["host"] == "data network"]
        tested, workers = ("net1, net2", 3) if fault == "net2" else ("net1", 2)
        assert [(f["ok"], f["check"]) for f in net] == [(True, tested)], net
        assert net[0]["detail"].startswith(f"{workers} workers, ring and random pairs"), net

    @pytest.mark.parametrize("value", ["^lo,docker0", "=net1", "net"])
    def test_nccl_forms_run(self, cluster: Cluster, work: Path, value: str) -> None:
        """NCCL_SOCKET_IFNAME as users write it, which NCCL accepts (any but lo and docker0,
        exactly net1, every net*): the job runs, the data check probes net1 (the one NCCL
        uses beside the control interface), and --explain names it per worker."""
        job = Job(cluster, work, REAL_MPIS["openmpi4"])
        for w in job.start_workers():
            job.wait_ready(w)
        done = job.launch(["/bin/true"], slots=1, names=W3, NCCL_SOCKET_IFNAME=value)
        assert done.returncode == 0, done.stderr
        ok = logs.event(done.stderr, "data check ok")
        assert ok is not None and (ok["nic"], ok["workers"]) == ("net1", 3), done.stderr
        env = job.launcher_env(slots=1, names=W3, NCCL_SOCKET_IFNAME=value)
        argv = [AGENT, "--explain", "--json", *job.launcher_argv(["/bin/true"])[1:]]
        shown = cluster.pods[0].run(argv, env, timeout=60)
        decisions = {d["setting"]: d for d in json.loads(shown.stdout)["decisions"]}
        assert decisions["data interface"]["value"] == value
        for host in W3:
            d = decisions[f"data NIC {host}"]
            nics = "eth0, net1" if value.startswith("^") else "net1"
            assert (d["value"], d["source"]) == (nics, "exchange record"), d
            assert "the data check probes net1" in d["reason"], d

    def test_off_skips_it(self, cluster: Cluster, work: Path) -> None:
        """MPI_BOOTSTRAP_DATA_CHECK=off: even a pod without net1 does not stop the job (the
        control: the same fault fails it above)."""
        cluster.pods[2].netns.exec_checked(["ip", "link", "del", "net1"])
        done = run_job(cluster, work, MPI_BOOTSTRAP_DATA_CHECK="off")
        assert done.returncode == 0, done.stderr
        assert logs.event(done.stderr, "data check ok") is None


def test_dranet_manifest_locks_memory() -> None:
    """The DraNet example gives both containers IPC_LOCK, as RDMA needs."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "container" / "k8s" / "dranet-allreduce.yaml").read_text()
    assert text.count("IPC_LOCK") == 2, text


# `ssh HOST SCRIPT` played by the local shell: it runs SCRIPT ($2), so preflight's
# sessions are real processes without a worker. A host named "down" is ssh failing.
LOCAL_SSH = [
    "sh",
    "-c",
    '[ "$1" != down ] || { echo "ssh: connect: No route" >&2; exit 255; }; exec sh -c "$2"',
    "ssh",
]


class TestPreflightHandsOverItsSession:
    """With the data check on, preflight's own ssh session goes on to run it (one login per
    worker, not two): a session whose check passed is kept open and handed over; when
    preflight fails, no kept session is left running. The sessions run as the launch's
    `Each` runs them (launcher/pipeline.py): each on its own, a failure said of its host,
    every kept session released on it."""

    def run(self, hosts: list[str], then: str) -> dict[str, Any]:
        check = remotecheck.RemoteCheck(mpi=OMPI4, prefix=None, want_ld=None, then=then)
        sessions = {h: Session(h, LOCAL_SSH, check, BASE_ENV, lambda *a, **k: None) for h in hosts}
        deadline = time.monotonic() + 20
        whys = parallel.map_all(lambda h: sessions[h].until_done(deadline, None, None), hosts, 4)
        if failed := [(h, why) for h, why in zip(hosts, whys, strict=True) if why]:
            session.release(sessions.values())
            raise session.failure(sessions[failed[0][0]], failed[0][1])
        return {h: s.kept for h, s in sessions.items() if s.kept is not None}

    def test_kept_after_the_check(self) -> None:
        """Each session prints the check's report, then runs `then`, which reads the
        session's stdin: it is still running, and ends once its stdin closes."""
        kept = self.run(["a", "b"], 'echo "then $$"; read line; echo "got $line"')
        assert sorted(kept) == ["a", "b"]
        for lines in kept.values():
            first = lines.next(time.monotonic() + 10)
            assert first is not None and first.startswith("then ")
            assert lines.child.poll() is None  # waiting on its stdin
            lines.child.stdin.write(b"hello\n")
            lines.child.stdin.flush()
            assert lines.next(time.monotonic() + 10) == "got hello"
            code, _ = children.close_piped(lines.child)
            assert code == 0

    def test_none_left_on_a_failure(self, tmp_path: Path) -> None:
        """One host's ssh fails: preflight raises, and the other host's session, which had
        passed and was running `then`, is ended, not left behind."""
        pids = tmp_path / "pids"
        with pytest.raises(PeerUnavailableError, match="down"):
            self.run(["a", "down"], f"echo $$ >> {pids}; exec sleep 60")
        (pid,) = map(int, pids.read_text().split())
        wait_until(
            lambda: not Path(f"/proc/{pid}").exists(),
            5,
            lambda: f"the kept session (pid {pid}) to end",
        )

    def test_handed_over_session_that_dies(self) -> None:
        """A kept session whose program ends at once (its worker fails it) is the data
        check's failure naming the host and what the session said, not a hang; the other
        hosts' sessions are ended too."""
        then = "echo 'data check: this worker broke' >&2; exit 127"
        kept = self.run(["a", "b"], then)
        with pytest.raises(PeerUnavailableError) as err:
            datacheck.run(
                ["a", "b"],
                LOCAL_SSH,
                "net1",
                sysfs="/sys",
                env=BASE_ENV,
                deadline=time.monotonic() + 10,
                log=lambda *a, **k: None,
                opened=kept,
            )
        assert "a: the data check did not start (exit 127" in str(err.value) + err.value.details
        assert "this worker broke" in err.value.details
        assert all(lines.child.poll() is not None for lines in kept.values())

    def test_without_then_nothing_kept(self) -> None:
        """Without the data check the session ends with the check: nothing is handed over."""
        assert self.run(["a"], "") == {}


@pytest.mark.timeout(30)
class TestProbeProgram:
    """The probe program itself, a session as the worker's PID 1 runs one (on its stdin
    and stdout), on loopback: two sessions probe each other and a closed port."""

    def start(self) -> subprocess.Popen[str]:
        argv = probe_session("lo", 20, "/sys")
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def test_pairs_a_closed_port_and_a_bad_target(self) -> None:
        """Each session reaches the other at the full MTU asked for, a closed port is
        `refused`, and a target the program cannot even parse is that target's failure
        (an error in a probe thread must not leave the launcher waiting for its line)."""
        a, b = self.start(), self.start()
        try:
            assert a.stdout is not None and b.stdout is not None
            fa, fb = json.loads(a.stdout.readline()), json.loads(b.stdout.readline())
            ask(a, [f"b=127.0.0.1:{fb['port']}:1500", "closed=127.0.0.1:1:1500", "bad=x"])
            ask(b, [f"a=127.0.0.1:{fa['port']}:1500"])
            got = answers(a, 3)
            assert [r["peer"] for r in got] == ["b", "bad", "closed"]
            assert got[0]["ok"] and got[0]["reaches"] == 1500
            assert not got[1]["ok"] and got[1]["kind"].startswith("error: ")
            assert (got[2]["ok"], got[2]["kind"]) == (False, "refused")
            assert answers(b, 1)[0]["ok"]
        finally:
            for p in (a, b):
                assert p.stdin is not None
                p.stdin.close()
                assert p.wait(timeout=10) == 0  # stdin closed: the session ends
