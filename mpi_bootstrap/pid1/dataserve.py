"""The worker's side of the data check, served by the resident PID 1: no interpreter is
started on a worker for it.

The launcher's session (ssh/datacheck.py) finds this worker's control FIFO in the
variable MPI_BOOTSTRAP_CONTROL (set by sshd's `SetEnv`: ssh/sshd.py; pid1/control.py)
and then:
    1. makes two FIFOs beside it, `probe-PID.in` and `probe-PID.out` (PID: its shell's);
    2. writes one line to the control FIFO: `probe NIC SECONDS SYSFS PID`;
    3. copies its stdin into `.in`, and `.out` to its stdout, until both end.
PID 1 reads the line and forks (proc/spawn.py fork_call). The copy opens the two FIFOs
(they must be this user's FIFOs, in the state directory, not reached through a link),
removes their names, and runs `dataprobe.session` on them as the program would on its
stdin and stdout; an alarm ends it a few seconds after its SECONDS whatever happens (a
session that never opens its FIFOs). A fork of the running PID 1 costs about a
millisecond of CPU, a new interpreter 16 ms: at 16 workers on 2 cores, most of the
check's cost.

Standard library only (the resident PID 1 imports it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from mpi_bootstrap.core.datanet import NIC_NAME, SESSION_SECONDS
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import is_plain_path

# Imported by PID 1 when it serves the check, not by each copy: its C modules cost a
# copy 7 ms of CPU to load, twice the rest of its work.
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.pid1.control import Control
from mpi_bootstrap.proc.spawn import fork_call
from mpi_bootstrap.system.files import own_fifo


def parse(words: list[str]) -> tuple[str, float, str, int] | None:
    """`NIC SECONDS SYSFS PID` → (nic, seconds, sysfs, pid); None if not that."""
    try:
        nic, seconds_text, sysfs, pid_text = words
        seconds, pid = float(seconds_text), int(pid_text)
    except ValueError:
        return None
    if (
        not NIC_NAME.fullmatch(nic)
        or not 0 < seconds <= SESSION_SECONDS
        or not is_plain_path(sysfs)
        or not pid_text.isdigit()
        or pid <= 0
    ):
        return None
    return nic, seconds, sysfs, pid


def serve(control: Control, log: Log) -> None:
    """Serve the `probe` verb of the worker's control FIFO."""

    def probe(words: list[str]) -> str | None:
        request = parse(words)
        if request is None:
            return "not `probe NIC SECONDS SYSFS PID`"
        try:
            pid = fork_call(lambda r=request: run(control.state, *r))  # type: ignore[misc]
        except OSError as exc:  # EAGAIN: that session waits out its deadline
            return f"not served: {exc}"
        log("data probe served", pid=pid, nic=request[0], session=request[3])
        return None

    control.verbs["probe"] = probe


def _give_up(_signum: int, _frame: object) -> None:
    raise TimeoutError("the data probe's session did not end in time")


def run(state: str, nic: str, seconds: float, sysfs: str, pid: int) -> int:
    """In the forked copy: one session, on the FIFOs of shell `pid`."""
    names = [os.path.join(state, f"probe-{pid}.{end}") for end in ("in", "out")]
    signal.signal(signal.SIGALRM, _give_up)
    signal.alarm(int(seconds) + dataprobe.ALARM_SLACK)
    try:
        ends = [own_fifo(names[0], os.O_RDONLY), own_fifo(names[1], os.O_WRONLY)]
    finally:
        for name in names:  # both ends are open (or never will be): names are done
            with contextlib.suppress(OSError):
                os.unlink(name)
    for fd, end in zip(ends, (0, 1), strict=True):
        os.dup2(fd, end)
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as the copy
    return dataprobe.session(nic, seconds, sysfs)
