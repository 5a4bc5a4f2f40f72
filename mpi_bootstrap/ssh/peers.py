"""The launcher's side of the exchange: the job's client key, and each worker's record,
as its exchange's object (ssh/sides.py) finds them.

Which hosts need ssh at all: mpirun starts ranks on its own node without ssh, so hosts
that are the launcher itself (its hostname, a loopback address, one of its addresses)
are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError, PeerUnavailableError, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey
from mpi_bootstrap.core.records import Record
from mpi_bootstrap.ssh import sides


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
    return sides.of(config.ex).client_key(config, write=write, log=log)


def collect(
    config: Config,
    hosts: Sequence[sides.Host],
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
    last: dict[str, str] = {}  # the last failure per worker, for the error message
    ask = sides.Ask(config, key, deadline, last)
    records = sides.of(config.ex).collect(ask, hosts, fetch=fetch)
    if fetch:
        missing = [new for _, new, _ in hosts if new not in records]
        if missing:
            raise no_record(config, missing, last)
    return records


def no_record(config: Config, missing: Sequence[str], last: Mapping[str, str]) -> BootstrapError:
    """Records still missing at the deadline: whose, where looked, the last failures."""
    where = sides.of(config.ex).where(config)
    return PeerUnavailableError(
        f"no record from {some(list(missing))} {where} before the deadline: is the worker "
        "running `mpi-bootstrap worker`?",
        details="\n".join(f"last attempt: {last[m]}" for m in missing if m in last),
        phase="records",
        host=missing[0],
    )
