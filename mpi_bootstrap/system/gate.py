"""The launch gate's marks (core/gate.py has the protocol): made fresh for each launch in
the private state directory, then opened one by one as checks pass."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.errors import WriteError
from mpi_bootstrap.system.files import make_fifo


class Marks:
    """`STATE/gate/`: a wake FIFO for every mark a gate may wait for, no mark made yet."""

    def __init__(self, state: str, hosts: Iterable[str]) -> None:
        self.dir = os.path.join(state, gate.DIR)
        # Once each: two hostfile names can be one host to mpirun (--rewrite ip).
        names = list(dict.fromkeys(gate.mark(h) for h in (*hosts, gate.ALL)))
        # A line on a FIFO wakes one reader: as many as there may be gates waiting.
        self.wake = b"\n" * len(names)
        self.names = names
        try:
            with contextlib.suppress(FileNotFoundError):  # an earlier launch's
                shutil.rmtree(self.dir)
            os.mkdir(self.dir, 0o700)
            for name in names:
                make_fifo(os.path.join(self.dir, f"{name}.wake"))
        except OSError as exc:
            raise WriteError.of(self.dir, exc) from None
        self.made: set[str] = set()

    def fail(self) -> None:
        """A check failed: every gate that waits, or will, exits without connecting."""
        path = os.path.join(self.dir, gate.FAILED)
        with contextlib.suppress(OSError):  # a lost mark: mpirun is ended anyway
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        for name in self.names:
            self._wake(name)

    def open(self, name: str) -> None:
        """Make mark `name`, then wake the gate waiting for it, if one is."""
        name = gate.mark(name)
        if name in self.made:
            return
        self.made.add(name)
        path = os.path.join(self.dir, name)
        try:
            os.close(os.open(f"{path}.ok", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            raise WriteError.of(f"{path}.ok", exc) from None
        self._wake(name)

    def _wake(self, name: str) -> None:
        """Wake the gates that wait on mark `name`'s FIFO, if any do."""
        path = os.path.join(self.dir, f"{name}.wake")
        try:  # a gate that waits holds it open; ENXIO: none does (it will see the mark)
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.write(fd, self.wake)
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> None:
        """The marks, gone: mpirun has ended (or never will launch again)."""
        shutil.rmtree(self.dir, ignore_errors=True)
