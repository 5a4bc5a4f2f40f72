"""The termination message (core/termination.py): on every non-zero exit of the launcher or
the worker, the reason, where Kubernetes shows it — the agent run for real in a pod
namespace for each exit code of README's table, and the text's bounds. (Its writer,
system/termlog.py, on real files: tests/test_termlog.py.)"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpi_bootstrap.core import termination
from mpi_bootstrap.core.errors import MEANINGS, ExitStatus
from tests.conftest import AGENT, Pod
from tests.support import logs
from tests.support.job import sshd_of
from tests.support.onepod import launcher as cli_launcher
from tests.support.wait import wait_until

TROUBLESHOOTING = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
TOKEN = "tok-never-in-the-message-0123456789abcdef"  # noqa: S105 - a test's own


def readme_codes() -> list[int]:
    """The fixed codes the exit-code table (docs/troubleshooting.md) lists."""
    table = TROUBLESHOOTING.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return [int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)]


class TestText:
    """What the message says, and its bounds."""

    def test_every_code_in_readme_has_a_meaning_and_a_fix(self) -> None:
        """Every fixed code README's table lists (but 0 and the doctor's 1) has its meaning and
        fix in core/errors.py's table, for the launcher and the worker."""
        codes = [c for c in readme_codes() if c not in (0, 1)]
        assert set(codes) >= {64, 65, 68, 69, 70, 73, 126, 127}
        for code in codes:
            assert code in MEANINGS, code
            for role in ("launcher", "worker"):
                text = termination.text(role=role, code=code, phase="p", error="e")
                assert text.startswith(f"mpi-bootstrap {role}: exit {code} (")
                assert "\nfix: " in text and text.endswith("\n")

    def test_program_and_signal_codes(self) -> None:
        """mpirun's own code and 128+N say so, each with its fix."""
        three = termination.text(role="launcher", code=3, phase="mpirun", error="x")
        assert "exit 3 (mpirun's own exit code" in three and termination.MPIRUN_FIX in three
        term = termination.text(role="worker", code=143, phase="supervising sshd", error="x")
        assert "exit 143 (ended by SIGTERM)" in term and termination.SIGNAL_FIX in term

    @given(st.text(max_size=20_000), st.text(max_size=600) | st.none())
    def test_bounded_and_printable(self, error: str, host: str | None) -> None:
        """Whatever the error and host say, the message is at most 4096 bytes of printable
        text, with its fix whole."""
        text = termination.text(role="launcher", code=69, phase="preflight", error=error, host=host)
        assert len(text.encode()) <= termination.LIMIT
        assert all(c == "\n" or " " <= c < "\x7f" or c == "…" for c in text)
        assert text.endswith(f"fix: {MEANINGS[ExitStatus.PEER_UNAVAILABLE][1]}\n")


def launcher(
    pod: Pod,
    log: Path | str | None,
    *args: str,
    hostfile: str = "localhost\n",
    program: tuple[str, ...] = ("true",),
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """The launcher in the pod, the message going to `log` (None: the variable unset)."""
    path = pod.tmp / "hostfile"
    if hostfile:
        path.write_text(hostfile)
    extra = dict(env or {})
    if log is not None:
        extra["MPI_BOOTSTRAP_TERMINATION_LOG"] = str(log)
    extra.setdefault("MPI_BOOTSTRAP_TOKEN", TOKEN)
    code, _, err = cli_launcher(pod, path, *args, env=extra, program=program)
    return code, err


def message(path: Path) -> dict[str, str]:
    """The message's lines, by their label (the first line as `head`)."""
    lines = path.read_text().splitlines()
    out = {"head": lines[0]}
    for line in lines[1:]:
        label, _, rest = line.partition(": ")
        out[label] = rest
    assert len(path.read_bytes()) <= termination.LIMIT
    assert TOKEN not in path.read_text()
    return out


class TestLauncher:
    """The launcher for real, once per exit code: the message names the phase, the host at
    fault where there is one, the code and its fix."""

    def test_config(self, pod: Pod) -> None:
        log = pod.tmp / "term"
        code, err = launcher(pod, log, "--dns-wait-seconds", "soon")
        assert code == 64, err
        m = message(log)
        assert m["head"] == "mpi-bootstrap launcher: exit 64 (bad configuration)"
        assert m["phase"] == "configuration" and "--dns-wait-seconds" in m["error"]
        assert m["fix"] == MEANINGS[64][1]

    def test_hostfile(self, pod: Pod) -> None:
        log = pod.tmp / "term"
        code, err = launcher(pod, log, hostfile="good-host slots=x\n")
        assert code == 65, err
        m = message(log)
        assert m["phase"] == "hostfile" and "hostfile:1" in m["error"]

    def test_dns(self, pod: Pod) -> None:
        log = pod.tmp / "term"
        code, err = launcher(pod, log, hostfile="ghost-0.job.default.svc\n")
        assert code == 68, err
        m = message(log)
        assert m["phase"] == "DNS wait" and m["host"] == "ghost-0.job.default.svc"
        assert "did not resolve" in m["error"]

    def test_no_record(self, pod: Pod) -> None:
        """A worker whose record never comes: 69, the records phase, the worker named."""
        log = pod.tmp / "term"
        xdir = pod.tmp / "exchange"
        xdir.mkdir()
        code, err = launcher(
            pod, log, hostfile="node-a slots=1\n", env={"MPI_BOOTSTRAP_EXCHANGE_DIR": str(xdir)}
        )
        assert code == 69, err
        m = message(log)
        assert m["phase"] == "records" and m["host"] == "node-a", m

    def test_cannot_write(self, pod: Pod) -> None:
        """The state directory cannot be made (a file where its parent should be): 73, the
        path named."""
        log = pod.tmp / "term"
        blocker = pod.tmp / "file"
        blocker.write_text("")
        code, err = launcher(pod, log, env={"MPI_BOOTSTRAP_STATE_DIR": str(blocker / "state")})
        assert code == 73, err
        m = message(log)
        assert m["phase"] == "writing files" and str(blocker) in m["error"]

    @pytest.mark.parametrize("code", [126, 127])
    def test_mpirun(self, pod: Pod, code: int) -> None:
        """mpirun not executable (126) or not there (127): the path named."""
        log = pod.tmp / "term"
        mpirun = pod.tmp / "mpirun"
        if code == 126:
            mpirun.write_text("#!/bin/sh\n")
        got, err = launcher(pod, log, "--mpirun", str(mpirun))
        assert got == code, err
        m = message(log)
        assert m["head"].startswith(f"mpi-bootstrap launcher: exit {code} (")
        assert str(mpirun) in m["error"]

    def test_job_exit_code(self, pod: Pod) -> None:
        """The job's own code (here 3), from the resident supervisor."""
        log = pod.tmp / "term"
        code, err = launcher(pod, log, program=("sh", "-c", "exit 3"))
        assert code == 3, err
        m = message(log)
        assert m["head"] == "mpi-bootstrap launcher: exit 3 (mpirun's own exit code)"
        assert m["phase"] == "mpirun" and m["error"] == "mpirun exited 3"

    def test_signal(self, pod: Pod) -> None:
        """SIGTERM to the agent while the job runs: 143, forwarded, said so."""
        log = pod.tmp / "term"
        path = pod.tmp / "hostfile"
        path.write_text("localhost\n")
        p = subprocess.Popen(
            [
                *pod.netns.prefix(),
                "env",
                "-i",
                "PATH=/usr/bin:/bin",
                f"HOME={pod.tmp}",
                f"MPI_BOOTSTRAP_STATE_DIR={pod.tmp / 'state'}",
                f"MPI_BOOTSTRAP_TERMINATION_LOG={log}",
                AGENT,
                "--hostfile",
                str(path),
                "--output-hostfile",
                str(pod.tmp / "out"),
                "--log-format",
                "json",
                "launcher",
                "--",
                "sleep",
                "30",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stderr is not None
            for line in p.stderr:
                if '"child adopted"' in line or '"child started"' in line:
                    break
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 143
        finally:
            p.kill()
            p.wait()
        m = message(log)
        assert m["head"] == "mpi-bootstrap launcher: exit 143 (ended by SIGTERM)"
        assert m["error"] == "ended by SIGTERM, forwarded to mpirun"
        assert m["fix"] == termination.SIGNAL_FIX

    def test_success_writes_nothing(self, pod: Pod) -> None:
        log = pod.tmp / "term"
        log.write_text("")
        code, err = launcher(pod, log)
        assert code == 0, err
        assert log.read_text() == ""

    @pytest.mark.parametrize("where", ["missing-default", "unwritable", "off"])
    def test_nothing_else_changes(self, pod: Pod, where: str) -> None:
        """A path that cannot be written (the default where there is none, a directory
        that is not there) or none at all: the same exit code and message on stderr."""
        reference = pod.tmp / "reference"
        code0, err0 = launcher(pod, reference, hostfile="bad host line x=1\n")
        log = {"missing-default": None, "unwritable": "/proc/mpib-no/term", "off": ""}[where]
        code, err = launcher(pod, log, hostfile="bad host line x=1\n")
        assert code == code0 == 65
        assert logs.messages(err) == logs.messages(err0)
        assert reference.exists() and not Path("/proc/mpib-no").exists()


class TestWorker:
    """The worker: its configuration, its sshd, a stop."""

    @pytest.fixture(autouse=True)
    def state(self) -> Iterator[None]:
        """The worker's state directory, under /run (the tests' rule for state)."""
        self.state_dir = tempfile.mkdtemp(prefix="mpib-term-", dir="/run")
        os.rmdir(self.state_dir)  # the worker makes it
        yield
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def worker(
        self, pod: Pod, log: Path, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        xdir = pod.tmp / "exchange"
        xdir.mkdir(exist_ok=True)
        base = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(pod.tmp),
            "MPI_BOOTSTRAP_STATE_DIR": self.state_dir,
            "MPI_BOOTSTRAP_EXCHANGE_DIR": str(xdir),
            "MPI_BOOTSTRAP_TERMINATION_LOG": str(log),
            **(env or {}),
        }
        return subprocess.Popen(
            [
                *pod.netns.prefix(),
                "env",
                "-i",
                *(f"{k}={v}" for k, v in base.items()),
                AGENT,
                "--log-format",
                "json",
                *args,
                "worker",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )

    def test_config(self, pod: Pod) -> None:
        log = pod.tmp / "term"
        p = self.worker(pod, log, "--sshd-port", "70000")
        _, err = p.communicate(timeout=60)
        assert p.returncode == 64, err
        m = message(log)
        assert m["head"] == "mpi-bootstrap worker: exit 64 (bad configuration)"

    def test_sshd_does_not_start(self, pod: Pod, tmp_path: Path) -> None:
        """An sshd that exits at once: 69, the sshd phase, the worker's own fix."""
        log = pod.tmp / "term"
        fake = tmp_path / "sshd"
        fake.write_text("#!/bin/sh\necho 'fake sshd: no' >&2\nexit 1\n")
        fake.chmod(0o755)
        p = self.worker(pod, log, "--sshd", str(fake))
        try:
            _, err = p.communicate(timeout=60)
        finally:
            self.cleanup(p)
        assert p.returncode == 69, err
        m = message(log)
        assert m["phase"] == "sshd" and m["fix"].startswith("the worker's log has sshd's")

    def test_stopped(self, pod: Pod) -> None:
        """A running worker (the resident supervising sshd) sent SIGTERM ends cleanly (0: the
        pod is being stopped, nothing failed): it writes nothing."""
        log = pod.tmp / "term"
        log.write_text("")
        p = self.worker(pod, log)
        try:
            assert p.stderr is not None
            seen: list[str] = []

            def read() -> None:
                assert p.stderr is not None
                seen.extend(p.stderr)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            wait_until(
                lambda: any('"child adopted"' in line for line in seen),
                60,
                lambda: f"the worker to hand off: {''.join(seen)[-2000:]}",
            )
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0
        finally:
            self.cleanup(p)
        assert log.read_text() == ""

    def test_sshd_keeps_dying(self, pod: Pod) -> None:
        """sshd killed again and again: the supervisor gives up (69), the message says so."""
        log = pod.tmp / "term"
        p = self.worker(pod, log)
        try:
            assert p.stderr is not None
            seen: list[str] = []
            reader = threading.Thread(target=lambda: seen.extend(p.stderr or []), daemon=True)
            reader.start()
            wait_until(
                lambda: any('"child adopted"' in line for line in seen),
                60,
                lambda: f"the worker to hand off: {''.join(seen)[-2000:]}",
            )
            deadline = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(AssertionError, ProcessLookupError):
                    os.kill(sshd_of(pod), signal.SIGKILL)
                time.sleep(0.2)
            assert p.wait(timeout=30) == 69, "".join(seen)[-3000:]
        finally:
            self.cleanup(p)
        m = message(log)
        assert m["head"] == "mpi-bootstrap worker: exit 69 (a worker is unavailable)"
        assert m["phase"] == "supervising sshd" and "keeps dying" in m["error"], m
        assert m["fix"].startswith("the worker's log has sshd's")

    @staticmethod
    def cleanup(p: subprocess.Popen[str]) -> None:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_internal_error(tmp_path: Path) -> None:
    """A bug (70), caused with a mock (hard to cause for real), in a process of its own:
    the message says so and asks for a report."""
    log = tmp_path / "term"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost\n")
    script = (
        "import sys\n"
        "from unittest import mock\n"
        "from mpi_bootstrap import cli\n"
        "mock.patch.object(cli, '_dispatch', side_effect=RuntimeError('boom')).start()\n"
        f"sys.exit(cli.run(['--hostfile', {str(hostfile)!r}, 'launcher', '--', 'true'], "
        "dict(__import__('os').environ)))\n"
    )
    env = {
        "MPI_BOOTSTRAP_TERMINATION_LOG": str(log),
        "HOME": str(tmp_path),
        "MPI_BOOTSTRAP_STATE_DIR": str(tmp_path / "state"),
        "PATH": "/usr/bin:/bin",
        "MPI_BOOTSTRAP_LOG_FORMAT": "json",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 70, done.stderr
    m = message(log)
    assert m["head"] == "mpi-bootstrap launcher: exit 70 (internal error)"
    assert "RuntimeError('boom')" in m["error"] and "report" in m["fix"]
