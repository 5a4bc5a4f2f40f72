"""A worker's duty with the `dir` exchange: the launcher's `job-done` mark, read once a
second; its text (naming this job's key: core/records.py) ends the worker. Standard
library only."""

from __future__ import annotations

import os
from collections.abc import Callable

from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Marker

CHECK_S = 1.0


class JobDone:
    def __init__(self, marker: Marker, log: Log, stop: Callable[[str], None]) -> None:
        self.marker, self.log, self.stop = marker, log, stop
        self.next_check = 0.0
        self.done = False

    def next_at(self) -> float | None:
        return None if self.done else self.next_check

    def tick(self, now: float) -> None:
        if self.done or now < self.next_check:
            return
        self.next_check = now + CHECK_S
        if _file_says(self.marker.path, self.marker.text):
            self.done = True
            self.log("job done", file=self.marker.path)
            self.stop("job done")

    def busy(self) -> bool:
        return False


def _file_says(path: str, text: str) -> bool:
    from mpi_bootstrap.system.files import read_regular

    try:
        return read_regular(path, 256, owner=os.geteuid()).decode("ascii", "replace") == text
    except OSError:
        return False
