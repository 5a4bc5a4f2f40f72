"""The one fan-out of the agent: daemon threads that run a function on many items.

`Workers` is the pool (the DNS wait feeds it at a paced rate and reads answers as they
come); `map_all` runs a function on every item and waits for all (preflight ssh, sshd
banners, the net exchange); `map_within` keeps only what finished by a deadline (the
doctor's checks).

Why not `with ThreadPoolExecutor()`: leaving that block waits for every running call, so
a SIGTERM during preflight (raised in the main thread as children.Interrupted) would wait
for the slowest ssh, up to the deadline, and a lookup stuck in the resolver would hold
the process at exit. Here the main thread stops waiting at once; the abandoned threads
are daemons and die with the process, and their children are stopped by
children.end_pending.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

# ssh sessions at once (preflight's, the data check's): each handshake is CPU work on
# both ends, so more than a few per CPU only queues (16 hosts on 2 CPUs: 2.0 s at 8, 2.2 s
# at 16 or 32).
SSH_AT_ONCE = max(8, 4 * len(os.sched_getaffinity(0)))


class Workers(Generic[T, R]):
    """At most `size` daemon threads run `fn` on submitted items. Each outcome arrives on
    `results` as (item, result, None) or (item, None, the exception)."""

    def __init__(self, fn: Callable[[T], R], size: int, name: str = "worker") -> None:
        self.fn, self.size, self.name = fn, max(1, size), name
        self.tasks: queue.SimpleQueue[tuple[T] | None] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[T, R | None, BaseException | None]] = (
            queue.SimpleQueue()
        )
        self.threads = 0

    def submit(self, item: T) -> None:
        if self.threads < self.size:
            threading.Thread(
                target=self._work, name=f"{self.name}-{self.threads}", daemon=True
            ).start()
            self.threads += 1
        self.tasks.put((item,))

    def close(self) -> None:
        """Let idle threads end; a busy one ends when its call returns."""
        for _ in range(self.threads):
            self.tasks.put(None)

    def _work(self) -> None:
        while (task := self.tasks.get()) is not None:
            (item,) = task
            try:
                self.results.put((item, self.fn(item), None))
            except BaseException as exc:  # handed to whoever reads the results
                self.results.put((item, None, exc))


def map_all(fn: Callable[[T], R], items: Sequence[T], limit: int) -> list[R]:
    """[fn(x) for x in items], at most `limit` at once; the first exception (in the order
    of `items`) is raised once every call has ended, like Executor.map — unless the wait
    itself is interrupted (a signal handler's exception, children.Interrupted)."""
    pool: Workers[int, R] = Workers(lambda i: fn(items[i]), min(limit, len(items)), "parallel")
    for i in range(len(items)):
        pool.submit(i)
    results: dict[int, R] = {}
    errors: dict[int, BaseException] = {}
    for _ in items:
        i, result, exc = pool.results.get()
        if exc is not None:
            errors[i] = exc
        else:
            results[i] = cast(R, result)  # fn's own R (which may include None)
    pool.close()
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(items))]


def map_within(
    fn: Callable[[T], R], items: Sequence[T], deadline: float
) -> list[tuple[R | None, BaseException | None] | None]:
    """Run fn on every item at once; by the monotonic `deadline`, each item's
    (result, None) or (None, exception), or None where the call has not finished."""
    pool: Workers[int, R] = Workers(lambda i: fn(items[i]), len(items), "within")
    for i in range(len(items)):
        pool.submit(i)
    done: dict[int, tuple[R | None, BaseException | None]] = {}
    while len(done) < len(items):
        try:
            i, result, exc = pool.results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        done[i] = (result, exc)
    pool.close()
    return [done.get(i) for i in range(len(items))]
