"""The node checks' rules (launcher/nodecheck.py) on reports as core/remote.py's script
prints them; the script itself runs in tests/test_operators.py::test_node_checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mpi_bootstrap.core import remote
from mpi_bootstrap.launcher import nodecheck

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
            ["sh", "-c", remote.NODE], env=env, capture_output=True, text=True, check=True
        )
        return remote.parse("DAEMON x /x\n" + out.stdout)

    assert run(f"/nowhere:{a}:{b}").nccl == (f"{a}/libnccl.so.2", "2.21.5")
    found = run(f"{b}:{a}")
    assert found.nccl == (f"{b}/libnccl.so.2", "2.26.2")
    assert found.shm is not None and found.shm[0] > 0  # /dev/shm: where NCCL is
