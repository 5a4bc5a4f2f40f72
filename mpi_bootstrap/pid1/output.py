"""PID 1's stderr: one writer thread for everything PID 1 writes there, bounded at LIMIT
bytes and flushed for up to FLUSH_SECONDS at exit: docs/pid1.md, "Output"
(tests/test_pid1_conformance.py::TestOutput).

Why a thread, not O_NONBLOCK on fd 2: the flag belongs to the open file description,
which PID 1 shares with mpirun's stdout and sshd's stderr; they would then see EAGAIN
and lose output themselves. The thread blocks every signal, so the SIGPIPE of its own
write to a closed stderr is never taken for one sent to PID 1 and forwarded.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

from mpi_bootstrap.core.log import LEVELS, Log, line

LIMIT = 1 << 20
FLUSH_SECONDS = 5.0


class Output:
    def __init__(self, fd: int = 2, limit: int = LIMIT) -> None:
        self.fd = fd
        self.limit = limit
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._dropped = 0  # not yet reported
        self._busy = False
        self._broken = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stderr", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """Queue `data`; never blocks. Past the limit the oldest queued bytes go."""
        if not data:
            return
        with self._cond:
            if self._broken:
                return
            self._chunks.append(data)
            self._size += len(data)
            while self._size > self.limit and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._size -= len(old)
                self._dropped += len(old)
            self._cond.notify()

    def flush(
        self, timeout: float = FLUSH_SECONDS, interrupted: Callable[[], bool] = lambda: False
    ) -> bool:
        """Wait until everything queued is written (True), or `timeout` s have passed or
        `interrupted()` says to stop waiting (False); it is asked every 50 ms."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self._broken or (not self._chunks and not self._busy)):
                left = deadline - time.monotonic()
                if left <= 0 or interrupted():
                    return False
                self._cond.wait(min(0.05, left))
            return True

    def _next(self) -> bytes:
        with self._cond:
            self._busy = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: bool(self._chunks))
            self._busy = True
            data = self._chunks.popleft()
            self._size -= len(data)
            if self._dropped:
                note = (
                    f"mpi-bootstrap: {self._dropped} bytes of output dropped here: "
                    "PID 1's stderr was not read for a while\n"
                ).encode()
                self._dropped = 0
                data = note + data
            return data

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            data = self._next()
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError:  # EPIPE, EBADF: nobody will ever read it
                with self._cond:
                    self._broken = True
                    self._chunks.clear()
                    self._size = 0
                    self._busy = False
                    self._cond.notify_all()
                return


class Tee:
    """The main child's stderr pipe (non-blocking), copied through to `output` in whole
    lines — so no line of PID 1's own log lands inside one of mpirun's (a line longer
    than TAIL goes out as it is) — with its last TAIL bytes kept for the explainer."""

    TAIL = 256 * 1024

    def __init__(self, fd: int, output: Output) -> None:
        self.fd = fd
        self.output = output
        self.open = True
        self.tail = bytearray()
        self._partial = bytearray()  # the last line, until it is whole

    def read(self) -> bool:
        """Copy what is there now; False at the pipe's end, or when nothing is there."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            self.close()
            return False
        self.tail += data
        del self.tail[: -self.TAIL]
        self._partial += data
        cut = (
            self._partial.rfind(b"\n") + 1 if len(self._partial) < self.TAIL else len(self._partial)
        )
        if cut:
            self.output.write(bytes(self._partial[:cut]))
            del self._partial[:cut]
        return True

    def drain(self) -> None:
        """Read to the end of what is there, then close: the writers are gone."""
        while self.open and self.read():
            pass
        self.close()

    def close(self) -> None:
        if self.open:
            os.close(self.fd)
            self.open = False
        self.output.write(bytes(self._partial))
        self._partial.clear()


def line_logger(role: str, output: Output, level: str = "info", fmt: str = "json") -> Log:
    """`log(event, level="info", **keys)` for the resident process: core/log.py's lines,
    JSON or (`console`, or `auto` on a TTY) readable, queued on `output`."""
    floor = LEVELS.get(level, 20)
    console = fmt == "console" or (fmt == "auto" and _isatty(output.fd))

    def log(event: str, /, level: str = "info", **kw: object) -> None:
        if LEVELS.get(level, 20) >= floor:
            output.write(line(event, level, role, kw, console=console).encode())

    return log


def _isatty(fd: int) -> bool:
    with contextlib.suppress(OSError):
        return os.isatty(fd)
    return False
