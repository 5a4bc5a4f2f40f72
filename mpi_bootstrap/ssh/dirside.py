"""The `dir` exchange (docs/exchanges.md): a directory every pod mounts. The first pod
makes the job's key there; each worker publishes its record there and withdraws a stale
one; the launcher reads them (ssh/dirx.py has the directory's own rules), and writes
`job-done` there after a success, on which the workers end."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence

from mpi_bootstrap.core import records
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey, PlannedFile
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.core.records import Record, RecordError
from mpi_bootstrap.core.spec import Marker, Spec
from mpi_bootstrap.ssh import dirx, keys
from mpi_bootstrap.ssh.sides import Ask, Host, Identity, Mounted, Put, Reader, Side
from mpi_bootstrap.system.retry import PEER, retry_until


def read(ex: dirx.DirExchange, host: Host, last: dict[str, str]) -> Record | None:
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


class _Polled(Reader):
    """Polls the directory for every record not yet in, until all are or the deadline
    (then each missing one is put as None)."""

    def __init__(self, ask: Ask, put: Put) -> None:
        self.ex, self.ask, self.put = dirx.DirExchange(ask.config.exchange_dir or ""), ask, put

    def start(self, hosts: Sequence[Host], stop: threading.Event) -> None:
        args = ({h[1]: h for h in hosts}, stop)
        threading.Thread(target=self._poll, args=args, name="records", daemon=True).start()

    def _poll(self, todo: dict[str, Host], stop: threading.Event) -> None:
        while todo and not stop.is_set():
            for new, host in list(todo.items()):
                if (rec := read(self.ex, host, self.ask.last)) is not None:
                    del todo[new]
                    self.put(("record", new, rec))
            if time.monotonic() >= self.ask.deadline:
                for new in todo:
                    self.put(("record", new, None))
                return
            time.sleep(PEER)


class DirSide(Side):
    def client_key(self, config: Config, *, write: bool, log: Log) -> ClientKey | None:
        ex = dirx.DirExchange(config.exchange_dir or "")  # Config requires it with `dir`
        path = os.path.join(config.state_dir, "id_job")
        job = ex.job_key(keys.make_job_key, log) if write else ex.peek_job_key()
        if job is None:  # --explain: made (or a finished job's replaced) at run time
            return ClientKey(path, "(created at run time)", None)
        # A private copy: ssh reads IdentityFile by path, and the exchange directory is
        # shared (ssh/dirx.py); the copy cannot be swapped under ssh.
        why = "the job's key, copied from the exchange directory into the private state directory"
        return ClientKey(
            path, job.public, PlannedFile(path, job.private, 0o600, why), job.fingerprint
        )

    def collect(self, ask: Ask, hosts: Sequence[Host], *, fetch: bool) -> dict[str, Record]:
        ex = dirx.DirExchange(ask.config.exchange_dir or "")
        found: dict[str, Record] = {}

        def attempt() -> bool | None:
            for host in hosts:
                if host[1] not in found and (rec := read(ex, host, ask.last)) is not None:
                    found[host[1]] = rec
            return True if len(found) == len(hosts) or not fetch else None

        retry_until(ask.deadline, attempt, every=PEER)
        return found

    def reader(self, ask: Ask, put: Put) -> Reader:
        return _Polled(ask, put)

    def where(self, config: Config) -> str:
        return f"in {config.exchange_dir}"

    def identity(self, config: Config, mounted: Mounted | None, log: Log) -> Identity:
        own = super().identity(config, mounted, log)
        key = dirx.DirExchange(config.exchange_dir or "").job_key(keys.make_job_key, log)
        authorized = [*own.authorized, (key.public, f"{config.exchange_dir}/{records.KEY_DIR}")]
        unique = {k: origin for k, origin in reversed(authorized)}  # first origin wins
        return dataclasses.replace(
            own, authorized=tuple(reversed(unique.items())), job=key.fingerprint
        )

    def withdraw(self, config: Config, host: str) -> None:
        # A restarted worker's previous record names a port nobody listens on: withdraw
        # it, so the launcher waits for the new one instead of a dead port.
        dirx.DirExchange(config.exchange_dir or "").withdraw(host)

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
        where = dirx.DirExchange(config.exchange_dir or "").publish(record)
        stop = Marker(
            os.path.join(config.exchange_dir or "", records.DONE_FILE),
            records.done_text(ident.job or ""),
        )
        log("record published", exchange=config.exchange, path=where, port=record.port)
        return Spec(argv=(), env={}, stop=stop)

    def unpublished(self, config: Config, record: Record) -> str | None:
        if dirx.DirExchange(config.exchange_dir or "").read(record.host) != record:
            return f"record not in {config.exchange_dir}"
        return None

    def knock(self, config: Config) -> tuple[int, str] | None:
        return None  # the doctor logs in with the job's key and the records here


SIDE = DirSide()
