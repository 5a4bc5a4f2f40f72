"""Running the resident supervisor the way the PID 1 tests and benchmarks do: as a real
PID 1 (`unshare --pid --fork --mount-proc`), or as a subreaper."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.conftest import AGENT
from tests.support import resources

PY = str(Path(AGENT).parent / "python")
CHILD = str(Path(__file__).parent / "child.py")


def agent_argv(
    *program: str, grace: float = 1.0, pid1: bool = True, options: tuple[str, ...] = ()
) -> list[str]:
    if pid1:
        resources.need("root", "a PID namespace (unshare --pid)")
    argv = [PY, "-m", "mpi_bootstrap.pid1", "--grace", str(grace), *options, "--", *program]
    # --kill-child: when unshare goes (a test's clean-up kills it), so does the agent, and
    # with the namespace's PID 1 everything in it; without it, both outlive the test.
    pid = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    # Every signal at its default first, whatever the suite inherited: a shell's background
    # job starts with SIGINT and SIGQUIT ignored, nohup with SIGHUP, and the agent keeps
    # what it was started with ignored (as tini does), so its child could not die of them.
    fresh = ["env", "--default-signal"]
    return [*fresh, *pid, *argv] if pid1 else [*fresh, *argv]


def run(
    *program: str,
    grace: float = 1.0,
    pid1: bool = True,
    timeout: float = 60,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_argv(*program, grace=grace, pid1=pid1, options=options),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def agent_pid(unshare: subprocess.Popen[str] | subprocess.Popen[bytes]) -> int:
    """The agent's PID as seen from here: the one child of `unshare --fork`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise AssertionError("unshare did not start the agent")
