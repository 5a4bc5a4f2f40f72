"""A worker's record: where its sshd listens and which host key it presents — the one
thing every exchange carries (`secret` makes it up, `dir` files it, `net` sends it):
`{"v": 1, "host", "addresses", "port", "host_key", "user"}`, `"data"` (the data NIC:
core/datanet.py) when the worker has one, and `"ifaces"` (the interfaces NCCL could use
there, in NCCL's order: the launcher applies the ranks' NCCL_SOCKET_IFNAME to them,
core/nccl.py) when the worker listed them, and `"openssh"` (its sshd's version, `9.2`:
which key exchanges the launcher may offer it, core/kex.py). All are optional: a record
without them (an older worker's) still reads. Nothing in it is secret.

Also what the `dir` exchange's own files say (ssh/dirx.py reads and writes them): a
job is identified by its key, and `job-done` names the key of the job that ended.
Pure: validation only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mpi_bootstrap.core.datanet import DataNIC, data_from, ifaces_from, listed
from mpi_bootstrap.core.kex import version_of
from mpi_bootstrap.core.names import is_dns_name, is_ip_literal, is_public_key, is_user_name

VERSION = 1  # of a record
MAX_MESSAGE = 16384  # bytes: a record, or a net-exchange message

# The dir exchange's names (ssh/dirx.py).
KEY_DIR = "job-key"
DONE_FILE = "job-done"


def is_version(v: Any, version: int = VERSION) -> bool:
    """Exactly the integer `version`: JSON `true` and `1.0` are == 1 in Python."""
    return type(v) is int and v == version


class RecordError(ValueError):
    """A record or message that does not have exactly the expected shape."""


@dataclasses.dataclass(frozen=True)
class Record:
    host: str  # the worker's hostname (pod name)
    addresses: tuple[str, ...]  # its control-interface addresses
    port: int
    host_key: str  # "ssh-ed25519 AAAA…"
    user: str
    data: DataNIC | None = None  # the data NIC, when the worker has one
    ifaces: tuple[str, ...] | None = None  # the interfaces NCCL could use, in its order
    openssh: str | None = None  # its sshd's OpenSSH version ("9.2"), where known
    server: str | None = None  # "agent": it serves ssh itself (ssh/server.py), not sshd

    def to_dict(self) -> dict[str, Any]:
        out = {
            "v": VERSION,
            "host": self.host,
            "addresses": list(self.addresses),
            "port": self.port,
            "host_key": self.host_key,
            "user": self.user,
        }
        if self.data is not None:
            out["data"] = self.data.to_dict()
        if self.ifaces is not None:
            out["ifaces"] = list(self.ifaces)
        if self.openssh is not None:
            out["openssh"] = self.openssh
        if self.server is not None:
            out["server"] = self.server
        return out


def record_from(data: Any) -> Record:
    """Validate a decoded record: every field present, typed and in range; no extras."""
    if not isinstance(data, dict):
        raise RecordError("not a JSON object")
    expected, optional = (
        {"v", "host", "addresses", "port", "host_key", "user"},
        {"data", "ifaces", "openssh", "server"},
    )
    if set(data) - optional != expected:
        raise RecordError(
            f"fields {sorted((set(data) - optional) ^ expected)} unexpected or missing"
        )
    if not is_version(data["v"]):
        raise RecordError(f"version {data['v']!r} is not {VERSION}")
    host, port, key, user, addrs = (
        data["host"],
        data["port"],
        data["host_key"],
        data["user"],
        data["addresses"],
    )
    if not isinstance(host, str) or not is_dns_name(host) or host.endswith("."):
        raise RecordError("host is not a hostname")
    if type(port) is not int or not 1 <= port <= 65535:
        raise RecordError("port is not 1..65535")
    if not isinstance(key, str) or not is_public_key(key):
        raise RecordError("host_key is not one OpenSSH public key (type and base64 only)")
    if not isinstance(user, str) or not is_user_name(user):
        raise RecordError("user is not a user name")
    if not listed(addrs, 16, is_ip_literal):
        raise RecordError("addresses is not a list of IP addresses")
    nic, ifaces, openssh = _optional(data)
    if data.get("server", "agent") != "agent":
        raise RecordError("server is not agent")
    return Record(host, tuple(addrs), port, key, user, nic, ifaces, openssh, data.get("server"))


def _optional(data: dict[str, Any]) -> tuple[DataNIC | None, tuple[str, ...] | None, str | None]:
    """A record's optional fields, validated: its data NIC, NCCL's interfaces, OpenSSH's
    version."""
    openssh = data.get("openssh")
    if openssh is not None and (not isinstance(openssh, str) or version_of(openssh) is None):
        raise RecordError("openssh is not a version (9.2)")
    try:
        nic = data_from(data["data"]) if "data" in data else None
        ifaces = ifaces_from(data["ifaces"]) if "ifaces" in data else None
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    return nic, ifaces, openssh


def decode(text: str | bytes, where: str) -> Record:
    try:
        return record_from(json.loads(text))
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"{where}: {exc}") from None


def is_target(target: str, record: Record) -> bool:
    """Is `target` (a hostname or an address) the worker of `record`? A name matches the
    record's host by its first label (the hostfile may name `<pod>.<job>.<ns>.svc`), an
    address matches one of the record's addresses."""
    if is_ip_literal(target):
        return target in record.addresses
    return is_dns_name(target) and target.split(".", 1)[0].lower() == record.host.lower()


def done_text(key_fingerprint: str) -> str:
    """What `job-done` holds when the job with that key succeeded."""
    return f"done {key_fingerprint}\n"
