"""system/parallel.py, the agent's one fan-out: results in order, the first failure
raised, and an agent interrupted while it waits not kept waiting for its tasks."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from mpi_bootstrap.proc import children
from mpi_bootstrap.system import parallel

pytestmark = pytest.mark.timeout(60)


class TestMapAll:
    """The launcher's fan-out keeps order, raises the first failure, and never makes an
    interrupted agent wait for it."""

    def test_order_and_first_error(self) -> None:
        """The fan-out returns results in input order, raises the failure of the earliest item, and
        maps an empty list to an empty list."""
        assert parallel.map_all(lambda x: x * 2, list(range(50)), 4) == list(range(0, 100, 2))

        def fail(x: int) -> int:
            if x in (3, 7):
                raise ValueError(x)
            return x

        with pytest.raises(ValueError, match="3"):
            parallel.map_all(fail, list(range(10)), 3)
        assert parallel.map_all(fail, [], 3) == []

    def test_interrupted_wait_returns_at_once(self) -> None:
        """A signal during the fan-out raises Interrupted within 2 s, not after slow tasks."""
        release = threading.Event()

        def slow(_x: int) -> None:
            release.wait(30)

        def interrupt() -> None:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGUSR1)

        previous = signal.signal(signal.SIGUSR1, children._raise)
        try:
            threading.Thread(target=interrupt, daemon=True).start()
            t0 = time.monotonic()
            with pytest.raises(children.Interrupted):
                parallel.map_all(slow, list(range(8)), 2)
            assert time.monotonic() - t0 < 2
        finally:
            signal.signal(signal.SIGUSR1, previous)
            release.set()
