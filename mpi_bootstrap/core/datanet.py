"""The data plane: what a worker says about its data NIC (in its record, and when the
check runs), which pairs of workers test the path between them, and what a failure is
called. Pure; the check's program is system/dataprobe.py, its driver
ssh/datacheck.py.

Pairs: every worker probes its neighbours in ring order, both ways, and one other
worker chosen at random (seeded, so a run can be repeated): at most 3·N probes for N
workers, all at once.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mpi_bootstrap.core.names import is_ip_literal

# NCCL's IB transport registers memory: a small locked-memory limit fails it, or sends
# it back to TCP. Unlimited (-1), or at least this much, is what RDMA pods are given.
MIN_MEMLOCK = 1 << 30
RDMA_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NIC_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
# A worker's PID 1 serves the check's sessions (pid1/dataserve.py) through a FIFO of
# this name in its state directory, which sshd names to every session in this variable.
PROBE_FIFO = "data-probe"
PROBE_ENV = "MPI_BOOTSTRAP_DATA_PROBE"
# A check's session ends by itself after this, should the launcher vanish; PID 1 serves
# no longer one.
SESSION_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class DataNIC:
    nic: str
    addresses: tuple[str, ...]
    mtu: int
    rdma: tuple[str, ...] = ()  # RDMA devices behind the NIC (sysfs)

    def to_dict(self) -> dict[str, Any]:
        return {"nic": self.nic, "addresses": list(self.addresses), "mtu": self.mtu,
                "rdma": list(self.rdma)}

    def summary(self) -> str:
        rdma = f", RDMA {','.join(self.rdma)}" if self.rdma else ""
        return f"{self.nic} {' '.join(self.addresses) or '(no address)'} MTU {self.mtu}{rdma}"


def choose(configured: str | None, nccl: str, present: frozenset[str],
           candidates: Sequence[str]) -> str | None:
    """A pod's data NIC: the one configured, else NCCL_SOCKET_IFNAME when it names one
    interface, else the first candidate present; None without one."""
    if configured:
        return configured
    if NIC_NAME.fullmatch(nccl):
        return nccl
    return next((n for n in candidates if n in present), None)


def data_from(data: Any) -> DataNIC:
    """Validate the `data` of a record: exactly these fields, typed and in range."""
    if not isinstance(data, dict) or set(data) != {"nic", "addresses", "mtu", "rdma"}:
        raise ValueError("data is not {nic, addresses, mtu, rdma}")
    nic, addrs, mtu, rdma = data["nic"], data["addresses"], data["mtu"], data["rdma"]
    if not isinstance(nic, str) or not NIC_NAME.fullmatch(nic):
        raise ValueError("data.nic is not an interface name")
    if not isinstance(addrs, list) or len(addrs) > 16 or not all(
            isinstance(a, str) and is_ip_literal(a) for a in addrs):
        raise ValueError("data.addresses is not a list of IP addresses")
    if type(mtu) is not int or not 68 <= mtu <= 65536:
        raise ValueError("data.mtu is not 68..65536")
    if not isinstance(rdma, list) or len(rdma) > 16 or not all(
            isinstance(r, str) and RDMA_NAME.fullmatch(r) for r in rdma):
        raise ValueError("data.rdma is not a list of device names")
    return DataNIC(nic, tuple(addrs), mtu, tuple(rdma))


def pairs(n: int, seed: int = 0) -> list[tuple[int, int]]:
    """(from, to) worker indices to probe: ring neighbours both ways, one random other."""
    out: dict[tuple[int, int], None] = {}
    for i in range(n if n > 1 else 0):
        out[(i, (i + 1) % n)] = None
        out[(i, (i - 1) % n)] = None
    rng = random.Random(seed)  # noqa: S311 - which pairs to probe, not a secret
    if n > 3:
        for i in range(n):
            j = rng.choice([k for k in range(i + 2, i + n - 1)]) % n
            out[(i, j)] = None
    return list(out)


def ib_hca(devices: Sequence[str]) -> str:
    """NCCL_IB_HCA naming exactly these devices (`=`: no prefix matching, so mlx5_1 does
    not also take mlx5_10)."""
    return "=" + ",".join(sorted(set(devices)))


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def listener_problem(host: str, facts: Mapping[str, Any]) -> str | None:
    """Why `host` cannot take part (its data NIC as the check found it), or None."""
    nic = facts.get("nic", "?")
    error = facts.get("error")
    if error == "missing":
        have = ", ".join(facts.get("have") or [])
        return (f"{host} has no {nic} (it has {have or 'no interface'}): "
                f"NCCL_SOCKET_IFNAME={nic} fails there; attach the data network to it")
    if error:
        return f"{host}: {nic}: {error}"
    rdma, lock = facts.get("rdma") or [], facts.get("memlock", -1)
    if rdma and lock != -1 and lock < MIN_MEMLOCK:
        return (f"{host}: locked-memory limit is {_size(lock)} but {nic} is RDMA device "
                f"{','.join(rdma)}: NCCL's IB transport needs it unlimited (give the "
                "container IPC_LOCK, or `ulimit -l unlimited`)")
    return None


def probe_problem(nic: str, host: str, result: Mapping[str, Any]) -> str | None:
    """The failure one probe found, named by pair, addresses, NIC and kind, or None."""
    if result.get("ok"):
        return None
    peer, kind = result.get("peer", "?"), result.get("kind", "?")
    address = str(result.get("address", "?"))
    where = f"{f'[{address}]' if ':' in address else address}:{result.get('port', '?')}"
    if kind == "mtu":
        return (f"{nic} on {host} reaches {peer} ({where}) only up to "
                f"{result.get('reaches')} bytes: the MTU is {result.get('mtu')} (a "
                "smaller MTU somewhere on the path; jumbo frames not on every node?)")
    if kind == "udp":
        return (f"{nic} on {host} connects to {peer} ({where}) over TCP, but no UDP "
                "datagram gets an answer at any size (a firewall dropping UDP?)")
    return f"{nic} on {host} cannot reach {peer} ({where}): {kind}"
