"""The launcher's side of the exchange: the job's client key, and each worker's record.

Which hosts need ssh at all: mpirun starts ranks on its own node without ssh, so hosts
that are the launcher itself (its hostname, a loopback address, one of its addresses)
are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError, ConfigError, PeerUnavailableError, some
from mpi_bootstrap.core.exchanges import FETCHED, MADE, MOUNTED, OWN, READ, SHARED
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey, PlannedFile
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.core.records import Record, RecordError
from mpi_bootstrap.core.settings import SECRET_SSHD_PORT
from mpi_bootstrap.ssh import dirx, keys
from mpi_bootstrap.ssh import netx as exchange
from mpi_bootstrap.system import account, parallel
from mpi_bootstrap.system.retry import NETWORK, PEER, retry_until


def is_local(name: str, address: str | None, own_name: str, own: frozenset[str]) -> bool:
    """Whether mpirun runs `name`'s ranks here rather than over ssh — mpirun's own rule
    (Open MPI's orte_ifislocal, hydra's alike): the pod's own hostname, `localhost`, or
    an address one of the pod's interfaces holds (lo's 127.0.0.1 among them). Any other
    address is remote, 127.0.0.2 included: mpirun ssh'd to such a host while a
    loopback-is-local rule had turned preflight off."""
    if name.split(".", 1)[0] == own_name.split(".", 1)[0] or name == "localhost":
        return True
    return address is not None and address in own


def client_key(config: Config, *, write: bool, log: Log) -> ClientKey | None:
    """The key the launcher's ssh presents. `write=False` (explain) creates nothing."""
    state, key = config.state_dir, config.ex.key
    if key == MOUNTED:
        src = os.path.join(config.ssh_auth_dir, keys.MOUNT_PRIVATE)
        try:
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError([f"{src}: cannot read the job's key ({exc.strerror})"]) from None
        path = os.path.join(state, "id_job")
        why = "the job's key, copied from the Secret with the mode ssh accepts (mpi-operator #429)"
        return ClientKey(path, keys.public_of(text, src), PlannedFile(path, text, 0o600, why))
    if key == SHARED and config.exchange_dir:
        ex = dirx.DirExchange(config.exchange_dir)
        path = os.path.join(state, "id_job")
        job = ex.job_key(keys.make_job_key, log) if write else ex.peek_job_key()
        if job is None:  # --explain: made (or a finished job's replaced) at run time
            return ClientKey(path, "(created at run time)", None)
        # A private copy: ssh reads IdentityFile by path, and the exchange directory is
        # shared (ssh/dirx.py); the copy cannot be swapped under ssh.
        why = "the job's key, copied from the exchange directory into the private state directory"
        planned = PlannedFile(path, job.private, 0o600, why)
        return ClientKey(path, job.public, planned, job.fingerprint)
    if key == OWN:
        path = os.path.join(state, "id_launcher")
        if not write:
            return ClientKey(path, "(generated at run time)", None)
        pair = keys.generate(path, "mpi-bootstrap launcher key")
        return ClientKey(path, pair.public, None)
    return None


def collect(
    config: Config,
    hosts: Sequence[tuple[str, str, str | None]],
    key: ClientKey | None,
    deadline: float,
    log: Log,
    *,
    fetch: bool,
) -> dict[str, Record]:
    """Each remote host's record, by its rewritten name, before `deadline`.

    `hosts` is (name in the input, name mpirun uses, address). `fetch=False` (explain)
    reads what is already there and never talks to a worker.
    """
    how = config.ex.records
    if how == MADE:
        assert key is not None  # noqa: S101 - client_key() returns one in this mode
        return {new: secret_record(config, key, new, addr) for _, new, addr in hosts}
    records: dict[str, Record] = {}
    last: dict[str, str] = {}  # the last failure per worker, for the error message
    if how == READ and config.exchange_dir:
        records = _collect_dir(
            dirx.DirExchange(config.exchange_dir), hosts, deadline, last, fetch=fetch
        )
    elif how == FETCHED and fetch:
        assert key is not None  # noqa: S101 - see Config
        found = parallel.map_all(
            lambda host: fetch_net(config, key, host, deadline, last), list(hosts), 32
        )
        records = {new: r for (_, new, _), r in zip(hosts, found, strict=True) if r is not None}
    if fetch:
        missing = [new for _, new, _ in hosts if new not in records]
        if missing:
            raise no_record(config, missing, last)
    return records


def secret_record(config: Config, key: ClientKey, new: str, address: str | None) -> Record:
    """The secret exchange's record of a worker: nothing to fetch (the job's key is its
    host key, its sshd on the agreed port)."""
    user = config.ssh_user or account.user()
    port = config.sshd_port or SECRET_SSHD_PORT  # Config sets it: never 0 here
    return Record(new, (address,) if address else (), port, key.public, user)


def no_record(config: Config, missing: Sequence[str], last: Mapping[str, str]) -> BootstrapError:
    """Records still missing at the deadline: whose, where looked, the last failures."""
    where = (
        f"in {config.exchange_dir}"
        if config.ex.records == READ
        else f"on port {config.exchange_port}"
    )
    return PeerUnavailableError(
        f"no record from {some(list(missing))} {where} before the deadline: is the worker "
        "running `mpi-bootstrap worker`?",
        details="\n".join(f"last attempt: {last[m]}" for m in missing if m in last),
        phase="records",
        host=missing[0],
    )


def target_of(name: str) -> str:
    """Whom a hostfile entry names: an address as written, else the pod's hostname (the
    first label of `<pod>.<job>.<ns>.svc`) — what the worker's record must say."""
    return name if is_ip_literal(name) else name.split(".", 1)[0]


def _collect_dir(
    ex: dirx.DirExchange,
    hosts: Sequence[tuple[str, str, str | None]],
    deadline: float,
    last: dict[str, str],
    *,
    fetch: bool,
) -> dict[str, Record]:
    records: dict[str, Record] = {}

    def attempt() -> bool | None:
        for host in hosts:
            if host[1] not in records and (rec := read_dir(ex, host, last)) is not None:
                records[host[1]] = rec
        return True if len(records) == len(hosts) or not fetch else None

    retry_until(deadline, attempt, every=PEER)
    return records


def read_dir(
    ex: dirx.DirExchange, host: tuple[str, str, str | None], last: dict[str, str]
) -> Record | None:
    """A worker's record in the exchange directory, if it is there yet: by the name in
    the hostfile, the name mpirun uses, or (once it resolved) its address."""
    orig, new, addr = host
    try:
        return (
            ex.read_by_address(orig)
            if is_ip_literal(orig)
            else ex.read(orig) or ex.read(new) or (ex.read_by_address(addr) if addr else None)
        )
    except RecordError as exc:
        last[new] = str(exc)
        return None


def fetch_net(
    config: Config,
    key: ClientKey,
    host: tuple[str, str, str | None],
    deadline: float,
    last: dict[str, str],
) -> Record | None:
    """A worker's record from its agent (the net exchange), asked until `deadline`."""
    assert config.token is not None  # noqa: S101 - Config requires it with `net`
    token, port = config.token, config.exchange_port
    orig, new, _ = host

    def attempt() -> Record | None:
        try:
            return exchange.fetch(
                new, port, token, key.public, target=target_of(orig), deadline=deadline
            )
        except exchange.ExchangeRefused as exc:
            raise PeerUnavailableError(str(exc), phase="records", host=new) from None
        except RecordError as exc:
            last[new] = str(exc)  # e.g. a replayed reply: ask again
        except TimeoutError as exc:  # the deadline: the last answer says more
            last.setdefault(new, f"{new}: {exc}")
        except OSError as exc:
            last[new] = f"{new}: {exc.strerror or exc}"
        return None

    return retry_until(deadline, attempt, every=NETWORK)
