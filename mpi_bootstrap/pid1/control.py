"""A worker PID 1's one control FIFO: `control` in its private state directory, named to
every ssh session of its sshd by `SetEnv MPI_BOOTSTRAP_CONTROL` (only the job's user's
sessions can write it). One line per request, `VERB WORD…`, one write of at most PIPE_BUF
bytes (never interleaved): `claim` (a launcher claims the worker: pid1/watch.py) and
`probe` (the data check: pid1/dataserve.py). PID 1 never blocks on it (opened read-write
and non-blocking: it never sees an end); a line of no verb it serves, or one its verb
refuses, is logged (the verb and why, never the words: a claim's hold its key) and
dropped. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

from mpi_bootstrap.core.log import Log
from mpi_bootstrap.system.files import own_fifo

MAX_LINE = 4096
Verb = Callable[[list[str]], "str | None"]  # the words after the verb → None, or why not


class Control:
    def __init__(self, path: str, log: Log, readers: MutableMapping[int, Callable[[], None]]):
        self.path, self.log = path, log
        self.fd = own_fifo(path, os.O_RDWR | os.O_NONBLOCK)
        self.verbs: dict[str, Verb] = {}
        self.pending = b""
        readers[self.fd] = self.read

    @property
    def state(self) -> str:
        """The state directory it is in, where the requests' own FIFOs are made."""
        return os.path.dirname(self.path)

    def read(self) -> None:
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        *lines, rest = (self.pending + chunk).split(b"\n")
        self.pending = rest[-MAX_LINE:]
        for line in lines:
            verb, *words = self._resync(line.decode("ascii", "replace").strip()).split(" ")
            serve = self.verbs.get(verb)
            why = serve(words) if serve is not None else "not a request this worker serves"
            if why is not None:
                self.log("control refused", level="warning", verb=verb[:16], reason=why)

    def _resync(self, text: str) -> str:
        """The request from its last verb on: every request is one write of a whole line,
        so bytes before a verb are another writer's, without their newline (one byte so
        written once glued itself to the next claim, which was refused and never
        answered: tests/test_liveness_protocol.py)."""
        start = max((text.rfind(f"{v} ") for v in self.verbs), default=-1)
        if start > 0:
            self.log("control resynced", level="warning", dropped=start)
            return text[start:]
        return text
