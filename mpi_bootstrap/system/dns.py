"""Wait until every host resolves through the system resolver (getent-equivalent): glibc's
`getaddrinfo` (AF_UNSPEC, as ssh asks), so nsswitch, `/etc/hosts`, the search list and
`ndots` apply as for ssh and mpirun. Unresolved hosts are looked up concurrently; one that
resolved is never asked again; re-polling is paced by a token bucket (one token per host,
so the first round goes out at once; refilled at max(20, hosts / interval) a second), so
a late record is seen within tens of milliseconds while big jobs spare the cluster DNS.
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
from mpi_bootstrap.system.parallel import Workers

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
        # Dual-stack: IPv4 first, as the workers bind (netif: IPv4, then IPv6), on every pod.
        return Answer(name, addresses=tuple(sorted(addresses, key=lambda a: ":" in a)))

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


def _answer(name: str, answer: Answer | None, exc: BaseException | None) -> Answer:
    """A lookup that raised is an answer too: it must never kill the wait."""
    if answer is None:
        return Answer(name, error_kind=OTHER, detail=repr(exc))
    return answer


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
    stop: threading.Event | None = None,
) -> WaitResult:
    """Look every name up until all resolve or `deadline` seconds pass (or `stop` is set:
    the launch failed elsewhere).

    `deadline == 0` means one round: every name is asked once, nothing is retried.
    `on_answer(answer, previous)` is called in the caller's thread for each answer.
    """
    todo = list(dict.fromkeys(names))
    start = clock()
    w = _Wait(
        todo,
        Workers(lookup, min(concurrency, max(1, len(todo))), "dns"),
        _TokenBucket(max(1, len(todo)), lookup_rate(len(todo), interval), start),
        retry=deadline > 0,
        on_answer=on_answer,
    )
    end = start + deadline
    while w.pending or w.in_flight:
        if (w.retry and clock() >= end) or (stop is not None and stop.is_set()):
            break
        wait_token = w.feed(clock())
        # Sleep until the next token when one is needed; else only answers wake us up.
        timeout = wait_token if not w.in_flight or (w.pending and wait_token > 0) else 0.5
        if w.retry:
            timeout = min(timeout, max(0.0, end - clock()))
        w.drain(timeout)
    w.pool.close()
    for name in todo:  # names never answered before the deadline
        if name not in w.answers:
            w.answers[name] = Answer(
                name, error_kind=TEMPORARY, detail="no answer before the deadline (resolver slow)"
            )
    ordered = {name: w.answers[name] for name in todo}
    return WaitResult(answers=ordered, lookups=w.lookups, elapsed=clock() - start)


class _Wait:
    """The state of one DNS wait: what to ask, what is being asked, what came back."""

    def __init__(
        self,
        todo: list[str],
        pool: Workers[str, Answer],
        bucket: _TokenBucket,
        *,
        retry: bool,
        on_answer: Callable[[Answer, Answer | None], None] | None,
    ) -> None:
        self.pool, self.bucket, self.retry, self.on_answer = pool, bucket, retry, on_answer
        self.pending = collections.deque(todo)
        self.in_flight: set[str] = set()
        self.answers: dict[str, Answer] = {}
        self.lookups = 0

    def feed(self, now: float) -> float:
        """Submit what the rate allows; the seconds until the next token (0: none needed)."""
        wait_token = 0.0
        while self.pending and len(self.in_flight) < self.pool.size:
            wait_token = self.bucket.take(now)
            if wait_token > 0:
                break
            name = self.pending.popleft()
            self.in_flight.add(name)
            self.pool.submit(name)
            self.lookups += 1
        return wait_token

    def drain(self, timeout: float) -> None:
        """Take every answer that arrives within `timeout` s (at once if 0); failed names
        go back in the queue unless this is one round."""
        try:
            outcome = (
                self.pool.results.get(timeout=timeout)
                if timeout > 0
                else self.pool.results.get_nowait()
            )
        except queue.Empty:
            return
        while True:
            answer = _answer(*outcome)
            self.in_flight.discard(answer.name)
            previous = self.answers.get(answer.name)
            self.answers[answer.name] = answer
            if self.on_answer is not None:
                self.on_answer(answer, previous)
            if not answer.ok and self.retry:
                self.pending.append(answer.name)
            try:
                outcome = self.pool.results.get_nowait()
            except queue.Empty:
                return
