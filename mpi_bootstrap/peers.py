"""The launcher's side of the exchange: the job's client key, and each worker's record.

Which hosts need ssh at all: mpirun starts ranks on its own node without ssh, so hosts
that are the launcher itself (its hostname, a loopback address, one of its addresses)
are skipped.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pwd
import time
from collections.abc import Mapping, Sequence

from mpi_bootstrap import exchange, keys, parallel
from mpi_bootstrap.config import Config
from mpi_bootstrap.errors import ConfigError, PeerUnavailableError
from mpi_bootstrap.files import state_dir
from mpi_bootstrap.model import PlannedFile
from mpi_bootstrap.sshconfig import Peer


@dataclasses.dataclass(frozen=True)
class ClientKey:
    path: str  # where ssh will read it
    public: str
    file: PlannedFile | None  # a copy the executor writes (secret mode), else None


def is_local(name: str, address: str | None, own_name: str, own: frozenset[str]) -> bool:
    if name.split(".", 1)[0] == own_name.split(".", 1)[0] or name == "localhost":
        return True
    if address is None:
        return False
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        return False
    return address in own


def client_key(config: Config, *, write: bool) -> ClientKey | None:
    """The key the launcher's ssh presents. `write=False` (explain) creates nothing."""
    state = config.state_dir
    if config.exchange == "secret":
        src = os.path.join(config.ssh_auth_dir, keys.MOUNT_PRIVATE)
        try:
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError([f"{src}: cannot read the job's key ({exc.strerror})"]) from None
        path = os.path.join(state, "id_job")
        return ClientKey(path, keys.public_of(text, src),
                         PlannedFile(path, text, 0o600, "the job's key, copied from the "
                                     "Secret with the mode ssh accepts (mpi-operator #429)"))
    if config.exchange == "dir" and config.exchange_dir:
        ex = exchange.DirExchange(config.exchange_dir)
        if not write and not os.path.isdir(os.path.join(config.exchange_dir, "job-key")):
            return ClientKey(os.path.join(config.exchange_dir, "job-key", "id"),
                             "(created at run time)", None)
        path, public = ex.job_key(lambda p: keys.generate(p, "mpi-bootstrap job key").public)
        return ClientKey(path, public, None)
    if config.exchange == "net":
        path = os.path.join(state, "id_launcher")
        if not write:
            return ClientKey(path, "(generated at run time)", None)
        state_dir(state)
        pair = keys.generate(path, "mpi-bootstrap launcher key")
        return ClientKey(path, pair.public, None)
    return None


def collect(config: Config, hosts: Sequence[tuple[str, str, str | None]],
            key: ClientKey | None, deadline: float, log: object, *, fetch: bool
            ) -> dict[str, exchange.Record]:
    """Each remote host's record, by its rewritten name, before `deadline`.

    `hosts` is (name in the input, name mpirun uses, address). `fetch=False` (explain)
    reads what is already there and never talks to a worker.
    """
    user = config.ssh_user or pwd.getpwuid(os.geteuid()).pw_name
    if config.exchange == "secret":
        assert key is not None  # noqa: S101 - client_key() returns one in this mode
        port = config.sshd_port or 2222
        return {new: exchange.Record(new, (addr,) if addr else (), port, key.public, user)
                for _, new, addr in hosts}
    records: dict[str, exchange.Record] = {}
    last: dict[str, str] = {}  # net: the last failure per worker, for the error message
    if config.exchange == "dir" and config.exchange_dir:
        ex = exchange.DirExchange(config.exchange_dir)
        while True:
            for orig, new, addr in hosts:
                if new not in records:
                    rec = ex.read(orig) or ex.read(new) or (
                        ex.read_by_address(addr) if addr else None)
                    if rec is not None:
                        records[new] = rec
            if len(records) == len(hosts) or not fetch or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    elif config.exchange == "net" and fetch:
        assert key is not None and config.token is not None  # noqa: S101 - see Config

        def one(target: str) -> exchange.Record | None:
            while True:
                try:
                    return exchange.fetch(target, config.exchange_port, config.token or "",
                                          key.public, timeout=2.0)
                except exchange.RecordError as exc:
                    if "refused" in str(exc) or "not signed" in str(exc):
                        raise PeerUnavailableError(str(exc)) from None
                    last[target] = str(exc)  # e.g. a replayed reply: ask again
                except OSError as exc:
                    last[target] = f"{target}: {exc.strerror or exc}"
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.2)

        targets = [new for _, new, _ in hosts]
        for target, rec in zip(targets, parallel.map_all(one, targets, 32), strict=True):
            if rec is not None:
                records[target] = rec
    if fetch:
        missing = [new for _, new, _ in hosts if new not in records]
        if missing:
            where = (f"in {config.exchange_dir}" if config.exchange == "dir"
                     else f"on port {config.exchange_port}")
            raise PeerUnavailableError(
                f"no record from {missing[0]}" + (f" and {len(missing) - 1} more" if
                                                  len(missing) > 1 else "") +
                f" {where} before the deadline: is the worker running `mpi-bootstrap worker`?",
                details="\n".join(f"last attempt: {last[m]}" for m in missing if m in last))
    return records


def endpoint(name: str, record: exchange.Record) -> str:
    """Where ssh connects: the address the worker published, where its sshd listens.
    DNS can still hold an earlier pod's address (found in the compose test: podman's
    DNS answered with a previous run's address); the record is the worker's own word."""
    return record.addresses[0] if record.addresses else name


def peers(records: Mapping[str, exchange.Record], names: Mapping[str, tuple[str, ...]],
          user_override: str | None) -> list[Peer]:
    """ssh peers from records; `names[new]` lists every name mpirun may use for it."""
    out = []
    for new, rec in records.items():
        out.append(Peer(names=names[new], hostname=endpoint(new, rec), port=rec.port,
                        user=user_override or rec.user, host_key=rec.host_key))
    return out
