"""The agent's own SSH server (ssh/server.py, SECURITY.md 40), for worker images with no
usable OpenSSH sshd: each real MPI's job on the simulated cluster through it, and what
a hostile or careless client gets from it, on loopback."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.ssh import server
from tests.conftest import AGENT, NO_SSHD, RealMPI
from tests.support import logs
from tests.support.cluster import REPO, Cluster
from tests.support.job import PODS, WORKERS, Agent, Job, check_allreduce
from tests.support.machine import HOST
from tests.support.programs import compile_allreduce
from tests.support.wait import wait_until


@pytest.mark.usefixtures("dnsmasq", "realmpi")
@pytest.mark.timeout(300)
class TestJobs:
    def test_allreduce_without_sshd(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        """Workers whose image has no sshd serve ssh themselves (auto): the allreduce runs
        on 2 workers x 2 slots, through preflight, the data check and the launch gate."""
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, real_mpi)
            job.workers += [
                Agent(c, p, [AGENT, "worker"], job.env(p, **NO_SSHD)) for p in c.pods[1:]
            ]
            for w in job.workers:
                job.wait_ready(w)
                said = logs.event(w.stderr(), "ssh server")
                assert said is not None and said["server"] == "agent", w.stderr()
            done = job.launch([str(exe)])
            check_allreduce(done, 4, WORKERS)


@dataclasses.dataclass
class Served:
    """The agent's server on loopback, with a job key it lets in and one it does not."""

    port: int
    pid: int
    dir: Path
    known_hosts: Path
    key: Path  # authorized
    stranger: Path  # not

    def ssh(
        self, command: str, *options: str, key: Path | None = None, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """OpenSSH's client, as the launcher's: the host key pinned."""
        argv = [
            "ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "IdentitiesOnly=yes",
            "-i", str(key or self.key), "-p", str(self.port), *options,
            f"{USER}@127.0.0.1", command,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kw)

    def client(self, key: Path | None = None) -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        c.load_host_keys(str(self.known_hosts))
        c.connect(
            "127.0.0.1", self.port, USER, key_filename=str(key or self.key),
            look_for_keys=False, allow_agent=False, timeout=10,
        )  # fmt: skip
        return c


USER = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    d = Path(tempfile.mkdtemp(prefix="mpib-server-", dir="/run"))
    try:
        for name in ("host", "key", "stranger"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True
            )
        (d / "authorized_keys").write_text((d / "key.pub").read_text())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        settings = server.Settings(
            port, ("127.0.0.1",), str(d / "host"), str(d / "authorized_keys"), USER, None
        )
        (d / "settings.json").write_text(settings.to_json())
        known = d / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {(d / 'host.pub').read_text()}")
        env = {
            "PATH": "/usr/bin:/bin",
            "LD_PRELOAD": "/nonexistent.so",
            "LD_LIBRARY_PATH": "/image/lib",
            "BASH_ENV": "/x",
            "KEPT": "1",
        }
        p = subprocess.Popen(
            [sys.executable, "-m", "mpi_bootstrap.ssh.server", str(d / "settings.json")],
            env={**env, "PYTHONPATH": str(REPO)},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: _answers(port), 10, lambda: "the server answers")
            yield Served(port, p.pid, d, known, d / "key", d / "stranger")
        finally:
            p.kill()
            p.wait()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-2.0-")
    except OSError:
        return False


@pytest.mark.usefixtures("root")
class TestServer:
    def test_exec_relays_and_says_how_it_ended(self, served: Served) -> None:
        """stdin, stdout and stderr relayed; the exit status; a command killed by a
        signal ends ssh with 255, as with OpenSSH's sshd (its `exit-signal`)."""
        done = served.ssh("cat; echo err >&2; exit 7", input="hello\n")
        assert (done.returncode, done.stdout, done.stderr) == (7, "hello\n", "err\n")
        killed = served.ssh("kill -9 $$")
        assert killed.returncode == 255, killed.stderr
        # OpenSSH's keepalives (a global request each second, one unanswered ends it)
        kept = served.ssh(
            "sleep 3; echo on", "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=1"
        )
        assert (kept.returncode, kept.stdout) == (0, "on\n"), kept.stderr

    def test_strangers_are_refused(self, served: Served) -> None:
        """A key that is not the job's, or another user, gets nothing; the server offers
        publickey only (no password, no keyboard-interactive)."""
        assert served.ssh("true", key=served.stranger).returncode == 255
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            t = paramiko.Transport(sock)
            t.start_client(timeout=10)
            with pytest.raises(paramiko.BadAuthenticationType) as refused:
                t.auth_password(USER, "secret")
            assert refused.value.allowed_types == ["publickey"]
            t.close()
        c = paramiko.SSHClient()
        c.load_host_keys(str(served.known_hosts))
        with pytest.raises(paramiko.AuthenticationException):
            c.connect("127.0.0.1", served.port, "nobody", key_filename=str(served.key),
                      look_for_keys=False, allow_agent=False, timeout=10)  # fmt: skip

    def test_environment(self, served: Served) -> None:
        """A session gets the container's environment less the loader's and the shell's
        start-up variables, and of what the client sends only what AcceptEnv lets through."""
        asked = "NCCL_DEBUG=INFO LD_AUDIT=/evil.so PATH=/evil BASH_ENV=/evil"
        done = served.ssh("env", "-o", f"SetEnv={asked} LD_LIBRARY_PATH=/opt/mpi/lib")
        env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        assert env["NCCL_DEBUG"] == "INFO" and env["KEPT"] == "1" and env["PATH"] == "/usr/bin:/bin"
        assert not {"LD_PRELOAD", "LD_AUDIT", "BASH_ENV"} & set(env), env
        assert env["LD_LIBRARY_PATH"] == "/opt/mpi/lib"  # AcceptEnv's, as with sshd
        done = served.ssh("echo $LD_LIBRARY_PATH")
        assert done.stdout == "/image/lib\n"  # the image's own stays

    def test_nothing_but_exec(self, served: Served) -> None:
        """No pty, no shell, no subsystem, no forwarding of any kind."""
        c = served.client()
        try:
            t = c.get_transport()
            assert t is not None
            for ask in (
                lambda ch: ch.get_pty(),
                lambda ch: ch.invoke_shell(),
                lambda ch: ch.invoke_subsystem("sftp"),
            ):
                ch = t.open_session()
                with pytest.raises(paramiko.SSHException):
                    ask(ch)
            with pytest.raises(paramiko.ChannelException):
                t.open_channel("direct-tcpip", ("127.0.0.1", 22), ("127.0.0.1", 1))
            with pytest.raises(paramiko.SSHException):
                t.request_port_forward("127.0.0.1", 0)
        finally:
            c.close()

    def test_bounded_channels(self, served: Served) -> None:
        """At most server.CHANNELS sessions open at once on one connection; several run at
        once, and a channel that ended gives its place back."""
        c = served.client()
        try:
            t = c.get_transport()
            assert t is not None
            chans = [t.open_session() for _ in range(server.CHANNELS)]
            with pytest.raises(paramiko.ChannelException):
                t.open_session()
            for i, ch in enumerate(chans[:3]):
                ch.exec_command(f"echo {i}")
            assert [ch.makefile().read().decode() for ch in chans[:3]] == ["0\n", "1\n", "2\n"]
            for ch in chans[:3]:
                assert ch.recv_exit_status() == 0
                ch.close()
            again = wait_until(lambda: _opens(t), 10, lambda: "a place given back")
            again.exec_command("echo again")
            assert again.makefile().read() == b"again\n"
        finally:
            c.close()

    def test_a_client_that_never_reads(self, served: Served) -> None:
        """A command that writes without end to a client that never reads: the server
        holds at most a window of it (its memory stays put), another login runs, and the
        command ends with the connection."""
        before = _rss_kib(served.pid)
        c = served.client()
        ch = c.get_transport().open_session()  # type: ignore[union-attr]
        ch.exec_command("echo $$; exec yes")
        pid = int(ch.recv(64).split(b"\n")[0])
        time.sleep(3)  # stdout at a full window for seconds
        grown = _rss_kib(served.pid) - before
        assert grown < 32 * 1024, f"the server grew {grown} KiB"
        done = served.ssh("echo in")
        assert (done.returncode, done.stdout) == (0, "in\n"), done.stderr
        c.close()
        wait_until(lambda: not _alive(pid), server.GRACE + 5, lambda: f"pid {pid} ended")

    def test_slow_key_exchanges(self, served: Served) -> None:
        """40 clients that send their banner and one byte of key exchange, then stall: a
        real login runs meanwhile, and each stalled one is dropped by server.AUTH_SECONDS."""
        socks = []
        try:
            for i in range(40):
                s = socket.socket()
                s.bind((f"127.0.0.{2 + i % 4}", 0))
                s.connect(("127.0.0.1", served.port))
                s.sendall(b"SSH-2.0-slow\r\n\x00")
                socks.append(s)
            t0 = time.monotonic()
            done = served.ssh("echo in")
            assert (done.returncode, done.stdout) == (0, "in\n"), done.stderr
            for s in socks:
                s.settimeout(max(0.1, t0 + server.AUTH_SECONDS + 5 - time.monotonic()))
                assert _drained(s), "a stalled key exchange was kept"
            assert time.monotonic() - t0 < server.AUTH_SECONDS + 5
        finally:
            for s in socks:
                s.close()

    def test_a_channel_closed_mid_command_ends_it(self, served: Served) -> None:
        """The client goes while its command runs: the command's process group ends."""
        c = served.client()
        ch = c.get_transport().open_session()  # type: ignore[union-attr]
        ch.exec_command("echo $$; exec sleep 300")
        pid = int(ch.makefile().readline())
        c.close()
        wait_until(lambda: not _alive(pid), server.GRACE + 5, lambda: f"pid {pid} ended")

    def test_a_flood_of_silent_connections(self, served: Served) -> None:
        """200 connections from elsewhere that never speak: a real login still runs."""
        socks = []
        try:
            for _ in range(200):
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", served.port))
                socks.append(s)
            done = served.ssh("echo in")
            assert (done.returncode, done.stdout) == (0, "in\n"), done.stderr
        finally:
            for s in socks:
                s.close()


def _opens(t: paramiko.Transport) -> paramiko.Channel | None:
    try:
        return t.open_session()
    except paramiko.ChannelException:
        return None


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _drained(s: socket.socket) -> bool:
    """Whether the server closed `s` before its timeout (what it sent read and dropped)."""
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass  # reset: closed too
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:  # reaped in between
        return False


class TestWhichServer:
    def test_auto_takes_the_agents_own_where_no_sshd_would_run(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """auto: the agent's own where nothing is executable at --sshd, or (root) where
        /run/sshd cannot be made; OpenSSH's where it would run; either, where set."""
        from mpi_bootstrap.worker import main as worker

        said: list[dict[str, object]] = []

        def config(**env: str) -> Config:
            return Config.from_env(env, ["worker"], host=HOST)

        def log(event: str, **fields: object) -> None:
            said.append({"event": event, **fields})

        sshd = tmp_path / "sshd"
        sshd.write_text("#!/bin/sh\n")
        sshd.chmod(0o755)
        assert worker._server(config(MPI_BOOTSTRAP_SSHD="/nonexistent/sshd"), log)
        assert "/nonexistent/sshd is not executable" in str(said[-1]["reason"])
        assert not worker._server(config(MPI_BOOTSTRAP_SSHD=str(sshd)), log)
        monkeypatch.setattr(worker, "_can_make", lambda *_: False)  # a read-only root
        assert worker._server(config(MPI_BOOTSTRAP_SSHD=str(sshd)), log) == (os.geteuid() == 0)
        forced = {"MPI_BOOTSTRAP_SSHD": "/nonexistent/sshd", "MPI_BOOTSTRAP_SSH_SERVER": "openssh"}
        assert not worker._server(config(**forced), log)
        assert worker._server(config(MPI_BOOTSTRAP_SSH_SERVER="agent"), log)
        assert {s["server"] for s in said} == {"agent", "openssh"}
