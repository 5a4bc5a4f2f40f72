"""The node checks' rules (launcher/nodecheck.py) on reports as core/remote.py's script
prints them; the script itself runs in tests/test_operators.py::test_node_checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mpi_bootstrap.core import nccl, remote
from mpi_bootstrap.launcher import nodecheck, remotecheck

ALL = {"shm", "nccl", "gpus"}
MIB = 1024  # KiB


def node(shm_mib: int = 1024, nccl: str | None = "2.21.5", gpus: int = 0) -> remote.Report:
    lines = ["DAEMON orted /usr/bin/orted", f"SHM {shm_mib * MIB} {shm_mib * MIB}", f"GPUS {gpus}"]
    if nccl:
        lines.append(f"NCCL /opt/nccl lib/libnccl.so.2 {nccl}")  # a path with a space
    return remote.parse("\n".join(lines))


def test_the_report_is_parsed() -> None:
    r = node(64, "2.26.2", 2)
    assert (r.shm, r.nccl, r.gpus) == ((65536, 65536), ("/opt/nccl lib/libnccl.so.2", "2.26.2"), 2)
    assert (
        r.node()
        == "NCCL 2.26.2 (/opt/nccl lib/libnccl.so.2); /dev/shm 64 MiB free of 64 MiB; 2 GPUs"
    )
    old = remote.parse("DAEMON orted /x\nLD \nPATH /bin")  # an agent before the node report
    assert (old.shm, old.nccl, old.gpus, old.node()) == (None, None, 0, "no libnccl.so.2; 0 GPUs")


@pytest.mark.parametrize(
    ("slots", "env", "mib"),
    [(1, {}, 0), (2, {}, 73), (8, {}, 294), (2, {"NCCL_BUFFSIZE": str(1 << 20)}, 49),
     (2, {"NCCL_MIN_NCHANNELS": "4"}, 147), (2, {"NCCL_BUFFSIZE": "4M"}, 73)],
)  # fmt: skip
def test_shm_rule(slots: int, env: dict[str, str], mib: int) -> None:
    """One rank maps nothing; NCCL's own sizes scale it; a value NCCL would not take is
    the default's."""
    assert nodecheck.shm_need(slots, env) >> 20 == mib


def test_small_shm_fails_only_where_nccl_runs_ranks_together() -> None:
    nodes = {"w0": node(64), "w1": node(1024), "w2": node(64, nccl=None)}
    bad, _ = nodecheck.problems(nodes, {"w0": 2, "w1": 2, "w2": 2}, {}, ALL)
    assert [h for h, _ in bad] == ["w0"]
    assert "w0: /dev/shm has 64 MiB free of 64 MiB, and NCCL maps about 73 MiB" in bad[0][1]
    assert "medium: Memory, sizeLimit: 1Gi" in bad[0][1]
    assert nodecheck.problems(nodes, {"w0": 1, "w1": 2, "w2": 2}, {}, ALL)[0] == []
    assert nodecheck.problems(nodes, {"w0": 2}, {}, ALL - {"shm"})[0] == []


def test_nccl_versions_named_with_their_workers() -> None:
    nodes = {f"w{i}": node(nccl="2.26.2" if i == 3 else "2.21.5") for i in range(4)}
    bad, _ = nodecheck.problems(nodes, {}, {}, ALL)
    assert bad[0][0] == "w3"
    assert "2.21.5 on w0 and 2 more (/opt/nccl lib/libnccl.so.2); 2.26.2 on w3" in bad[0][1]
    assert nodecheck.problems(nodes, {}, {}, ALL - {"nccl"})[0] == []
    nodes["w1"] = node(nccl=None)
    nodes["w3"] = node()
    bad, warn = nodecheck.problems(nodes, {}, {}, ALL)
    assert bad == [] and warn == ["no libnccl.so.2 on w1"]


def test_slots_against_gpus() -> None:
    nodes = {"w0": node(gpus=2), "w1": node(gpus=8), "cpu": node(gpus=0, nccl=None)}
    bad, warn = nodecheck.problems(nodes, {"w0": 4, "w1": 2, "cpu": 16}, {}, ALL)
    assert bad == [("w0", "w0: 4 slots but 2 GPUs: ranks would share a GPU; set slots to 2 "
                           "(MPIJob: slotsPerWorker: 2)")]  # fmt: skip
    assert warn == ["w1: 2 slots of 8 GPUs: 6 idle", "no libnccl.so.2 on cpu"]


def test_the_script_finds_nccl_by_name_or_banner(tmp_path: Path) -> None:
    """The version from a versioned file's name, else the banner; none without one."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "libnccl.so.2.21.5").write_bytes(b"\x7fELF")
    (a / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
    (b / "libnccl.so.2").write_bytes(b"\x7fELF\0NCCL version 2.26.2+cuda12.4\0")

    def run(ld: str) -> remote.Report:
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ld}
        out = subprocess.run(
            ["sh", "-c", remote.node()], env=env, capture_output=True, text=True, check=True
        )
        return remote.parse("DAEMON x /x\n" + out.stdout)

    assert run(f"/nowhere:{a}:{b}").nccl == (f"{a}/libnccl.so.2", "2.21.5")
    found = run(f"{b}:{a}")
    assert found.nccl == (f"{b}/libnccl.so.2", "2.26.2")
    assert found.shm is not None and found.shm[0] > 0  # /dev/shm: where NCCL is


def _iface(root: Path, name: str, index: int, state: str = "up") -> Path:
    """An interface as sysfs shows it: its index and operational state."""
    d = root / "class/net" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "ifindex").write_text(f"{index}\n")
    (d / "operstate").write_text(f"{state}\n")
    return d


def _roce(
    root: Path, dev: str, state: str, gids: dict[int, tuple[str, str]], nic: str = "net1"
) -> None:
    """A data NIC's (net1's) RDMA device as sysfs shows it: its port 1's state, GID table
    and GID types (an index without a GID reads as zeros, its type as an error); lo and
    eth0 beside it."""
    _iface(root, "lo", 1, "unknown")
    _iface(root, "eth0", 2)
    port = _iface(root, nic, 3) / "device/infiniband" / dev / "ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs/types").mkdir(parents=True)
    (port / "state").write_text(f"{state}\n")
    for i in range(8):
        gid, kind = gids.get(i, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
        (port / "gids" / str(i)).write_text(gid + "\n")
        if kind:
            (port / "gid_attrs/types" / str(i)).write_text(kind + "\n")


V2 = ("0000:0000:0000:0000:0000:ffff:0afb:000b", "RoCE v2")
V1 = ("fe80:0000:0000:0000:0000:00ff:fe00:000b", "IB/RoCE v1")


@pytest.mark.parametrize(
    ("index", "tables", "found"),
    [
        ("3", [{3: V2}, {3: V2}], []),  # full tables, the index alike
        ("3", [{3: V2}, {0: V1, 1: V2}], ["w1: NCCL_IB_GID_INDEX=3 is empty on mlx5_0/1"]),
        ("3", [{3: V2}, {3: V1}], ["NCCL_IB_GID_INDEX=3 is of another kind on some workers: "
                                   "IB/RoCE v1 on w1 mlx5_0/1; RoCE v2 on w0 mlx5_0/1"]),
        ("", [{0: V1}, {1: V2}], []),  # unpinned: NCCL picks per port
    ],
)  # fmt: skip
def test_pinned_gid_index(index: str, tables: list[dict[int, tuple[str, str]]], found: list[str],
                          tmp_path: Path) -> None:  # fmt: skip
    """Each worker's data NIC's RDMA ports as the script reads them from sysfs (a tree of
    the test's: MPI_BOOTSTRAP_SYSFS), sparse and full GID tables."""
    nodes = {}
    for i, table in enumerate(tables):
        _roce(tmp_path / f"w{i}", "mlx5_0", "4: ACTIVE", table)
        lib = tmp_path / f"w{i}" / "lib"
        lib.mkdir()
        (lib / "libnccl.so.2.21.5").write_bytes(b"\x7fELF")
        (lib / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(lib),
               "NCCL_SOCKET_IFNAME": "==net1", "NCCL_IB_GID_INDEX": index}  # fmt: skip
        script = remote.node(str(tmp_path / f"w{i}"))
        out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
        nodes[f"w{i}"] = remote.parse("DAEMON x /x\n" + out)
        assert nodes[f"w{i}"].ports == (("net1", "mlx5_0/1", "ACTIVE"),)
    bad, _ = nodecheck.problems(nodes, {}, {"NCCL_IB_GID_INDEX": index}, ALL | {"rdma"})
    assert [why.split(": NCCL cannot")[0].split("; NCCL connects")[0] for _, why in bad] == found


def test_rdma_port_down_and_imex() -> None:
    out = "DAEMON x /x\nNCCL /l/libnccl.so.2 2.21.5\nPORT net1 mlx5_1/1 DOWN\nIMEX 0\nGPUS 4"
    r = remote.parse(out)
    env = {"NCCL_MNNVL_ENABLE": "1"}
    bad, _ = nodecheck.problems({"w0": r}, {"w0": 4}, env, {"rdma", "imex"})
    assert bad[0][1].startswith("w0: RDMA port mlx5_1/1 behind the data NIC is DOWN")
    assert bad[1][1].startswith("w0: NCCL_MNNVL_ENABLE=1 but the pod has no IMEX channel")
    assert "resourceClaimTemplateName" in bad[1][1]
    assert nodecheck.problems({"w0": r}, {"w0": 4}, env, {"shm", "nccl", "gpus"})[0] == []


@pytest.mark.parametrize(
    ("value", "down"),
    [
        ("net1", True), ("=net1", True), ("net", True), ("eth", False),
        ("^lo,docker", True), ("ib0,net1", True), ("net1,eth0", True), ("^net", False),
        ("=eth0", False), (None, True),  # unset: NCCL's rule takes all but lo (no ib*)
    ],
)  # fmt: skip
def test_a_down_port_behind_each_form(value: str | None, down: bool, tmp_path: Path) -> None:
    """A DOWN RDMA port behind net1 fails the rdma check (69, named) under every form of
    NCCL_SOCKET_IFNAME that takes net1, by core/nccl.py's rule — the one the ranks get —
    and under none that leaves it out (the script once re-read the variable in shell and
    missed `net`, `^lo,docker`, `ib0,net1`)."""
    root = tmp_path / "w0"
    _roce(root, "mlx5_0", "1: DOWN", {})
    _iface(root, "docker0", 4, "down")
    lib = root / "lib"
    lib.mkdir()
    (lib / "libnccl.so.2.21.5").write_bytes(b"\x7fELF")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(lib),
           **({"NCCL_SOCKET_IFNAME": value} if value is not None else {})}  # fmt: skip
    out = subprocess.run(["sh", "-c", remote.node(str(root))], env=env, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    r = remote.parse("DAEMON x /x\n" + out)
    assert r.ifaces == ("lo", "eth0", "net1")  # docker0 is down: NCCL takes no such one
    bad, _ = nodecheck.problems({"w0": r}, {}, env, {"rdma"}, nccl.Rule(value, ""))
    assert [why.split(" behind")[0] for _, why in bad] == (
        ["w0: RDMA port mlx5_0/1"] if down else []
    )


def test_a_hostile_workers_report_is_shown_escaped_and_bounded() -> None:
    """A compromised worker prints what it likes: its NCCL path and version, its port's
    name and state reach the launcher's message escaped (no terminal control) and cut."""
    evil = "\x1b]0;owned\x07" + "A" * 10_000
    out = (
        f"DAEMON x /x\nNCCL /{evil}/libnccl.so.2 9.9.9\x1b[2J\nPORT net1 {evil}/1 DOWN\x1b[H\n"
        "GPUS 0"
    )
    nodes = {"w0": remote.parse(out), "w1": node()}
    bad, _ = nodecheck.problems(nodes, {}, {}, ALL | {"rdma"})
    text = "\n".join(why for _, why in bad) + remote.parse(out).node()
    assert len(bad) == 2 and "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;owned\\x07" in text and len(text) < 2_000


@pytest.mark.parametrize(
    "line",
    ["SHM ² ²", "SHM 1 ٣", "SHM 9999999999999999999 1", "SHM 1", "GPUS -1", "GPUS 1e3", "IMEX x"],
)
def test_a_report_whose_numbers_do_not_parse_fails_its_worker(line: str) -> None:
    """A number line of anything but bounded ASCII digits (`²` passes str.isdigit and
    fails int(): the launcher once ended 70 with a traceback) is said, and fails that
    worker's check (69 naming it), never the launcher."""
    r = remote.parse(f"DAEMON orted /usr/bin/orted\nLD \nPATH /bin\n{line}")
    assert r.unparsed.startswith(line.split(maxsplit=1)[0]) and "not " in r.unparsed
    check = remote_check()
    said = remotecheck.check_output("w0", f"DAEMON orted /usr/bin/orted\n{line}", check)
    assert said is not None and said.startswith("w0: its node report does not parse (")


def remote_check() -> remotecheck.RemoteCheck:
    from tests.support.machine import MPIS

    return remotecheck.RemoteCheck(MPIS["openmpi4"], prefix=None, want_ld=None)


def test_explain_says_when_none_runs() -> None:
    """--explain's `node checks` row says none runs for a job with no NCCL_* variable
    (it once said they would), and which run otherwise."""
    off = nodecheck.decision(("shm", "nccl"), "default", True, nccl_env=False)
    assert (off.value, off.reason.split(":")[0]) == ("off", "none runs")
    assert nodecheck.decision(("shm", "nccl"), "default", True, nccl_env=True).value == "shm, nccl"
    assert not nodecheck.nccl_job(("shm",), {"PATH": "/bin"})
    assert nodecheck.nccl_job(("shm",), {"NCCL_DEBUG": "INFO"})
