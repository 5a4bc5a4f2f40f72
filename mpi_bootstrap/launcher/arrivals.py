"""Workers as they become ready, for the pipelined launch (launcher/pipeline.py).

The DNS wait runs in a thread of its own, and each remote worker's record is had as
soon as it can be, as its exchange's reader (ssh/sides.py) has it: read (the dir
exchange: one thread polls the directory), fetched (net: once its name resolved) or made
(secret). A worker is *ready* once its name resolved and its
record is in. The threads only put what they learn on one queue of events; the
caller's thread takes them (`wait`), holds all the state (`handle`), and learns which
workers became ready. Every thread is a daemon and stops when `stop` is set. Where every
worker comes first (the Plan's `launch order`), `whole` reads them all before any is
taken, as gather.py does for --explain: then every worker is ready at once.
"""

from __future__ import annotations

import dataclasses
import queue
import socket
import threading
from collections.abc import Mapping
from typing import Any

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import Answer
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.core.records import Record
from mpi_bootstrap.launcher import gather
from mpi_bootstrap.launcher.model import Gathered
from mpi_bootstrap.ssh import peers, sides
from mpi_bootstrap.system import netif

Event = tuple[str, Any, Any]  # (kind, what, more): see Arrivals.handle
# How long `wait` sleeps for a first event: the caller's loop also checks the deadline.
TICK = 0.5


@dataclasses.dataclass
class Worker:
    orig: str  # as the hostfile names it
    new: str  # as mpirun names it
    lookup: str  # the name the DNS wait asks
    address: str | None = None
    record: Record | None = None
    ready: bool = False


class Arrivals:
    """The remote workers of `facts` (before_dns's: remote by name), as they arrive."""

    def __init__(self, config: Config, facts: Gathered, log: Log) -> None:
        self.config, self.base, self.log = config, facts, log
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.stop = threading.Event()
        self.workers = {
            new: Worker(orig, new, hf.lookup_name(orig, config.rewrite, config.cluster_domain))
            for orig, new, _ in gather.remote_hosts(config, facts)
        }
        self.answers: dict[str, Answer] = {}
        self.own = (socket.gethostname(), frozenset(netif.addresses()))
        self.local: list[str] = []  # names that resolved to this pod: no workers after all
        self.dns_done = False
        self.last: dict[str, str] = {}  # the last failure reading each worker's record
        self.records = facts.client is not None
        self.reader = sides.Reader()  # `start`: the exchange's, where records are read
        self.at_once = False  # `whole`: every worker read first

    def whole(self) -> None:
        """Every name resolved and every record read (gather.py, its failures as it says
        them), before any worker is taken: all ready at once, no thread started."""
        config = self.config
        answers = gather.wait_for_dns(config, self.base.hostfile, self.own[0], self.log)
        facts = gather.resolved(config, self.base, answers, self.log)
        self.answers, self.dns_done, self.at_once = dict(answers), True, True
        self.workers = {  # by the names mpirun uses now (--rewrite ip: their addresses)
            new: Worker(orig, new, "", addr, facts.records.get(new), ready=True)
            for orig, new, addr in gather.remote_hosts(config, facts)
        }

    def start(self) -> None:
        threading.Thread(target=self._dns, name="dns", daemon=True).start()
        if self.records:
            side = sides.of(self.config.ex)
            ask = sides.Ask(self.config, self.base.client, self.base.deadline, self.last)
            self.reader = side.reader(ask, self.events.put)
            self.reader.start(
                [(w.orig, w.new, w.address) for w in self.workers.values()], self.stop
            )
        for w in self.workers.values():  # an address as written resolves at once
            if is_ip_literal(w.lookup):
                self.events.put(("answer", Answer(w.lookup, addresses=(w.lookup,)), None))

    def wait(self, timeout: float = TICK) -> list[Event]:
        """The events so far: the first within `timeout`, then all that are queued."""
        try:
            out = [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def handle(self, event: Event) -> list[str]:
        """Take one event in; the workers it made ready. A failure is raised here."""
        kind, what, more = event
        if kind == "error":
            raise what
        if kind == "dns":
            self.dns_done = True
            self.answers.update(what)
            return []
        if kind == "answer":
            return self._answer(what)
        if kind == "record":  # (new, Record), or (new, None): not found by the deadline
            if what in self.local:
                return []
            if more is None:
                raise peers.no_record(self.config, [what], self.last)
            self.workers[what].record = more
            return self._ready([self.workers[what]])
        raise ValueError(f"unknown event {kind!r}")

    def _answer(self, answer: Answer) -> list[str]:
        """A name resolved: its workers' addresses; a worker's record fetched or made
        (net, secret); a name that is this pod's own is no worker after all."""
        self.answers[answer.name] = answer
        found = [w for w in self.workers.values() if w.lookup == answer.name]
        for w in found:
            w.address = answer.addresses[0]
            if peers.is_local(w.new, w.address, *self.own):  # mpirun runs it here
                del self.workers[w.new]
                self.local.append(w.new)
                continue
            if w.record is None:
                w.record = self.reader.answered((w.orig, w.new, w.address))
        return self._ready([w for w in found if w.new in self.workers])

    def _ready(self, workers: list[Worker]) -> list[str]:
        newly = []
        for w in workers:
            if not w.ready and w.address is not None and (w.record or not self.records):
                w.ready = True
                newly.append(w.new)
        return newly

    def complete(self) -> bool:
        """Every name resolved (the launcher's own too) and every worker ready."""
        return self.dns_done and all(w.ready for w in self.workers.values())

    def facts(self) -> Gathered:
        """The facts so far: every answer, the hosts remote by them (a name not resolved
        yet by name alone), and the records of the workers that are in."""
        records: Mapping[str, Record] = {
            w.new: w.record for w in self.workers.values() if w.record is not None
        }
        facts = dataclasses.replace(self.base, answers=dict(self.answers), records=records)
        remote = tuple(new for _, new, _ in gather.remote_hosts(self.config, facts))
        return dataclasses.replace(facts, remote=remote)

    def _dns(self) -> None:
        try:
            answers = gather.wait_for_dns(
                self.config,
                self.base.hostfile,
                socket.gethostname(),
                self.log,
                resolved=lambda a: self.events.put(("answer", a, None)),
                stop=self.stop,
            )
            self.events.put(("dns", answers, None))
        except BaseException as exc:  # DNSTimeoutError, above all: the caller raises it
            self.events.put(("error", exc, None))
