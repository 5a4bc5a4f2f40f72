"""The launcher's ssh client config: one block per worker, host keys pinned.

Every name is validated before it is written (hostnames from the hostfile, records from
the exchange), so no peer can inject an ssh option: a line always has the shape
`Keyword value`, and values are hostnames, addresses, ports, paths of our own, or
base64 keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from mpi_bootstrap.core.env import SEND_ENV
from mpi_bootstrap.core.names import (
    is_host,
    is_kex_list,
    is_plain_path,
    is_public_key,
    is_user_name,
)
from mpi_bootstrap.core.records import Record


@dataclasses.dataclass(frozen=True)
class Peer:
    """A worker as ssh will reach it."""

    names: tuple[str, ...]  # every name mpirun may use for it (first: the pinned alias)
    hostname: str  # what ssh connects to
    port: int
    user: str
    host_key: str
    kex: str = ""  # its own KexAlgorithms, where it differs from every worker's (core/kex.py)


class UnsafeValue(ValueError):
    """A value that could change the meaning of the config file."""


def _safe(ok: Callable[[str], bool], what: str) -> Callable[[str], str]:
    """A value as it is, or UnsafeValue where it is not `what`."""

    def check(value: str) -> str:
        if not ok(value):
            raise UnsafeValue(f"{value!r} is not {what}")
        return value

    return check


_name = _safe(is_host, "a hostname or address")
_path = _safe(is_plain_path, "a plain absolute path")
_kex = _safe(is_kex_list, "a KexAlgorithms list")


def check_peer(p: Peer) -> Peer:
    for n in (*p.names, p.hostname):
        _name(n)
    if not p.names:
        raise UnsafeValue("a peer needs a name")
    if not 1 <= p.port <= 65535:
        raise UnsafeValue(f"port {p.port} out of range")
    if not is_user_name(p.user):
        raise UnsafeValue(f"{p.user!r} is not a user name")
    if not is_public_key(p.host_key):
        raise UnsafeValue("host key is not one OpenSSH public key")
    return p


# An idle master (preflight done, mpirun's ssh not yet there, or the job over) lives this
# long; the launcher's supervisor ends the masters with its other leftovers after mpirun.
CONTROL_PERSIST_S = 60
# sun_path holds 107 bytes and a NUL. ssh binds the master at "<dir>/<%C>.<16 random>"
# (%C: 40 hex digits) before renaming it to "<dir>/<%C>": the directory gets the rest.
MAX_CONTROL_DIR = 107 - len("/") - 40 - len(".") - 16


def control_lines(control_dir: str | None) -> list[str]:
    """Connection reuse: the first ssh to a worker (preflight's) becomes the master and
    stays; later ones (mpirun's) run as sessions over it: no new handshake, no new login.
    The socket gives a shell on the worker to whoever can open it: it lives in the
    agent's private (0700) state directory, never in a shared place."""
    if control_dir is None:
        return []
    if len(control_dir) > MAX_CONTROL_DIR:
        raise UnsafeValue(f"{control_dir!r} is too long for a socket path")
    return [
        "  ControlMaster auto",
        f"  ControlPath {_path(control_dir)}/%C",
        f"  ControlPersist {CONTROL_PERSIST_S}",
    ]


def client_config(
    peers: Sequence[Peer],
    *,
    identity: str,
    known_hosts: str,
    connect_timeout: int,
    control_dir: str | None = None,
    kex: str | None = None,
) -> str:
    """`ssh -F` config: pinned host keys, batch mode, the job's key, LD_LIBRARY_PATH sent;
    with `control_dir`, connections kept for reuse (control_lines); with `kex`, the key
    exchange algorithms (core/settings/ checked the list)."""
    common = [
        f"  IdentityFile {_path(identity)}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {_path(known_hosts)}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        f"  ConnectTimeout {int(connect_timeout)}",
        "  ConnectionAttempts 3",
        "  ServerAliveInterval 30",
        f"  SendEnv {' '.join(SEND_ENV)}",
        "  LogLevel ERROR",
        *control_lines(control_dir),
        *([f"  KexAlgorithms {_kex(kex)}"] if kex else []),
    ]
    out = ["# Written by mpi-bootstrap: how this job's ssh reaches its workers."]
    for p in map(check_peer, peers):
        out.append(f"Host {' '.join(dict.fromkeys(p.names))}")
        out.append(f"  HostName {p.hostname}")
        out.append(f"  Port {p.port}")
        out.append(f"  User {p.user}")
        # One known_hosts entry per worker, whatever name or address mpirun uses.
        out.append(f"  HostKeyAlias {p.names[0]}")
        if p.kex and p.kex != kex:  # an older sshd's own (core/kex.py); else Host *'s
            out.append(f"  KexAlgorithms {_kex(p.kex)}")
    # What every worker shares, once, for every host: ssh takes each option from the
    # first block that matches and sets it, and the blocks above set none of these. Not
    # repeated per worker: every ssh reads the whole file (mpirun's, one per worker, too),
    # 18.6 instead of 10.9 ms of CPU each at 512 workers when these were in every block.
    # Anything else (tree spawn to a name not above) is pinned alike.
    out.append("Host *")
    out.extend(common)
    return "\n".join(out) + "\n"


def known_hosts(peers: Sequence[Peer]) -> str:
    return "".join(f"{check_peer(p).names[0]} {p.host_key}\n" for p in peers)


def endpoint(name: str, record: Record) -> str:
    """Where ssh connects: the address the worker published, where its sshd listens.
    DNS can still hold an earlier pod's address (found in the compose test: podman's
    DNS answered with a previous run's address); the record is the worker's own word."""
    return record.addresses[0] if record.addresses else name


def peers(
    records: Mapping[str, Record], names: Mapping[str, tuple[str, ...]], user_override: str | None
) -> list[Peer]:
    """ssh peers from records; `names[new]` lists every name mpirun may use for it."""
    out = []
    for new, rec in records.items():
        out.append(
            Peer(
                names=names[new],
                hostname=endpoint(new, rec),
                port=rec.port,
                user=user_override or rec.user,
                host_key=rec.host_key,
            )
        )
    return out
