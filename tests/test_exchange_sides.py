"""A new exchange is one module and one row (core/exchanges.py, ssh/sides.py). This module
is the module: a `listing` exchange whose records come from somewhere no exchange reads
them — one file listing every worker, as a controller might write from the Kubernetes
API into a ConfigMap — with the job's key from the Secret, as `secret` has it. Its row
is added here alone; the launcher's real code reads its records (all at once, and as
the workers come in a pipelined launch), says where it looked when one is missing,
and plans ssh pinned to the listed host keys and ports."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from mpi_bootstrap.core import exchanges
from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import Answer, ClientKey
from mpi_bootstrap.core.records import Record, RecordError, record_from
from mpi_bootstrap.launcher.arrivals import Arrivals
from mpi_bootstrap.launcher.model import Gathered
from mpi_bootstrap.launcher.plan import build_plan
from mpi_bootstrap.ssh import keys, peers, secretside
from mpi_bootstrap.ssh.sides import Ask, Host, Put, Reader, Side
from tests.support.machine import HOST, MPIS

LISTING = "listing.json"


def listed(where: str, host: Host, last: dict[str, str]) -> Record | None:
    """The record the listing has for `host` (by its pod name), if it has one yet."""
    path = os.path.join(where, LISTING)
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)["workers"]
        found = [record_from(e) for e in entries]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecordError) as exc:
        last[host[1]] = f"{path}: {exc}"
        return None
    orig, pod = host[0], host[0].split(".", 1)[0]
    return next((r for r in found if r.host == pod or orig in r.addresses), None)


class _Watched(Reader):
    def __init__(self, where: str, deadline: float, last: dict[str, str], put: Put) -> None:
        self.where, self.deadline, self.last, self.put = where, deadline, last, put

    def start(self, hosts: Sequence[Host], stop: threading.Event) -> None:
        threading.Thread(target=self._watch, args=(list(hosts), stop), daemon=True).start()

    def _watch(self, todo: list[Host], stop: threading.Event) -> None:
        while todo and not stop.is_set():
            for host in list(todo):
                if (rec := listed(self.where, host, self.last)) is not None:
                    todo.remove(host)
                    self.put(("record", host[1], rec))
            if time.monotonic() >= self.deadline:
                for host in todo:
                    self.put(("record", host[1], None))
                return
            time.sleep(0.05)


class ListingSide(Side):
    def client_key(self, config: Config, *, write: bool, log: Log) -> ClientKey | None:
        return secretside.SIDE.client_key(config, write=write, log=log)

    def collect(self, ask: Ask, hosts: Sequence[Host], *, fetch: bool) -> dict[str, Record]:
        found: dict[str, Record] = {}
        while True:
            for host in hosts:
                where = ask.config.exchange_dir or ""
                if host[1] not in found and (r := listed(where, host, ask.last)):
                    found[host[1]] = r
            if len(found) == len(hosts) or not fetch or time.monotonic() >= ask.deadline:
                return found
            time.sleep(0.05)

    def reader(self, ask: Ask, put: Put) -> Reader:
        return _Watched(ask.config.exchange_dir or "", ask.deadline, ask.last, put)

    def where(self, config: Config) -> str:
        return f"in {config.exchange_dir}/{LISTING}"


SIDE = ListingSide()
ROW = exchanges.Exchange(
    "listing",
    exchanges.MOUNTED,
    "listed",
    side=__name__,
    mounted=True,
    needs=("exchange_dir",),
    needs_what="MPI_BOOTSTRAP_EXCHANGE_DIR (where the listing is)",
    trust="records listed in {c.exchange_dir}/" + LISTING,
)
# TEST-NET-2 addresses, written as such: they resolve at once, nothing is sent to them.
WORKERS = {"198.51.100.10": "pi-worker-0", "198.51.100.11": "pi-worker-1"}
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL4FbUREZCX4XJ0cFCw6lRx4ehfW10t1GxS1s/M0/Gl2"


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Config, Gathered, Path]]:
    """A launcher's Config on the listing exchange (its Secret and listing directory in
    `tmp_path`), the facts before DNS, and the listing's directory."""
    monkeypatch.setitem(exchanges.EXCHANGES, "listing", ROW)
    secret, listing, state = tmp_path / "secret", tmp_path / "listing", tmp_path / "state"
    for d in (secret, listing, state):
        d.mkdir(mode=0o700)
    keys.generate(str(secret / keys.MOUNT_PRIVATE), "the job's key")
    env = {
        "MPI_BOOTSTRAP_EXCHANGE_DIR": str(listing),
        "MPI_BOOTSTRAP_SSH_AUTH_DIR": str(secret),
        "MPI_BOOTSTRAP_MPI": "openmpi4",
    }
    argv = ["--state-dir", str(state), "launcher", "--", "python3", "train.py"]
    config = dataclasses.replace(Config.from_env(env, argv, host=HOST), exchange="listing")
    assert config.ex is ROW
    text = "".join(f"{a} slots=1\n" for a in WORKERS)
    facts = Gathered(
        environ=env,
        hostfile=hf.parse(text, "/etc/mpi/hostfile"),
        answers={},
        mpi=MPIS["openmpi4"],
        interfaces=frozenset({"lo", "eth0"}),
        is_root=True,
        is_pid1=True,
        client=peers.client_key(config, write=True, log=lambda *a, **k: None),
        remote=tuple(WORKERS),
        deadline=time.monotonic() + 5,
    )
    yield config, facts, listing


def write_listing(listing: Path, pods: Sequence[str]) -> None:
    entries = [
        Record(name, (address,), 2200 + i, HOST_KEY, "root").to_dict()
        for i, (address, name) in enumerate(WORKERS.items())
        if name in pods
    ]
    tmp = listing / f".{LISTING}"
    tmp.write_text(json.dumps({"workers": entries}))
    tmp.replace(listing / LISTING)


def hosts() -> list[Host]:
    return [(a, a, a) for a in WORKERS]


def test_records_are_read_from_the_listing(pod: tuple[Config, Gathered, Path]) -> None:
    """The launcher's collect reads each worker's record from the listing; the plan pins
    ssh to the listed host keys and ports, and `ssh trust` says the row's words."""
    config, facts, listing = pod
    write_listing(listing, WORKERS.values())
    found = peers.collect(config, hosts(), facts.client, facts.deadline, print, fetch=True)
    assert {r.host: r.port for r in found.values()} == {"pi-worker-0": 2200, "pi-worker-1": 2201}
    answers = {a: Answer(a, addresses=(a,)) for a in WORKERS}
    plan = build_plan(config, dataclasses.replace(facts, answers=answers, records=found))
    cfg = next(f.text for f in plan.files if f.path.endswith("/ssh_config"))
    assert "Host 198.51.100.11\n" in cfg and "  Port 2201\n" in cfg
    trust = next(d for d in plan.decisions if d.setting == "ssh trust")
    assert (trust.value, trust.reason.split(";")[0]) == (
        "listing",
        f"records listed in {listing}/{LISTING}",
    )


def test_a_worker_missing_from_the_listing(pod: tuple[Config, Gathered, Path]) -> None:
    """One worker never listed: 69 by the deadline, naming it and where it was looked for."""
    config, facts, listing = pod
    write_listing(listing, ["pi-worker-0"])
    deadline = time.monotonic() + 0.5
    with pytest.raises(PeerUnavailableError, match=f"198.51.100.11 in {listing}/{LISTING}"):
        peers.collect(config, hosts(), facts.client, deadline, print, fetch=True)


def test_pipelined_workers_come_as_they_are_listed(pod: tuple[Config, Gathered, Path]) -> None:
    """In a pipelined launch the listing's reader hands each worker's record in as it is
    listed: worker-0 is ready while worker-1 is not yet listed, then worker-1 is."""
    config, facts, listing = pod
    arrivals = Arrivals(config, facts, lambda *a, **k: None)
    write_listing(listing, ["pi-worker-0"])
    arrivals.start()
    try:
        ready: list[str] = []

        def until(want: set[str]) -> None:
            end = time.monotonic() + 5
            while not want <= set(ready) and time.monotonic() < end:
                for event in arrivals.wait(0.1):
                    ready.extend(arrivals.handle(event))
            assert want <= set(ready), ready

        until({"198.51.100.10"})
        assert "198.51.100.11" not in ready
        write_listing(listing, WORKERS.values())
        until(set(WORKERS))
    finally:
        arrivals.stop.set()
