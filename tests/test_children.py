"""proc/children.py, through which the agent starts every child before the hand-off:
children it did not hand off are stopped when it ends (also those of a fan-out), none
starts afterwards, and capture's timeout holds though a grandchild keeps its pipe open."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from mpi_bootstrap.proc import children
from mpi_bootstrap.system import parallel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh_proc_state() -> Iterator[None]:
    """end_pending() marks the process as stopping: undo it for the next test."""
    yield
    children._stopping = False
    children._pending.clear()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class TestEndPending:
    """Children the agent started and did not hand off are stopped when it ends, and no
    thread can start a new one afterwards."""

    def test_spawned_children_stopped(self) -> None:
        """When the agent ends, every child it spawned is stopped and no new one can start."""
        pids = [
            children.spawn(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, group=False)
            for _ in range(3)
        ]
        assert children.end_pending(grace=1.0) == 3
        assert not any(alive(p) for p in pids)
        with pytest.raises(children.Interrupted):
            children.spawn(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, group=False)
        with pytest.raises(children.Interrupted):
            children.capture(["true"])

    def test_fan_out_with_more_hosts_than_threads(self) -> None:
        """8 captures, 2 at a time, interrupted: every sleep started is gone."""
        started: list[int] = []
        errors: list[BaseException] = []

        def one(_x: int) -> None:
            try:
                children.capture(["sleep", "30"], timeout=60)
            except BaseException as exc:  # the stop shows up here as Interrupted
                errors.append(exc)

        t = threading.Thread(target=parallel.map_all, args=(one, list(range(8)), 2), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while len(children._pending) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started.extend(children._pending)
        children.end_pending(grace=1.0)
        t.join(timeout=10)
        assert not t.is_alive()
        assert not any(alive(p) for p in started)
        me = str(os.getpid())
        leftovers = subprocess.run(
            ["pgrep", "-P", me, "sleep"], capture_output=True, text=True, check=False
        ).stdout.split()
        assert leftovers == []


class TestCapture:
    """capture's timeout holds even when the program's own child keeps the pipe open."""

    def test_timeout_with_grandchild(self) -> None:
        """capture gives up at its timeout (124, output kept) though a grandchild holds the pipe."""
        t0 = time.monotonic()
        code, out = children.capture(["sh", "-c", "sleep 30 & echo started; wait"], timeout=0.5)
        assert code == 124
        assert "started" in out and "timed out after 0.5 s" in out
        assert time.monotonic() - t0 < 4
