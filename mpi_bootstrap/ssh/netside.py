"""The `net` exchange (docs/exchanges.md): the launcher makes its own key and asks each
worker's agent for its record on the exchange port (ssh/netx.py), HMAC-authenticated with
the job's token; a worker's resident PID 1 answers there (ssh/netserver.py)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.core.records import Record, RecordError
from mpi_bootstrap.core.spec import NetExchange, Spec
from mpi_bootstrap.ssh import keys, netx
from mpi_bootstrap.ssh.sides import Ask, Host, Identity, Put, Reader, Side
from mpi_bootstrap.system import parallel
from mpi_bootstrap.system.retry import NETWORK, retry_until


def target_of(name: str) -> str:
    """Whom a hostfile entry names: an address as written, else the pod's hostname (the
    first label of `<pod>.<job>.<ns>.svc`) — what the worker's record must say."""
    return name if is_ip_literal(name) else name.split(".", 1)[0]


def fetch_one(ask: Ask, host: Host) -> Record | None:
    """A worker's record from its agent, asked until the deadline."""
    config, key, deadline, last = ask.config, ask.key, ask.deadline, ask.last
    assert config.token is not None and key is not None  # noqa: S101 - Config, client_key
    token, port = config.token, config.exchange_port
    orig, new, _ = host

    def attempt() -> Record | None:
        try:
            return netx.fetch(
                new, port, token, key.public, target=target_of(orig), deadline=deadline
            )
        except netx.ExchangeRefused as exc:
            raise PeerUnavailableError(str(exc), phase="records", host=new) from None
        except RecordError as exc:
            last[new] = str(exc)  # e.g. a replayed reply: ask again
        except TimeoutError as exc:  # the deadline: the last answer says more
            last.setdefault(new, f"{new}: {exc}")
        except OSError as exc:
            last[new] = f"{new}: {exc.strerror or exc}"
        return None

    return retry_until(deadline, attempt, every=NETWORK)


class _Fetched(Reader):
    """Asks each worker once its name resolved, 32 at a time."""

    def __init__(self, ask: Ask, put: Put) -> None:
        self.ask, self.put = ask, put
        self.pool = parallel.Workers(self._fetch, 32, "records")

    def answered(self, host: Host) -> Record | None:
        self.pool.submit(host)
        return None

    def _fetch(self, host: Host) -> None:
        try:
            rec = fetch_one(self.ask, host)
        except BaseException as exc:  # refused by the worker: said as is
            self.put(("error", exc, None))
            return
        self.put(("record", host[1], rec))


def _listener(config: Config, bind: str) -> socket.socket:
    """The exchange's listening socket, inherited by the resident PID 1."""
    listener = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((bind, config.exchange_port))
    except OSError as exc:
        raise PeerUnavailableError(
            f"net exchange: cannot listen on {bind}:{config.exchange_port} ({exc.strerror})",
            phase="net exchange",
        ) from None
    listener.listen(64)
    listener.set_inheritable(True)
    return listener


class NetSide(Side):
    def client_key(self, config: Config, *, write: bool, log: Log) -> ClientKey | None:
        path = os.path.join(config.state_dir, "id_launcher")
        if not write:
            return ClientKey(path, "(generated at run time)", None)
        return ClientKey(path, keys.generate(path, "mpi-bootstrap launcher key").public, None)

    def collect(self, ask: Ask, hosts: Sequence[Host], *, fetch: bool) -> dict[str, Record]:
        if not fetch:
            return {}
        found = parallel.map_all(functools.partial(fetch_one, ask), list(hosts), 32)
        return {new: r for (_, new, _), r in zip(hosts, found, strict=True) if r is not None}

    def reader(self, ask: Ask, put: Put) -> Reader:
        return _Fetched(ask, put)

    def where(self, config: Config) -> str:
        return f"on port {config.exchange_port}"

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
        assert config.token is not None  # noqa: S101 - Config requires it with `net`
        # detach(): the fd outlives this socket object (else its collection closes the
        # fd before the resident PID 1 inherits it).
        net = NetExchange(
            _listener(config, bind).detach(),
            config.token,
            record.to_dict(),
            authorized,
            tuple(k for k, _ in ident.authorized),
        )
        log(
            "record published",
            exchange=config.exchange,
            port=record.port,
            exchange_port=config.exchange_port,
        )
        return Spec(argv=(), env={}, net=net)

    def knock(self, config: Config) -> tuple[int, str] | None:
        return config.exchange_port, "net exchange port"


SIDE = NetSide()
