"""Wait until every host resolves through the system resolver (getent-equivalent).

Lookups go through glibc's `getaddrinfo` (AF_UNSPEC, as ssh asks), so nsswitch,
`/etc/hosts`, the search list and `ndots` apply exactly as they will for ssh and mpirun.
Unresolved hosts are looked up concurrently (bounded); a host that resolved is never
asked again; re-polling is paced by a token bucket instead of a fixed sleep, so a late
record is seen within tens of milliseconds on small jobs while big jobs stay gentle on
the cluster DNS:

- the bucket holds one token per host, so the first round goes out at once;
- it refills at max(20, hosts / interval) tokens per second, which bounds the
  lookup rate after the first round.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from mpi_bootstrap.core.model import (  # the answer's type and kinds: pure values
    NO_NAMESERVER,
    NOT_FOUND,
    OTHER,
    SERVER_FAILURE,
    TEMPORARY,
    Answer,
)

MIN_LOOKUP_RATE = 20.0  # lookups per second a small job may always use

Lookup = Callable[[str], Answer]


@dataclasses.dataclass(frozen=True)
class ResolvConf:
    nameservers: tuple[str, ...]
    search: tuple[str, ...]
    ndots: int
    timeout: float


def read_resolv_conf(path: str = "/etc/resolv.conf") -> ResolvConf:
    servers: list[str] = []
    search: list[str] = []
    ndots, timeout = 1, 5.0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if not parts or parts[0].startswith(("#", ";")):
            continue
        if parts[0] == "nameserver" and len(parts) > 1:
            servers.append(parts[1])
        elif parts[0] in ("search", "domain"):
            search = parts[1:]
        elif parts[0] == "options":
            for opt in parts[1:]:
                key, _, value = opt.partition(":")
                if key == "ndots" and value.isdigit():
                    ndots = int(value)
                elif key == "timeout" and value.isdigit():
                    timeout = float(value)
    return ResolvConf(tuple(servers), tuple(search), ndots, timeout)


class SystemResolver:
    """getaddrinfo(name) — the system resolver — with errors sorted into kinds."""

    def __init__(self, resolv_conf: str = "/etc/resolv.conf") -> None:
        # glibc falls back to 127.0.0.1 without a nameserver line; knowing there is none
        # turns an opaque "temporary failure" into "no nameserver".
        self.has_nameserver = bool(read_resolv_conf(resolv_conf).nameservers)

    def __call__(self, name: str) -> Answer:
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            return Answer(name, error_kind=self._kind(exc.errno), detail=exc.strerror or "")
        except (UnicodeError, OSError) as exc:
            return Answer(name, error_kind=OTHER, detail=str(exc))
        addresses: list[str] = []
        for info in infos:
            addr = str(info[4][0])
            if addr not in addresses:
                addresses.append(addr)
        return Answer(name, addresses=tuple(addresses))

    def _kind(self, errno: int | None) -> str:
        if errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return NOT_FOUND
        if errno == socket.EAI_AGAIN:
            return TEMPORARY if self.has_nameserver else NO_NAMESERVER
        if errno == socket.EAI_FAIL:
            return SERVER_FAILURE
        return OTHER


@dataclasses.dataclass(frozen=True)
class WaitResult:
    answers: Mapping[str, Answer]  # the last answer per name (absent: never answered)
    lookups: int
    elapsed: float

    @property
    def unresolved(self) -> tuple[str, ...]:
        return tuple(n for n, a in self.answers.items() if not a.ok)

    @property
    def ok(self) -> bool:
        return not self.unresolved


class _TokenBucket:
    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity, self.rate = capacity, rate
        self.tokens, self.stamp = capacity, now

    def take(self, now: float) -> float:
        """Take a token and return 0, or return the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class _Pool:
    """Daemon worker threads: a lookup stuck in the resolver never delays the exit."""

    def __init__(self, lookup: Lookup, size: int) -> None:
        self.lookup = lookup
        self.size = size
        self.tasks: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []

    def submit(self, name: str) -> None:
        if len(self.threads) < self.size:
            t = threading.Thread(target=self._work, name="dns", daemon=True)
            t.start()
            self.threads.append(t)
        self.tasks.put(name)

    def close(self) -> None:
        """Let idle threads end; one stuck in the resolver ends when its lookup returns."""
        for _ in self.threads:
            self.tasks.put(None)

    def _work(self) -> None:
        while True:
            name = self.tasks.get()
            if name is None:
                return
            try:
                answer = self.lookup(name)
            except Exception as exc:  # a lookup must never kill the wait
                answer = Answer(name, error_kind=OTHER, detail=repr(exc))
            self.results.put(answer)


def lookup_rate(hosts: int, interval: float) -> float:
    """The re-poll budget in lookups per second: max(20, hosts ÷ interval)."""
    return max(MIN_LOOKUP_RATE, hosts / interval)


def wait_for(
    names: Iterable[str],
    *,
    lookup: Lookup,
    deadline: float,
    interval: float,
    concurrency: int = 32,
    on_answer: Callable[[Answer, Answer | None], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> WaitResult:
    """Look every name up until all resolve or `deadline` seconds pass.

    `deadline == 0` means one round: every name is asked once, nothing is retried.
    `on_answer(answer, previous)` is called in the caller's thread for each answer.
    """
    todo = list(dict.fromkeys(names))
    start = clock()
    one_round = deadline <= 0
    end = start + deadline
    bucket = _TokenBucket(max(1, len(todo)), lookup_rate(len(todo), interval), start)
    pending = collections.deque(todo)
    in_flight: set[str] = set()
    answers: dict[str, Answer] = {}
    pool = _Pool(lookup, min(concurrency, max(1, len(todo))))
    lookups = 0

    while pending or in_flight:
        now = clock()
        if not one_round and now >= end:
            break
        wait_token = 0.0
        while pending and len(in_flight) < pool.size:
            wait_token = bucket.take(now)
            if wait_token > 0:
                break
            name = pending.popleft()
            in_flight.add(name)
            pool.submit(name)
            lookups += 1
        # Sleep until the next token when one is needed; else only answers wake us up.
        timeout = wait_token if not in_flight or (pending and wait_token > 0) else 0.5
        if not one_round:
            timeout = min(timeout, max(0.0, end - clock()))
        try:
            answer = pool.results.get(timeout=timeout) if timeout > 0 else pool.results.get_nowait()
        except queue.Empty:
            continue
        while True:
            in_flight.discard(answer.name)
            previous = answers.get(answer.name)
            answers[answer.name] = answer
            if on_answer is not None:
                on_answer(answer, previous)
            if not answer.ok and not one_round:
                pending.append(answer.name)
            try:
                answer = pool.results.get_nowait()
            except queue.Empty:
                break

    pool.close()
    for name in todo:  # names never answered before the deadline
        if name not in answers:
            answers[name] = Answer(name, error_kind=TEMPORARY,
                                   detail="no answer before the deadline (resolver slow)")
    ordered = {name: answers[name] for name in todo}
    return WaitResult(answers=ordered, lookups=lookups, elapsed=clock() - start)
