"""The whole agent as a process: every bad input ends in its exit code and one clear line,
never a traceback. Runs in a private pod namespace, so no lookup leaves this machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import AGENT, Pod
from tests.support import logs
from tests.support.onepod import launcher

pytestmark = [pytest.mark.timeout(120)]


def message_lines(stderr: str) -> list[str]:
    """The human lines (not JSON log events) the agent wrote to stderr."""
    return logs.messages(stderr)


class TestHostfileErrors:
    """Missing, empty, binary and malformed hostfiles: exit 65, one line naming file:line."""

    @pytest.mark.parametrize(
        ("content", "expected"),
        [
            (b"", "no hosts"),
            (b"# nothing\n\n", "no hosts"),
            (b"good slots=1\n\x00\x01\x02binary\n", ":2: binary data"),
            (b"\xff\xfe\xfd\n", ":1: not UTF-8 text"),
            (b"a;rm -rf / slots=1\n", ":1: 'a;rm' is not a valid hostname"),
            (b"ok\n$(x) slots=1\n", ":2: '$(x)' is not a valid hostname"),
            (b"has space:2 x\n", ":1: unexpected 'space:2'"),
            (b"a slots=0\n", ":1: slots must be \u2265 1, not '0'"),
            (b"a slots=-1\n", ":1: slots must be a whole number"),
            (b"a slots=x\n", ":1: slots must be a whole number"),
            (b"a\nb\na\n", ":3: duplicate host 'a' (first at line 1)"),
        ],
    )
    def test_bad(self, pod: Pod, content: bytes, expected: str) -> None:
        """Each bad hostfile exits 65 with one stderr line naming the file and reason, no traceback,
        nothing on stdout and no output hostfile written."""
        path = pod.tmp / "hostfile"
        path.write_bytes(content)
        code, out, err = launcher(pod, path)
        assert code == 65, err
        lines = message_lines(err)
        assert len(lines) == 1, err
        assert lines[0].startswith(f"mpi-bootstrap: {path}")
        assert expected in lines[0]
        assert "Traceback" not in err
        assert out == ""
        assert not (pod.tmp / "out-hostfile").exists()  # nothing half-written

    def test_missing(self, pod: Pod) -> None:
        """A missing hostfile exits 65 with the one line '<path>: hostfile not found'."""
        code, _, err = launcher(pod, pod.tmp / "nope")
        assert code == 65
        assert message_lines(err) == [f"mpi-bootstrap: {pod.tmp / 'nope'}: hostfile not found"]

    def test_missing_default(self, pod: Pod) -> None:
        """The default hostfile missing: where it comes from, and how to name another."""
        code, _, err = pod.agent("--log-format", "json", "launcher", "--", "true")
        assert code == 65
        assert message_lines(err) == [
            "mpi-bootstrap: /etc/mpi/hostfile: hostfile not found (the default path, where "
            "MPI Operator mounts the job's hostfile; name another with --hostfile or "
            "MPI_HOSTFILE)"
        ]

    def test_unreadable(self, pod: Pod) -> None:
        """Root without the capabilities that let it read any file, as in a locked-down pod."""
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv (util-linux) missing")
        path = pod.tmp / "hostfile"
        path.write_text("a slots=1\n")
        path.chmod(0)
        done = pod.netns.run(
            [
                "setpriv",
                "--bounding-set=-dac_override,-dac_read_search",
                "env",
                "-i",
                "PATH=/usr/bin:/bin",
                f"HOME={pod.tmp}",
                AGENT,
                "--hostfile",
                str(path),
                "--output-hostfile",
                str(pod.tmp / "never"),
                "launcher",
                "--",
                "true",
            ],
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 65, done.stderr
        assert f"mpi-bootstrap: {path}: hostfile not readable (permission denied)" in message_lines(
            done.stderr
        )


class TestConfigErrors:
    """Bad settings: exit 64, every one named at once."""

    def test_all_reported(self, pod: Pod) -> None:
        """Two bad variables exit 64 with both problems reported at once and no traceback."""
        code, _, err = pod.agent(
            "launcher",
            "--",
            "true",
            env={"MPI_DNS_WAIT_SECONDS": "later", "MPI_BOOTSTRAP_REWRITE": "sed"},
        )
        assert code == 64
        assert "bad configuration (2 problems)" in err
        assert "MPI_DNS_WAIT_SECONDS: 'later' is not a number of seconds" in err
        assert "MPI_BOOTSTRAP_REWRITE: 'sed' is not one of none, fqdn, ip" in err
        assert "Traceback" not in err

    def test_no_role(self, pod: Pod) -> None:
        """Running with no role exits 64 saying 'no role', and its termination message
        says so as itself: no launcher's words (a worker started this way once reported
        `mpi-bootstrap launcher: exit 64` and `launcher: no program given`)."""
        log = pod.tmp / "termination-log"
        env = {"MPI_BOOTSTRAP_TERMINATION_LOG": str(log)}
        for args in (("--", "true"), ()):
            code, _, err = pod.agent(*args, env=env)
            assert code == 64
            assert "no role" in err and "no program" not in err
            said = log.read_text()
            assert said.startswith("mpi-bootstrap (no role): exit 64"), said
            assert "launcher" not in said.replace("`launcher`", ""), said

    def test_worker_without_any_key(self, pod: Pod) -> None:
        """A worker with no exchange exits 64 saying what `auto` looked for and what each
        exchange needs, having written nothing (no state directory, no host key)."""
        code, _, err = pod.agent("worker")
        assert code == 64
        assert "the worker has no exchange (`auto` found none: no key at" in err
        assert "MPI_BOOTSTRAP_EXCHANGE_DIR" in err and "MPI_BOOTSTRAP_TOKEN_FILE" in err
        assert "secret (the MPIJob's ssh Secret mounted at" in err
        assert not (pod.tmp / "state").exists()
        code, _, err = pod.agent("worker", env={"MPI_BOOTSTRAP_EXCHANGE": "none"})
        assert code == 64
        assert "env MPI_BOOTSTRAP_EXCHANGE is none and nothing is mounted at" in err

    def test_net_needs_token(self, pod: Pod) -> None:
        """The net exchange without a token exits 64 saying it needs the token's file."""
        code, _, err = pod.agent("worker", env={"MPI_BOOTSTRAP_EXCHANGE": "net"})
        assert code == 64
        assert "'net' needs MPI_BOOTSTRAP_TOKEN_FILE" in err

    def test_short_token_value_not_shown(self, pod: Pod) -> None:
        """A too-short token exits 64 stating the length rule, never echoing the token itself."""
        code, _, err = pod.agent("worker", env={"MPI_BOOTSTRAP_TOKEN": "tiny-secret"})
        assert code == 64
        assert "MPI_BOOTSTRAP_TOKEN: must be at least 16 characters" in err
        assert "tiny-secret" not in err


class TestDNSTimeout:
    """A host that never resolves: exit 68 by the deadline, with the dump a person needs."""

    def test_dump(self, pod: Pod) -> None:
        """An unresolvable host exits 68 naming it, with the hostfile, resolv.conf, /etc/hosts and
        last-error dump and DNS OK / DNS WAIT log events."""
        path = pod.tmp / "hostfile"
        path.write_text("localhost slots=1\nghost-worker-0.job.default.svc slots=1\n")
        code, _, err = launcher(pod, path)
        assert code == 68, err
        assert "1 of 3 names did not resolve within 1 s: ghost-worker-0.job.default.svc" in err
        for section in (
            f"--- hostfile {path}",
            "--- /etc/resolv.conf",
            "nameserver 127.0.0.1",
            "--- /etc/hosts",
            "--- unresolved names (last error)",
        ):
            assert section in err
        assert logs.event(err, "DNS OK", host="localhost") is not None
        wait = logs.named(err, "DNS WAIT")
        assert wait and wait[0]["host"] == "ghost-worker-0.job.default.svc"
        assert wait[0]["reason"] in ("temporary failure", "not found")


class TestExecErrors:
    """mpirun missing → 127; present but not executable → 126; each names the path."""

    def test_not_found(self, pod: Pod) -> None:
        """A --mpirun path that does not exist exits 127 with '<path>: command not found'."""
        path = pod.tmp / "hostfile"
        path.write_text("localhost\n")
        code, _, err = launcher(pod, path, "--mpirun", str(pod.tmp / "no-mpirun"))
        assert code == 127
        assert f"{pod.tmp / 'no-mpirun'}: command not found" in err

    def test_not_executable(self, pod: Pod) -> None:
        """A --mpirun file without execute permission exits 126 with '<path>: not executable'."""
        path = pod.tmp / "hostfile"
        path.write_text("localhost\n")
        fake = pod.tmp / "mpirun"
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o644)
        code, _, err = launcher(pod, path, "--mpirun", str(fake))
        assert code == 126
        assert f"{fake}: not executable" in err


class TestExplain:
    """--explain shows the plan on stdout, writes nothing, and never shows a secret."""

    def test_no_secret_at_any_level(self, pod: Pod) -> None:
        """--explain, text or JSON, at debug and info level shows forwarded names but never the
        token's value, and writes no hostfile."""
        path = pod.tmp / "hostfile"
        path.write_text("localhost slots=2\n")
        for level in ("debug", "info"):
            for fmt in (("--explain",), ("--explain", "--json")):
                code, out, err = launcher(
                    pod,
                    path,
                    *fmt,
                    "--log-level",
                    level,
                    env={"MPI_BOOTSTRAP_TOKEN": "tok-3f9a-secret-0123456789", "NCCL_DEBUG": "INFO"},
                )
                assert code == 0, err
                assert "tok-3f9a-secret-0123456789" not in out + err
                assert "NCCL_DEBUG" in out
        assert not (pod.tmp / "out-hostfile").exists()

    def test_names_that_resolve_nowhere(self, pod: Pod) -> None:
        """Off-cluster (a laptop, CI), --explain is still a dry run: one DNS round, no wait
        for the 120 s deadline, the plan printed (exit 0) with the unresolved hosts marked
        and what the launcher would do about them."""
        import time

        path = pod.tmp / "hostfile"
        path.write_text("ghost-0.job.default.svc slots=2\nghost-1.job.default.svc slots=2\n")
        for fmt in (("--explain",), ("--explain", "--json")):
            t0 = time.monotonic()
            code, out, err = launcher(pod, path, *fmt, "--dns-wait-seconds", "120")
            assert code == 0, err
            assert time.monotonic() - t0 < 10
            assert "ghost-0.job.default.svc" in out and "2 of 3 unresolved" in out
            assert "would wait up to 120 s for them" in out and "then exit 68" in out
        assert not (pod.tmp / "out-hostfile").exists()


def test_python_m_entrypoint() -> None:
    """`python -m mpi_bootstrap` is the same program."""
    done = subprocess.run(
        [str(Path(AGENT).parent / "python"), "-m", "mpi_bootstrap", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("mpi-bootstrap ")
