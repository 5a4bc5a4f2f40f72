"""Signals that end a bench or a test session, and the clean-up they must not cut short.

Python's default for SIGTERM and SIGHUP is to die at once: no `finally`, no context
manager's exit, so a bench stopped by `timeout` (SIGTERM) left its pods behind — network
namespaces, /etc/netns entries, state directories, daemons. `ends_on_signals()` makes
them end the program as Ctrl-C does (KeyboardInterrupt: every clean-up runs), and
`shielded()` holds such a signal while a clean-up that must finish runs (Cluster.close,
Netns.close): the signal is acted on once it is done. tests/test_hygiene.py sends a
bench SIGTERM mid-run and finds nothing of it left.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A signal ended the program: every clean-up runs as the exception goes up."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"ended by {signal.Signals(signum).name}")
        self.signum = signum


def _interrupted(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


def ends_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted, a KeyboardInterrupt (in the main
    thread): the program's clean-up runs, as after Ctrl-C."""
    for s in SIGNALS:
        signal.signal(s, _interrupted)


def run_main(main: Callable[[], object]) -> NoReturn:
    """A bench's entry point: ends_on_signals(), then `main()`, whose int is the exit
    code. Ended by a signal N, it exits 128+N once every clean-up has run."""
    ends_on_signals()
    try:
        code = main()
    except Interrupted as e:
        print(f"stopped: {e}; what it made is removed", file=sys.stderr, flush=True)
        sys.exit(128 + e.signum)
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    sys.exit(code if isinstance(code, int) else 0)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run the block to its end even if SIGINT, SIGTERM or SIGHUP arrives meanwhile; the
    first such signal is then delivered again, to whatever handler was there before.
    (Outside the main thread, where Python runs no handler, it does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if got:
            signal.raise_signal(got[0])
