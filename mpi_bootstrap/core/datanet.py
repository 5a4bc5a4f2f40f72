"""The data plane: what a worker says about its data NIC (in its record, and when the
check runs), which pairs of workers test the path between them, and what a failure is
called. Pure; the check's program is dataplane/probe.py, its driver
ssh/datacheck.py.

Pairs: every worker probes its neighbours in ring order, both ways, and one other
worker chosen at random (seeded, so a run can be repeated): at most 3·N probes for N
workers, all at once.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from mpi_bootstrap.core.errors import shown
from mpi_bootstrap.core.names import is_ip_literal

# NCCL's IB transport registers memory: a small locked-memory limit fails it, or sends
# it back to TCP. Unlimited (-1), or at least this much, is what RDMA pods are given.
MIN_MEMLOCK = 1 << 30
RDMA_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NIC_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
MAX_IFACES = 64  # interfaces a record lists (the ones NCCL could use: core/nccl.py)
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
        return {
            "nic": self.nic,
            "addresses": list(self.addresses),
            "mtu": self.mtu,
            "rdma": list(self.rdma),
        }

    def summary(self) -> str:
        rdma = f", RDMA {','.join(self.rdma)}" if self.rdma else ""
        return f"{self.nic} {' '.join(self.addresses) or '(no address)'} MTU {self.mtu}{rdma}"


def listed(value: Any, most: int, ok: Callable[[str], object]) -> bool:
    """Whether `value` is a list of at most `most` strings, each `ok`."""
    return (
        isinstance(value, list)
        and len(value) <= most
        and all(isinstance(v, str) and ok(v) for v in value)
    )


def ifaces_from(data: Any) -> tuple[str, ...]:
    """Validate a record's `ifaces`: interface names, each once, at most MAX_IFACES."""
    if not listed(data, MAX_IFACES, NIC_NAME.fullmatch) or len(set(data)) != len(data):
        raise ValueError("ifaces is not a list of interface names")
    return tuple(data)


def data_from(data: Any) -> DataNIC:
    """Validate the `data` of a record: exactly these fields, typed and in range."""
    if not isinstance(data, dict) or set(data) != {"nic", "addresses", "mtu", "rdma"}:
        raise ValueError("data is not {nic, addresses, mtu, rdma}")
    nic, addrs, mtu, rdma = data["nic"], data["addresses"], data["mtu"], data["rdma"]
    if not isinstance(nic, str) or not NIC_NAME.fullmatch(nic):
        raise ValueError("data.nic is not an interface name")
    if not listed(addrs, 16, is_ip_literal):
        raise ValueError("data.addresses is not a list of IP addresses")
    if type(mtu) is not int or not 68 <= mtu <= 65536:
        raise ValueError("data.mtu is not 68..65536")
    if not listed(rdma, 16, RDMA_NAME.fullmatch):
        raise ValueError("data.rdma is not a list of device names")
    return DataNIC(nic, tuple(addrs), mtu, tuple(rdma))


# What a data check's session says (dataplane/probe.py) comes from the worker: a
# compromised one is inside the threat model (SECURITY.md). Its values build the other
# workers' probe lines and the launcher's messages, so each is checked like a record's
# field, and anything else refuses that worker (tests/test_datacheck_attacks.py::
# TestDataCheckReport).
_REPORT = {"nic", "mtu", "addresses", "rdma", "memlock", "port"}
_RESULT = {"peer", "ok", "kind", "address", "port", "mtu", "reaches"}


def _int(value: Any, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} is not {low}..{high}")
    return value


def session_report(data: Any, nic: str) -> dict[str, Any]:
    """A session's first line, validated: its data NIC `nic` as the worker found it and
    the port it opened (`nic`, `mtu`, `addresses`, `rdma`, `memlock`, `port`), or why it
    cannot take part (`nic`, `error`; `have`, the interfaces it has, when the NIC is
    missing). ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("nic") != nic:
        raise ValueError(f"it reports on {shown(str(data.get('nic')), 20)}, not {nic}")
    if "error" in data:
        error, have = data["error"], data.get("have", [])
        if not isinstance(error, str) or not error or not set(data) <= _REPORT | {"error", "have"}:
            raise ValueError("not an error report")
        if not listed(have, 64, NIC_NAME.fullmatch):
            raise ValueError("have is not a list of interface names")
        return {"nic": nic, "error": shown(error), "have": list(have)}
    if set(data) != _REPORT:
        raise ValueError(f"fields {sorted(set(map(str, data)) ^ _REPORT)} unexpected or missing")
    found = data_from({k: data[k] for k in ("nic", "addresses", "mtu", "rdma")})
    if not found.addresses:
        raise ValueError("addresses is empty")
    return {
        **found.to_dict(),
        "memlock": _int(data["memlock"], -1, 1 << 62, "memlock"),
        "port": _int(data["port"], 1, 65535, "port"),
    }


def disagrees(report: Mapping[str, Any], published: DataNIC | None) -> str | None:
    """Why a session's report contradicts the data NIC its worker published in its
    record (where both exist), or None: the address its probers are sent to must be one
    the record lists, with the record's MTU."""
    if published is None or "error" in report or published.nic != report["nic"]:
        return None
    address, mtu = report["addresses"][0], report["mtu"]
    if (published.addresses and address not in published.addresses) or mtu != published.mtu:
        return (
            f"it reports {report['nic']} at {address} MTU {mtu}, but its record says "
            f"{published.summary()}"
        )
    return None


def probe_line(data: Any, peers: frozenset[str]) -> dict[str, Any]:
    """One line of a session's probes, validated: `{"done": N}`, or a result for one of
    `peers` (`peer`, `ok`, and what failed: `kind`, `address`, `port`, `mtu`,
    `reaches`). ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if set(data) == {"done"}:
        return {"done": _int(data["done"], 0, 1 << 20, "done")}
    if not {"peer", "ok"} <= set(data) <= _RESULT:
        raise ValueError("not a probe result")
    if (
        not isinstance(data["peer"], str)
        or data["peer"] not in peers
        or not isinstance(data["ok"], bool)
    ):
        raise ValueError("not a result for a peer it was given")
    out: dict[str, Any] = {"peer": data["peer"], "ok": data["ok"]}
    for key, check in _RESULT_FIELDS.items():
        if key in data:
            out[key] = check(data[key])
    return out


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("kind is not text")
    return shown(value)


def _address(value: Any) -> str:
    if not isinstance(value, str) or not is_ip_literal(value):
        raise ValueError("address is not an IP address")
    return value


_RESULT_FIELDS: dict[str, Callable[[Any], Any]] = {
    "kind": _text,
    "address": _address,
    "port": lambda v: _int(v, 1, 65535, "port"),
    "mtu": lambda v: _int(v, 68, 65536, "mtu"),
    "reaches": lambda v: _int(v, 0, 65536, "reaches"),
}


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


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def listener_problem(host: str, report: Mapping[str, Any], value: str | None = None) -> str | None:
    """Why `host` cannot take part (its data NIC as the check found it), or None.
    `value`: the NCCL_SOCKET_IFNAME the ranks get, which chose that NIC."""
    nic = report.get("nic", "?")
    error = report.get("error")
    if error == "missing":
        have = ", ".join(report.get("have") or [])
        chose = f"NCCL_SOCKET_IFNAME={value if value is not None else nic}"
        return (
            f"{host} has no {nic} (it has {have or 'no interface'}): {chose} fails "
            "there; attach the data network to it"
        )
    if error:
        return f"{host}: {nic}: {error}"
    rdma, lock = report.get("rdma") or [], report.get("memlock", -1)
    if rdma and lock != -1 and lock < MIN_MEMLOCK:
        return (
            f"{host}: locked-memory limit is {_size(lock)} but {nic} is RDMA device "
            f"{','.join(rdma)}: NCCL's IB transport needs it unlimited (give the "
            "container IPC_LOCK, or `ulimit -l unlimited`)"
        )
    return None


def probe_problem(nic: str, host: str, result: Mapping[str, Any]) -> str | None:
    """The failure one probe found, named by pair, addresses, NIC and kind, or None."""
    if result.get("ok"):
        return None
    peer, kind = result.get("peer", "?"), result.get("kind", "?")
    address = str(result.get("address", "?"))
    where = f"{f'[{address}]' if ':' in address else address}:{result.get('port', '?')}"
    if kind == "mtu":
        return (
            f"{nic} on {host} reaches {peer} ({where}) only up to "
            f"{result.get('reaches')} bytes: the MTU is {result.get('mtu')} (a "
            "smaller MTU somewhere on the path; jumbo frames not on every node?)"
        )
    if kind == "udp":
        return (
            f"{nic} on {host} connects to {peer} ({where}) over TCP, but no UDP "
            "datagram gets an answer at any size (a firewall dropping UDP?)"
        )
    return f"{nic} on {host} cannot reach {peer} ({where}): {kind}"
