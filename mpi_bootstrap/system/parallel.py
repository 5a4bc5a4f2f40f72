"""One parallel map for the launcher's fan-out steps (preflight ssh, sshd banners, the
net exchange), on daemon threads.

Why not `with ThreadPoolExecutor()`: leaving that block waits for every running call, so
a SIGTERM during preflight (raised in the main thread as children.Interrupted) would wait
for the slowest ssh, up to the deadline. Here the main thread stops waiting at once; the
abandoned threads die with the process, and their children are stopped by
children.end_pending.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_all(fn: Callable[[T], R], items: Sequence[T], limit: int) -> list[R]:
    """[fn(x) for x in items], at most `limit` at once; the first exception is raised
    once every call has ended (like Executor.map), unless the wait itself is interrupted."""
    if not items:
        return []
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(items)):
        todo.put(i)
    done: queue.SimpleQueue[int] = queue.SimpleQueue()
    results: dict[int, R] = {}
    errors: dict[int, BaseException] = {}

    def work() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller below
                errors[i] = exc
            done.put(i)

    for n in range(min(limit, len(items))):
        threading.Thread(target=work, name=f"parallel-{n}", daemon=True).start()
    for _ in items:
        done.get()  # a signal handler's exception (children.Interrupted) interrupts this
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(items))]
