"""How signals reach PID 1's loop: a handler for each (a PID 1 drops a signal it has no
handler for), writing its number to a non-blocking pipe (`signal.set_wakeup_fd`) that the
loop's select watches. Standard library only."""

from __future__ import annotations

import errno
import os
import signal

from mpi_bootstrap.proc import signals


class Wakeup:
    def __init__(self) -> None:
        self.fd, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self) -> None:
        """Handlers first, then let in any signal blocked across the exec."""
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for s in signals.HANDLED:
            signal.signal(s, _noop)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.HANDLED)

    def read(self) -> list[int]:
        """The signals that arrived since the last read, in order."""
        out: list[int] = []
        while True:
            try:
                data = os.read(self.fd, 512)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return out
            out.extend(data)


def _noop(_signum: int, _frame: object) -> None:
    """A handler must exist for set_wakeup_fd to see the signal; the loop does the work."""
