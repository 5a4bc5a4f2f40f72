"""Worker role and SSH trust against real OpenSSH: a launcher pod and worker pods, each a
network namespace with its own hostname, on a simulated pod network."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mpi_bootstrap.ssh import keys, sshd
from mpi_bootstrap.ssh import netx as exchange
from tests.conftest import AGENT
from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.podnet import ask, hello_for
from tests.support.wait import wait_until
from tests.support.workers import WORKERS, launcher_env, make_mount, record_of, start_workers

pytestmark = [pytest.mark.timeout(240)]


def launch(
    cluster: Cluster,
    tmp: Path,
    program: list[str],
    *,
    hostfile: str | None = None,
    timeout: float = 120,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    env = launcher_env(
        tmp, cluster, hostfile or "".join(f"{w} slots=1\n" for w in WORKERS), **extra
    )
    return cluster.pods[0].run([AGENT, "launcher", "--", *program], env, timeout=timeout)


class TestDirExchange:
    """A real Open MPI job over real ssh, trust set up through a shared directory."""

    def test_job_runs_and_workers_end(self, cluster: Cluster, tmp_path: Path) -> None:
        """A dir-exchange job runs on both workers, which then exit 0; the launcher's ssh_config is
        0600 with strict host key checking, and known_hosts pins each published host key."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        done = launch(cluster, tmp_path, ["hostname"], MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()) == WORKERS
        assert logs.event(done.stderr, "preflight ok", workers=2) is not None
        # the launcher marks the job done; the workers stop their sshd and exit 0
        for p in procs:
            assert p.wait(timeout=15) == 0
        state = tmp_path / "job-launcher" / "state"
        assert stat.S_IMODE((state / "ssh_config").stat().st_mode) == 0o600
        config = (state / "ssh_config").read_text()
        assert "StrictHostKeyChecking yes" in config
        assert "StrictHostKeyChecking no" not in config
        for w in WORKERS:  # the known host key is the one the worker published
            rec = json.loads((xdir / f"{w}.json").read_text())
            assert f"{w} {rec['host_key']}" in (state / "known_hosts").read_text()

    def test_man_in_the_middle_is_refused(self, cluster: Cluster, tmp_path: Path) -> None:
        """Another sshd on a worker's address and port: the pinned client refuses it."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        victim = cluster.pods[2]
        port = int(record_of(tmp_path, victim)["port"])  # type: ignore[call-overload]
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(timeout=15) == 0
        # The impostor: same address and port, its own host key, and it would even
        # accept the job's key — only the host key pin can tell.
        rogue = tmp_path / "rogue"
        rogue.mkdir()
        keys.generate(str(rogue / "host_key"), "rogue")
        (rogue / "authorized_keys").write_text((xdir / "job-key" / "id.pub").read_text())
        os.chmod(rogue / "authorized_keys", 0o600)
        (rogue / "sshd_config").write_text(
            sshd.config_text(
                port=port,
                listen=[victim.address],
                host_key=str(rogue / "host_key"),
                authorized_keys=str(rogue / "authorized_keys"),
                pid_file=str(rogue / "pid"),
                user="root",
            )
        )
        # (the launcher's own wait for the sshd banner covers its start-up)
        cluster.start(victim, ["/usr/sbin/sshd", "-D", "-e", "-f", str(rogue / "sshd_config")])
        done = launch(
            cluster,
            tmp_path,
            ["hostname"],
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_DNS_WAIT_SECONDS="20",
        )
        assert done.returncode == 69, done.stderr
        assert "host key mismatch for job-worker-1" in done.stderr
        assert logs.no_rank_started(done.stderr)
        # Without preflight, mpirun itself meets the impostor; its output stays, and the
        # agent explains it after (mpirun's stderr is teed, not swallowed).
        done = launch(
            cluster,
            tmp_path,
            ["hostname"],
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_DNS_WAIT_SECONDS="20",
            MPI_BOOTSTRAP_PREFLIGHT="false",
        )
        assert done.returncode != 0
        assert "Host key verification failed." in done.stderr
        tail = done.stderr[done.stderr.index("Host key verification failed.") :]
        assert "mpi-bootstrap: mpirun exited" in tail
        assert "Likely cause: the sshd that answered for job-worker-1 presented a host key" in tail

    def test_sshd_down_is_exit_69_before_mpirun(
        self, cluster: Cluster, tmp_path: Path, ssh_server: dict[str, str]
    ) -> None:
        """A worker whose ssh server is gone: 69 naming its address within 15 s, before
        mpirun starts."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir), **ssh_server)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=15) == 0
        t0 = time.monotonic()
        done = launch(
            cluster,
            tmp_path,
            ["hostname"],
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_DNS_WAIT_SECONDS="3",
        )
        assert done.returncode == 69, done.stderr
        assert "job-worker-0: no sshd answers on 10.250.0.11:" in done.stderr
        assert logs.no_rank_started(done.stderr)
        assert time.monotonic() - t0 < 15

    def test_daemon_missing_on_worker_path(self, cluster: Cluster, tmp_path: Path) -> None:
        """A worker whose non-interactive PATH lacks the MPI's daemon fails preflight."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        # An MPICH-like launcher whose hydra_pmi_proxy exists only beside it, on the
        # launcher: the workers' sessions cannot find it.
        fake = tmp_path / "mpich" / "bin"
        fake.mkdir(parents=True)
        (fake / "mpirun").write_text(
            "#!/bin/sh\necho 'HYDRA build details:'\necho '    Version:   5.0.2'\n"
        )
        (fake / "mpirun").chmod(0o755)
        done = launch(
            cluster,
            tmp_path,
            ["hostname"],
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_BOOTSTRAP_MPIRUN=str(fake / "mpirun"),
        )
        assert done.returncode == 69, done.stderr
        # Both workers lack it; the first whose check fails is named (workers are checked
        # as they come, so either may be).
        assert re.search(
            r"preflight: job-worker-[01]: hydra_pmi_proxy not found by a non-interactive "
            r"ssh session",
            done.stderr,
        ), done.stderr
        assert "--- doctor" in done.stderr  # the doctor runs on a preflight failure
        assert logs.no_rank_started(done.stderr)


class TestSecretExchange:
    """MPI Operator's Secret: one key, mounted 0644; the agent copies it 0600 and pins it."""

    def test_mounted_0644_key_works_and_is_untouched(
        self, cluster: Cluster, tmp_path: Path, ssh_server: dict[str, str]
    ) -> None:
        """A Secret mounted 0644 works: the job runs, the mount is left unchanged, the launcher's
        copy is 0600, and the private key never shows in the output."""
        mount = make_mount(tmp_path)
        before = {f.name: f.read_bytes() for f in mount.iterdir()}
        extra = {"MPI_BOOTSTRAP_SSH_AUTH_DIR": str(mount)}
        start_workers(cluster, tmp_path, **extra, **ssh_server)
        assert all(record_of(tmp_path, p)["port"] == 2222 for p in cluster.pods[1:])
        done = launch(cluster, tmp_path, ["hostname"], **extra)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()) == WORKERS
        assert {f.name: f.read_bytes() for f in mount.iterdir()} == before
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o644 for f in mount.iterdir())
        copy = tmp_path / "job-launcher" / "state" / "id_job"
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
        private = (mount / "id_rsa").read_text()
        assert private.strip().splitlines()[1] not in done.stderr + done.stdout


class TestNetExchange:
    """The token-authenticated exchange over the pod network."""

    TOKEN = "s3cret-token-for-tests-0123456789"  # noqa: S105 - a test token

    def test_job_runs_over_net_exchange(self, cluster: Cluster, tmp_path: Path) -> None:
        """A job runs over the token exchange; neither the token nor a private key is in any log."""
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=self.TOKEN)
        done = launch(cluster, tmp_path, ["hostname"], MPI_BOOTSTRAP_TOKEN=self.TOKEN)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()) == WORKERS
        for p in procs:
            p.send_signal(signal.SIGTERM)
        logs = done.stderr + "".join(p.communicate(timeout=15)[1] for p in procs)
        assert self.TOKEN not in logs
        assert "PRIVATE KEY" not in logs

    def test_key_exchange_is_the_agents_choice(self, cluster: Cluster, tmp_path: Path) -> None:
        """A worker's record names its sshd's OpenSSH version, and the launcher's real ssh,
        through the config the agent wrote, agrees on the cheap key exchange with the real
        sshd (OpenSSH 9.2 here: curve25519-sha256, not its default sntrup761)."""
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=self.TOKEN)
        version = sshd.version("/usr/sbin/sshd")
        assert version is not None
        assert record_of(tmp_path, cluster.pods[1])["openssh"] == f"{version[0]}.{version[1]}"
        done = launch(cluster, tmp_path, ["true"], MPI_BOOTSTRAP_TOKEN=self.TOKEN)
        assert done.returncode == 0, done.stderr
        config = tmp_path / "job-launcher" / "state" / "ssh_config"
        assert "KexAlgorithms curve25519-sha256" in config.read_text()
        said = cluster.pods[0].run(  # the workers stay up: a handshake of our own
            ["ssh", "-F", str(config), "-o", "ControlPath=none", "-v", WORKERS[0], "true"],
            {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "job-launcher")},
        )
        assert said.returncode == 0, said.stderr
        assert "kex: algorithm: curve25519-sha256" in said.stderr
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=15)

    def test_bad_token_and_replay_change_nothing(self, cluster: Cluster, tmp_path: Path) -> None:
        """No token, a wrong token, a replayed hello and a hello for a challenge the worker never
        sent are each denied, leave authorized_keys unchanged and are logged with their
        reason (the token never)."""
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=self.TOKEN)
        worker = cluster.pods[1]
        authorized = tmp_path / worker.name / "state" / "authorized_keys"
        original = authorized.read_text()
        mallory = keys.generate(str(tmp_path / "mallory"), "mallory").public

        def send(line: bytes | Callable[[str], bytes]) -> bytes:
            return ask(cluster.pods[0], worker.address, line)

        # no token at all
        assert b"denied" in send(b'{"v":1,"type":"hello"}\n')
        # a well-formed hello signed with the wrong token
        assert b"denied" in send(hello_for("not-the-token-0123456789", mallory, worker.name))
        assert authorized.read_text() == original
        # a valid hello works on its own connection; replayed on another, it is refused
        captured: list[bytes] = []

        def good(challenge: str) -> bytes:
            captured.append(hello_for(self.TOKEN, mallory, worker.name)(challenge))
            return captured[0]

        first = json.loads(send(good))
        assert first["type"] == "record"
        assert mallory in authorized.read_text()
        authorized.write_text(original)
        assert b"denied" in send(captured[0])
        assert authorized.read_text() == original
        # a hello signed for a challenge this worker never sent is refused too
        forged, _ = exchange.make_hello(self.TOKEN, mallory, worker.name, "ab" * 32)
        assert b"denied" in send(forged)
        assert authorized.read_text() == original
        procs[0].send_signal(signal.SIGTERM)
        _, err = procs[0].communicate(timeout=15)
        reasons = [e.get("reason") for e in logs.named(err, "exchange refused")]
        assert reasons == [
            "not a hello message (of protocol version 3)",
            "bad mac (wrong or missing token)",
            "challenge is not the one sent on this connection (a replayed hello)",
            "challenge is not the one sent on this connection (a replayed hello)",
        ]
        assert self.TOKEN not in err
        assert "PRIVATE KEY" not in err


def test_free_port_race_retries(tmp_path: Path, root: None) -> None:
    """A port taken between choice and sshd start leads to a retry, not a failure."""
    key = keys.generate(str(tmp_path / "host"), "test")
    taker = socket.socket()
    taker.bind(("127.0.0.1", 0))
    taker.listen(1)
    taken = taker.getsockname()[1]
    ports = iter([taken])
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

    def argv_for(port: int) -> list[str]:
        cfg = tmp_path / f"sshd_config.{port}"
        cfg.write_text(
            sshd.config_text(
                port=port,
                listen=["127.0.0.1"],
                host_key=key.private_path,
                authorized_keys=str(tmp_path / "ak"),
                pid_file=str(tmp_path / "pid"),
                user="root",
            )
        )
        return ["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)]

    original = sshd.free_port
    sshd.free_port = lambda address: next(ports, None) or original(address)  # type: ignore[assignment]
    logs: list[tuple[str, dict[str, object]]] = []
    try:
        pid, port, _ = sshd.start(
            argv_for,
            {"PATH": "/usr/bin:/bin"},
            fixed_port=0,
            probe_address="127.0.0.1",
            bind_address="127.0.0.1",
            log=lambda e, **kw: logs.append((e, kw)),
        )
    finally:
        sshd.free_port = original  # type: ignore[assignment]
        taker.close()
    try:
        assert port != taken
        assert sshd.answers("127.0.0.1", port)
        assert [e for e, _ in logs] == ["sshd lost its port", "sshd ready"]
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def test_non_root_job_on_a_high_port(
    cluster: Cluster, uid1000: str, runtime_for_others: Path
) -> None:
    """A job running as uid 1000 throughout (no privilege at all, as MPI Operator's
    non-root images run): the worker serves the job's key on a high port from its default
    state directory (~/.mpi-bootstrap/HOSTNAME), and the
    launcher, as the same user, runs a rank there."""
    import shutil
    import tempfile

    # Below /run, which only root writes (the project's rule for tests' state).
    tmp = Path(tempfile.mkdtemp(prefix="mpib-nr-", dir="/run"))
    try:
        tmp.chmod(0o755)
        xdir = tmp / "exchange"
        for d in (xdir, tmp / "home-worker", tmp / "home-launcher"):
            d.mkdir()
            os.chown(d, 1000, 1000)
        worker, launcher = cluster.pods[1], cluster.pods[0]

        def env(home: str, **extra: str) -> dict[str, str]:
            return {
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp / home),
                "LANG": "C.UTF-8",
                "MPI_BOOTSTRAP_EXCHANGE_DIR": str(xdir),
                "MPI_BOOTSTRAP_LOG_FORMAT": "json",
                "PYTHONPATH": str(runtime_for_others),
                **extra,
            }

        agent = [
            "setpriv",
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "/usr/bin/python3",
            "-m",
            "mpi_bootstrap",
        ]
        p = cluster.start(worker, [*agent, "worker"], env("home-worker"))

        def published() -> bool:
            if (xdir / f"{worker.name}.json").exists():
                return True
            assert p.poll() is None, p.stderr.read()  # type: ignore[union-attr]
            return False

        wait_until(published, 20, f"{worker.name}'s record")
        rec = json.loads((xdir / f"{worker.name}.json").read_text())
        assert rec["user"] == uid1000
        assert rec["port"] >= 1024
        state = tmp / "home-worker" / ".mpi-bootstrap" / worker.name  # the non-root default
        assert state.stat().st_uid == 1000
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        hf = tmp / "hostfile"
        hf.write_text(f"{worker.name} slots=1\n")
        done = launcher.run(
            [*agent, "launcher", "--", "id", "-u"],
            env(
                "home-launcher",
                MPI_HOSTFILE=str(hf),
                MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(tmp / "home-launcher" / "out"),
            ),
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1000"]  # the rank ran as the worker's user
        assert p.wait(timeout=15) == 0  # job-done, written by the launcher as uid 1000
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
