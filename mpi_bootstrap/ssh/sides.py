"""What an exchange does (docs/exchanges.md), asked by the launcher, the worker and the
doctor: how the job's key is found, how the launcher reads each worker's record (all at
once, or as the workers come), how a worker publishes its own and withdraws a stale one,
and where the doctor looks. One object per exchange, a module's `SIDE`, which its row in
core/exchanges.py names (`Exchange.side`): a new exchange is that module and that row
(tests/test_exchange_sides.py adds one that reads a listing file). Callers ask the object;
they never compare what kind it is.

The base is the `none` exchange's: ssh as the image configures it, no key, no records.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import socket
import threading
from collections.abc import Callable, Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.exchanges import Exchange
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey
from mpi_bootstrap.core.records import Record
from mpi_bootstrap.core.spec import Spec
from mpi_bootstrap.ssh import keys

# A remote host: (its name in the hostfile, the name mpirun uses, its address if known).
Host = tuple[str, str, str | None]
# What a reader hands the launcher as records arrive: ("record", name mpirun uses,
# the record or None at the deadline) or ("error", the exception, None).
Put = Callable[[tuple[str, object, object]], None]
# The key Secret, where read: its key pair and the keys it authorises (with their origin).
Mounted = tuple[keys.KeyPair, list[tuple[str, str]]]


@dataclasses.dataclass(frozen=True)
class Ask:
    """What reading the records takes: the launcher's key, the deadline, and where each
    worker's last failure is kept (by the name mpirun uses), for the message at the end."""

    config: Config
    key: ClientKey | None
    deadline: float
    last: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Identity:
    """A worker's keys for this start: its host key, and the keys its sshd lets in."""

    host_key_path: str
    host_key_public: str
    authorized: tuple[tuple[str, str], ...]  # (public key, where it came from)
    job: str | None  # the shared job key's fingerprint, where there is one (`job-done`)


class Reader:
    """Reads the records of a pipelined launch's workers as they come (launcher/
    arrivals.py): `start` once with every worker known, `answered` as each one's name
    resolves. Either may hand records to `put`; `answered` may return one at once."""

    def start(self, hosts: Sequence[Host], stop: threading.Event) -> None:
        del hosts, stop

    def answered(self, host: Host) -> Record | None:
        del host
        return None


class Side:
    """The `none` exchange: nothing to read, publish or look for."""

    # The launcher.
    def client_key(self, config: Config, *, write: bool, log: Log) -> ClientKey | None:
        """The key the launcher's ssh presents; `write=False` (--explain) makes nothing."""
        del config, write, log
        return None

    def collect(self, ask: Ask, hosts: Sequence[Host], *, fetch: bool) -> dict[str, Record]:
        """Each host's record by the name mpirun uses, as far as found by the deadline;
        `fetch=False` (--explain) talks to nobody."""
        del ask, hosts, fetch
        return {}

    def reader(self, ask: Ask, put: Put) -> Reader:
        del ask, put
        return Reader()

    def where(self, config: Config) -> str:
        """Where the launcher looks for records, for a message about a missing one."""
        del config
        return "anywhere"

    # The worker.
    def identity(self, config: Config, mounted: Mounted | None, log: Log) -> Identity:
        """The worker's keys: a host key of its own, and the keys the key Secret
        authorises where `mounted` (worker/main.py `mounted_keys`) was read."""
        del log
        host = keys.generate(
            os.path.join(config.state_dir, "ssh_host_ed25519_key"),
            f"mpi-bootstrap host key of {socket.gethostname()}",
        )
        return Identity(host.private_path, host.public, tuple(mounted[1]) if mounted else (), None)

    def withdraw(self, config: Config, host: str) -> None:
        """A restarted worker's earlier record, withdrawn before sshd starts."""
        del config, host

    def publish(
        self,
        config: Config,
        record: Record,
        ident: Identity,
        *,
        bind: str,
        authorized: str,
        log: Log,
    ) -> Spec:
        """Make the record known; what the resident PID 1 keeps doing for it (the spec's
        `stop` and `net`). `bind`: the address to serve on; `authorized`: sshd's file."""
        del ident, bind, authorized
        log("record published", exchange=config.exchange, port=record.port)
        return Spec(argv=(), env={})

    def unpublished(self, config: Config, record: Record) -> str | None:
        """Why the readiness probe is not ready yet as far as the exchange goes, or None."""
        del config, record
        return None

    # The doctor.
    def knock(self, config: Config) -> tuple[int, str] | None:
        """The port the doctor knocks at on each worker and what it is, or None where it
        logs in with the exchange's records instead (doctor/sshcheck.py)."""
        return config.sshd_port or 22, "ssh port"


NONE = Side()


@functools.cache
def _load(module: str) -> Side:
    side = getattr(importlib.import_module(module), "SIDE", None)
    if not isinstance(side, Side):
        raise TypeError(f"{module} has no SIDE")
    return side


def of(ex: Exchange) -> Side:
    """The object that does what `ex` says (its row names the module)."""
    return _load(ex.side) if ex.side else NONE
