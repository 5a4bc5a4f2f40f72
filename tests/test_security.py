"""The agent's security promises, each proved against the real programs: the real
`mpi-bootstrap worker` with its real OpenSSH sshd, real ssh and paramiko clients, and the
real launcher running Open MPI 4, in a simulated cluster of network namespaces.

SECURITY.md cites these classes: one class per promise, its docstring saying which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import paramiko
import pytest

from mpi_bootstrap.core import records
from mpi_bootstrap.ssh import keys
from mpi_bootstrap.ssh import netx as exchange
from tests.conftest import AGENT, SSH_SERVERS
from tests.support import logs
from tests.support.audit import mode_problems, private_key_lines
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.podnet import EXCHANGE_PORT, ask, connect, hello_for, wait_listening
from tests.support.workers import (
    TOKEN,
    WORKERS,
    command_lines,
    launcher_env,
    make_mount,
    record_of,
    start_workers,
    stop,
    token_volume,
)

pytestmark = [pytest.mark.timeout(240)]

# Fresh per run, like TOKEN (tests/support/workers.py): a token that is not the job's.
WRONG_TOKEN = "tok-" + secrets.token_hex(16)
MARKER = "MPIB_SECURITY_MARKER=reached-mpirun"  # in the launcher's env, seen by a local rank


# ---------------------------------------------------------------- helpers


def exchange_env(tmp: Path, mode: str) -> dict[str, str]:
    """Settings for one exchange mode. The token is set in every mode: wherever it is
    unused it must still never reach a log or mpirun. `net-file`: `net` with the token
    in a Secret volume's file (MPI_BOOTSTRAP_TOKEN_FILE), not in the environment."""
    if mode == "net-file":
        return {"MPI_BOOTSTRAP_EXCHANGE": "net", "MPI_BOOTSTRAP_TOKEN_FILE": str(token_volume(tmp))}
    env = {"MPI_BOOTSTRAP_EXCHANGE": mode, "MPI_BOOTSTRAP_TOKEN": TOKEN}
    if mode == "dir":
        (tmp / "exchange").mkdir()
        env["MPI_BOOTSTRAP_EXCHANGE_DIR"] = str(tmp / "exchange")
    elif mode == "secret":
        env["MPI_BOOTSTRAP_SSH_AUTH_DIR"] = str(make_mount(tmp))
    return env


@dataclasses.dataclass
class JobRun:
    tmp: Path
    mode: str
    job: subprocess.CompletedProcess[str]
    outputs: dict[str, str]  # everything the agent printed, by where it came from


def run_job(
    cluster: Cluster,
    tmp: Path,
    mode: str,
    *,
    level: str = "info",
    fmt: str = "json",
    server: Mapping[str, str] = SSH_SERVERS["openssh"],
) -> JobRun:
    """Workers (on `server`: SSH_SERVERS), `launcher --explain` (text and JSON), then a
    real job whose program is `env` on every rank, one of them on the launcher itself (so
    it inherits mpirun's environment); then the workers are stopped. Returns all that was
    printed."""
    extra = {
        **exchange_env(tmp, mode),
        "MPI_BOOTSTRAP_LOG_LEVEL": level,
        "MPI_BOOTSTRAP_LOG_FORMAT": fmt,
    }
    procs = start_workers(cluster, tmp, **extra, **server)
    hostfile = "job-launcher slots=1\n" + "".join(f"{w} slots=1\n" for w in WORKERS)
    name, _, value = MARKER.partition("=")
    env = launcher_env(tmp, cluster, hostfile, **{name: value}, **extra)
    launcher = cluster.pods[0]
    outputs: dict[str, str] = {}
    for flags in (["--explain"], ["--explain", "--json"]):
        done = launcher.run([AGENT, "launcher", *flags, "--", "env"], env, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs[f"launcher {' '.join(flags)}: stdout"] = done.stdout
        outputs[f"launcher {' '.join(flags)}: stderr"] = done.stderr
    job = launcher.run([AGENT, "launcher", "--", "env"], env, timeout=120)
    assert job.returncode == 0, job.stderr
    outputs["launcher job: stdout"] = job.stdout
    outputs["launcher job: stderr"] = job.stderr
    outputs["command lines"] = command_lines(cluster)
    worker0 = cluster.pods[1]
    probe = worker0.run([AGENT, "probe"], agent_env(tmp, worker0, **extra), timeout=30)
    outputs["probe: stdout+stderr"] = probe.stdout + probe.stderr
    for pod, (out, err) in zip(cluster.pods[1:], stop(cluster, procs), strict=True):
        outputs[f"worker {pod.name}: stdout"] = out
        outputs[f"worker {pod.name}: stderr"] = err
    return JobRun(tmp, mode, job, outputs)


# ---------------------------------------------------------------- 1. file modes

# Every path the agent may leave behind, relative to its root → its exact mode. A path
# not listed here fails the test: a new file must be given a mode on purpose.
WORKER_STATE = {
    ".": 0o700,
    "ssh_host_ed25519_key": 0o600,
    "ssh_host_ed25519_key.pub": 0o644,
    "id_job": 0o600,  # the Secret's key, copied (secret exchange, or mounted as well)
    "id_job.pub": 0o644,
    "authorized_keys": 0o600,
    "sshd_config": 0o600,
    "sshd.pid": 0o644,  # written by sshd itself
    "ssh_server.json": 0o600,  # the agent's own ssh server's settings, in sshd's place
    "record.json": 0o644,
    "control": 0o600,  # the watch's control FIFO: claims from the launcher's sessions
    ".lock": 0o600,  # held by the agent's PID 1: the directory is this pod's alone
}
WORKER_FIFOS = frozenset({"control"})
LAUNCHER_STATE = {
    ".": 0o700,
    ".lock": 0o600,  # held by the agent's PID 1: the directory is this pod's alone
    "ssh_config": 0o600,
    "known_hosts": 0o644,
    "id_launcher": 0o600,  # net exchange
    "id_launcher.pub": 0o644,
    "id_job": 0o600,  # secret exchange
    "ssh-launcher": 0o755,  # hydra's ssh wrapper (without the launch gate only)
    "ssh-gate": 0o700,  # the launch gate (its marks, gate/, are gone with mpirun)
    "cm": 0o700,  # ssh connection reuse: the control sockets (a short state dir only)
}
EXCHANGE_DIR = {
    ".lock": 0o600,  # flock: the job key is made, adopted and cleaned one pod at a time
    "job-key": 0o700,
    "job-key/id": 0o600,
    "job-key/id.pub": 0o644,
    "job-worker-*.json": 0o644,
    "job-done": 0o644,
}
# What each exchange must have written (so an empty walk cannot pass).
REQUIRED = {
    "dir": (
        {
            "ssh_host_ed25519_key",
            "ssh_host_ed25519_key.pub",
            "authorized_keys",
            "sshd_config",
            "record.json",
        },
        {"ssh_config", "known_hosts", "id_job"},
        {
            "job-key",
            "job-key/id",
            "job-key/id.pub",
            "job-worker-0.json",
            "job-worker-1.json",
            "job-done",
        },
    ),
    "net": (
        {
            "ssh_host_ed25519_key",
            "ssh_host_ed25519_key.pub",
            "authorized_keys",
            "sshd_config",
            "record.json",
        },
        {"ssh_config", "known_hosts", "id_launcher", "id_launcher.pub"},
        set(),
    ),
    "secret": (
        {"id_job", "id_job.pub", "authorized_keys", "sshd_config", "record.json"},
        {"ssh_config", "known_hosts", "id_job"},
        set(),
    ),
}


class TestFileModes:
    """Every key and config file the agent writes is private (0600 in a 0700 directory) or
    public on purpose, none is writable by group or others, and no temporary file stays."""

    @pytest.mark.parametrize(
        ("mode", "server"),
        [*((m, "openssh") for m in ("dir", "net", "secret")), ("dir", "agent-ssh-server")],
    )
    def test_after_a_job(self, cluster: Cluster, tmp_path: Path, mode: str, server: str) -> None:
        """After a real job in each exchange mode, every path the agent wrote has exactly its listed
        mode (keys 0600, dirs 0700), none is writable by others, and no temporary file remains."""
        run = run_job(cluster, tmp_path, mode, server=SSH_SERVERS[server])
        worker_req, launcher_req, exchange_req = REQUIRED[mode]
        if server != "openssh":
            worker_req = worker_req - {"sshd_config"} | {"ssh_server.json"}
        problems = []
        for w in WORKERS:
            problems += mode_problems(
                tmp_path / w / "state", WORKER_STATE, worker_req, WORKER_FIFOS
            )
        problems += mode_problems(tmp_path / "job-launcher" / "state", LAUNCHER_STATE, launcher_req)
        if mode == "dir":
            problems += mode_problems(tmp_path / "exchange", EXCHANGE_DIR, exchange_req)
        for out in ("mpi-hostfile", "mpi-hostfile.orig"):  # the rewritten hostfile
            m = stat.S_IMODE((tmp_path / out).stat().st_mode)
            if m != 0o644:
                problems.append(f"{out}: mode {m:04o}, expected 0644")
        assert problems == [], "\n".join(problems)
        assert run.job.returncode == 0

    @pytest.mark.parametrize("role", ["worker", "launcher"])
    def test_existing_open_state_dir_is_made_private(
        self, cluster: Cluster, tmp_path: Path, role: str
    ) -> None:
        """A pre-existing 0755 state dir of a worker or the launcher is made 0700 by a real run."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        pod = cluster.pods[0 if role == "launcher" else 1]
        state = tmp_path / pod.name / "state"
        state.mkdir(parents=True)
        state.chmod(0o755)
        start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        env = launcher_env(
            tmp_path,
            cluster,
            "".join(f"{w} slots=1\n" for w in WORKERS),
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
        )
        done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env)
        assert done.returncode == 0, done.stderr
        assert stat.S_IMODE(state.stat().st_mode) == 0o700

    @pytest.mark.parametrize("kind", ["owned-by-uid-1000", "symlink-to-it"])
    @pytest.mark.parametrize("role", ["worker", "launcher"])
    def test_state_dir_of_another_user_is_refused(
        self, cluster: Cluster, tmp_path: Path, role: str, kind: str
    ) -> None:
        """E.g. /tmp/mpi-bootstrap-<uid> (the non-root default) made first by someone else."""
        xdir = tmp_path / "exchange"
        xdir.mkdir()
        pod = cluster.pods[0 if role == "launcher" else 1]
        state = tmp_path / pod.name / "state"
        target = state if kind == "owned-by-uid-1000" else tmp_path / "squatted"
        target.mkdir(parents=True)
        os.chown(target, 1000, 1000)
        target.chmod(0o777)
        if target != state:
            state.parent.mkdir(exist_ok=True)
            state.symlink_to(target)
        if role == "worker":
            p = cluster.start(
                pod,
                [AGENT, "worker"],
                agent_env(tmp_path, pod, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir)),
            )
            _, err = p.communicate(timeout=30)
            code = p.returncode
        else:
            start_workers(cluster, tmp_path, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
            env = launcher_env(
                tmp_path,
                cluster,
                "".join(f"{w} slots=1\n" for w in WORKERS),
                MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            )
            done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env)
            code, err = done.returncode, done.stderr
        assert code == 64, err
        assert f"MPI_BOOTSTRAP_STATE_DIR: {state}" in err
        assert list(target.iterdir()) == []
        assert target.stat().st_uid == 1000 and stat.S_IMODE(target.stat().st_mode) == 0o777


# ---------------------------------------------------------------- 2–4. the worker's sshd


@dataclasses.dataclass(frozen=True)
class Live:
    """One running worker (dir exchange), reached from the launcher pod."""

    launcher: Pod
    address: str
    port: int
    host_key: str
    user: str
    job_key: Path  # the private key the worker's sshd authorises
    tmp: Path


@pytest.fixture(scope="module", params=sorted(SSH_SERVERS))
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, netns: None
) -> Iterator[Live]:
    """Each of the worker's ssh servers in turn (SSH_SERVERS)."""
    tmp = tmp_path_factory.mktemp("live")
    with Cluster(["job-launcher", "job-worker-0"]) as c:
        xdir = tmp / "exchange"
        xdir.mkdir()
        start_workers(c, tmp, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir), **SSH_SERVERS[request.param])
        rec = record_of(tmp, c.pods[1])
        yield Live(
            c.pods[0],
            c.pods[1].address,
            int(rec["port"]),  # type: ignore[call-overload]
            str(rec["host_key"]),
            str(rec["user"]),
            xdir / "job-key" / "id",
            tmp,
        )


@contextlib.contextmanager
def transport(live: Live) -> Iterator[paramiko.Transport]:
    """An SSH transport to the worker's sshd, its host key checked against the record."""
    t = paramiko.Transport(connect(live.launcher, live.address, live.port))
    try:
        t.start_client(timeout=20)
        key = t.get_remote_server_key()
        assert f"{key.get_name()} {key.get_base64()}" == live.host_key
        yield t
    finally:
        t.close()


def job_key(live: Live) -> paramiko.PKey:
    return paramiko.Ed25519Key(filename=str(live.job_key))


def accepted(live: Live, user: str, key: paramiko.PKey) -> bool:
    with transport(live) as t:
        try:
            t.auth_publickey(user, key)
        except paramiko.AuthenticationException:
            return False
        return t.is_authenticated()


def openssh(
    live: Live, *options: str, command: str = "true", identity: bool = False
) -> subprocess.CompletedProcess[str]:
    """The real `ssh` client, from the launcher pod, the worker's host key pinned."""
    known = live.tmp / "known_hosts"
    known.write_text(f"[{live.address}]:{live.port} {live.host_key}\n")
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-p",
        str(live.port),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "ConnectTimeout=10",
        *options,
    ]
    if identity:
        argv += ["-i", str(live.job_key), "-o", "IdentitiesOnly=yes"]
    return live.launcher.run(
        [*argv, f"{live.user}@{live.address}", command],
        {"PATH": "/usr/bin:/bin", "HOME": str(live.tmp)},
        timeout=60,
    )


class TestSshdRefusesPasswords:
    """A worker's sshd offers public-key authentication only: no password, no
    keyboard-interactive, no login without credentials."""

    def test_auth_none_offers_only_publickey(self, live: Live) -> None:
        """Auth `none` does not log in, and the worker's sshd names publickey as its only method."""
        with transport(live) as t, pytest.raises(paramiko.BadAuthenticationType) as err:
            t.auth_none(live.user)
        assert err.value.allowed_types == ["publickey"]

    def test_password(self, live: Live) -> None:
        """A password attempt is refused outright: the worker's sshd offers publickey only."""
        with transport(live) as t, pytest.raises(paramiko.BadAuthenticationType) as err:
            t.auth_password(live.user, "any-password", fallback=False)
        assert err.value.allowed_types == ["publickey"]

    def test_keyboard_interactive(self, live: Live) -> None:
        """Keyboard-interactive auth is refused: the worker's sshd offers publickey only."""
        with transport(live) as t, pytest.raises(paramiko.BadAuthenticationType) as err:
            t.auth_interactive_dumb(live.user)
        assert err.value.allowed_types == ["publickey"]

    def test_openssh_client_password(self, live: Live) -> None:
        """The real ssh client limited to password/keyboard-interactive is denied, while the
        job's key works."""
        done = openssh(
            live,
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
            "-o",
            "PubkeyAuthentication=no",
        )
        assert done.returncode == 255
        # The server's list of methods that can continue: publickey alone.
        assert "Permission denied (publickey)." in done.stderr
        assert openssh(live, identity=True).returncode == 0  # the job's key does work


class TestSshdRefusesStrangers:
    """A worker's sshd admits only the job's key, and only for the job's user."""

    def test_right_key_and_user_are_accepted(self, live: Live) -> None:
        """Control: the job's key logs in as the job's user, so the refusals mean something."""
        assert accepted(live, live.user, job_key(live))

    def test_unknown_key(self, live: Live, tmp_path: Path) -> None:
        """A key that is not the job's cannot log in to a worker, while the job's key still can."""
        keys.generate(str(tmp_path / "stranger"), "stranger")
        stranger = paramiko.Ed25519Key(filename=str(tmp_path / "stranger"))
        assert not accepted(live, live.user, stranger)
        assert accepted(live, live.user, job_key(live))

    @pytest.mark.parametrize("uid", [1000, 65534], ids=["uid1000", "nobody"])
    def test_other_user(self, live: Live, uid: int) -> None:
        """The job's key cannot log in as another real account (uid 1000, nobody): AllowUsers."""
        try:
            other = pwd.getpwuid(uid).pw_name  # a real account: sshd would serve it
        except KeyError:
            pytest.fail(f"no user with uid {uid} on this machine")
        assert other != live.user
        assert not accepted(live, other, job_key(live))  # AllowUsers
        assert accepted(live, live.user, job_key(live))


# Requested by the client → whether it must arrive (sshd.ACCEPT_ENV).
ENV_REQUESTS = {
    "NCCL_DEBUG": ("INFO", True),
    "LD_LIBRARY_PATH": ("/opt/mpi/lib", True),
    "UCX_TLS": ("tcp,self", True),
    "FOO_SECRET": ("do-not-accept", False),
    "LD_PRELOAD": ("/nonexistent/evil.so", False),
    "BASH_ENV": ("/nonexistent/evil.sh", False),
    "PATH": ("/nonexistent/evil-bin", False),
}


def check_env(text: str) -> None:
    got = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    for name, (value, arrives) in ENV_REQUESTS.items():
        if arrives:
            assert got.get(name) == value, f"{name} did not arrive"
        else:
            assert value not in text, f"{name}={value} was accepted"
    assert "LD_PRELOAD" not in got and "BASH_ENV" not in got and "FOO_SECRET" not in got


class TestSshdAcceptsOnlyForwardedEnv:
    """A session receives the MPI/NCCL/UCX variables the launcher forwards and nothing else
    the client asks for (never LD_PRELOAD, BASH_ENV or PATH)."""

    def test_paramiko_env_requests(self, live: Live) -> None:
        """Env requests over paramiko: the MPI/NCCL/UCX variables arrive; LD_PRELOAD, BASH_ENV, PATH
        and other names do not."""
        with transport(live) as t:
            t.auth_publickey(live.user, job_key(live))
            chan = t.open_session(timeout=20)
            chan.settimeout(20)
            chan.update_environment({k: v for k, (v, _) in ENV_REQUESTS.items()})
            chan.exec_command("env")
            out = chan.makefile("rb").read().decode()
            assert chan.recv_exit_status() == 0
        check_env(out)

    def test_openssh_setenv(self, live: Live) -> None:
        """The same through the real ssh client's SetEnv: only the forwarded variables arrive."""
        setenv = " ".join(f"{k}={v}" for k, (v, _) in ENV_REQUESTS.items())
        done = openssh(live, "-o", f"SetEnv={setenv}", command="env", identity=True)
        assert done.returncode == 0, done.stderr
        check_env(done.stdout)


# ---------------------------------------------------------------- 5. the net exchange

# An impostor on a worker's address: answers every hello with a record signed with the
# token it was given (argv: address, port, record JSON, token) or (replay) with a fixed,
# recorded reply (argv: address, port, "replay", reply). Standard library only; it
# follows the protocol in ssh/netx.py's docstring, written out again on purpose.
IMPOSTOR = r"""
import hashlib, hmac, json, socket, sys
address, port, what, arg = sys.argv[1:5]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((address, int(port)))
srv.listen(16)
while True:
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(5)
        data = b""
        try:
            conn.sendall(json.dumps({"v": 3, "type": "challenge", "challenge": "c" * 64}).encode()
                         + b"\n")
            while b"\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            if not data.strip():
                continue
            if what == "replay":
                conn.sendall(arg.encode() + b"\n")
                continue
            hello = json.loads(data.split(b"\n")[0])
            key = hmac.new(arg.encode(), b"mpi-bootstrap exchange v3", hashlib.sha256).digest()
            reply = {"v": 3, "type": "record", "nonce": hello["nonce"],
                     "record": json.loads(what)}
            body = json.dumps(reply, sort_keys=True, separators=(",", ":")).encode()
            reply["mac"] = hmac.new(key, body, hashlib.sha256).hexdigest()
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except (OSError, ValueError):
            pass
"""


def start_impostor(cluster: Cluster, pod: Pod, what: str, arg: str) -> subprocess.Popen[str]:
    p = cluster.start(
        pod,
        ["/usr/bin/python3", "-c", IMPOSTOR, pod.address, str(EXCHANGE_PORT), what, arg],
        {"PATH": "/usr/bin:/bin"},
    )
    wait_listening(cluster.pods[0], pod.address, EXCHANGE_PORT, p)
    return p


def impostor_record(tmp: Path, pod: Pod) -> dict[str, object]:
    pair = keys.generate(str(tmp / "impostor_host_key"), "impostor")
    return records.Record(pod.name, (pod.address,), 2222, pair.public, "root").to_dict()


def net_launch(
    cluster: Cluster, tmp: Path, workers: list[str], state: str, token: str, *, deadline: float = 5
) -> subprocess.CompletedProcess[str]:
    env = launcher_env(
        tmp,
        cluster,
        "".join(f"{w} slots=1\n" for w in workers),
        MPI_BOOTSTRAP_TOKEN=token,
        MPI_DNS_WAIT_SECONDS=f"{deadline:g}",
        MPI_BOOTSTRAP_STATE_DIR=str(tmp / state),
    )
    return cluster.pods[0].run([AGENT, "launcher", "--", "hostname"], env, timeout=60)


def trusted_keys(tmp: Path, state: str) -> str:
    path = tmp / state / "known_hosts"
    return path.read_text() if path.exists() else ""


# Hellos with a bad token, and replayed hellos, are already proved refused by
# tests/test_ssh.py::TestNetExchange::test_bad_token_and_replay_change_nothing.
class TestNetExchangeRefuses:
    """Without the token nobody can add a key to a worker or pass as one: a hello altered
    after signing is denied and changes nothing, and a worker reply not signed for this
    very request with the job's token is never trusted (exit 69)."""

    def test_tampered_hello_changes_nothing(self, cluster: Cluster, tmp_path: Path) -> None:
        """A signed hello with its key, nonce or challenge altered is denied and authorises nothing
        (logged as a bad mac); the untouched hello is accepted."""
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=TOKEN)
        worker = cluster.pods[1]
        authorized = tmp_path / worker.name / "state" / "authorized_keys"
        original = authorized.read_text()
        alice = keys.generate(str(tmp_path / "alice"), "alice").public
        mallory = keys.generate(str(tmp_path / "mallory"), "mallory").public
        tampered = {
            "client_key": mallory,
            "nonce": secrets.token_hex(32),
            "challenge": secrets.token_hex(32),
        }
        for field, value in tampered.items():

            def altered(challenge: str, field: str = field, value: str = value) -> bytes:
                hello, _ = exchange.make_hello(TOKEN, alice, worker.name, challenge)
                return json.dumps({**json.loads(hello), field: value}).encode() + b"\n"  # mac kept

            assert json.loads(ask(cluster.pods[0], worker.address, altered)) == {
                "type": "denied"
            }, field
            assert authorized.read_text() == original, field
        # The same message, untouched, is accepted: only the tampering was refused.
        reply = json.loads(
            ask(cluster.pods[0], worker.address, hello_for(TOKEN, alice, worker.name))
        )
        assert reply["type"] == "record"
        assert alice in authorized.read_text()
        assert mallory not in authorized.read_text()
        _, err = stop(cluster, procs)[0]
        reasons = [e.get("reason") for e in logs.named(err, "exchange refused")]
        assert reasons == ["bad mac (wrong or missing token)"] * len(tampered)

    def test_impostor_worker_is_not_trusted(self, tmp_path: Path, netns: None) -> None:
        """A fake worker whose record is signed with another token is refused at once (69): its host
        key is not trusted and mpirun never starts; signed with the job's token, it is believed."""
        with Cluster(["job-launcher", "job-worker-0"]) as c:
            pod = c.pods[1]
            record = impostor_record(tmp_path, pod)
            key = str(record["host_key"])
            # Control: signed with the job's token, the same reply is believed.
            p = start_impostor(c, pod, json.dumps(record), TOKEN)
            # (nothing serves ssh at the record's port: the launcher then waits it out)
            done = net_launch(c, tmp_path, ["job-worker-0"], "control", TOKEN, deadline=8)
            assert key in trusted_keys(tmp_path, "control"), done.stderr
            p.terminate()
            p.wait(timeout=10)
            # Signed with another token: refused at once, nothing trusted, mpirun never runs.
            start_impostor(c, pod, json.dumps(record), WRONG_TOKEN)
            t0 = time.monotonic()
            done = net_launch(c, tmp_path, ["job-worker-0"], "state", TOKEN, deadline=90)
            assert done.returncode == 69, done.stderr
            assert "job-worker-0: exchange reply not signed with the job's token" in done.stderr
            assert key not in trusted_keys(tmp_path, "state")
            assert logs.no_rank_started(done.stderr)
            assert time.monotonic() - t0 < 45  # refused at once, not retried to the deadline

    def test_replayed_reply_is_not_trusted(self, cluster: Cluster, tmp_path: Path) -> None:
        """A genuine reply of job-worker-0, recorded and replayed by job-worker-1."""
        procs = start_workers(cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=TOKEN)
        real, impostor = cluster.pods[1], cluster.pods[2]
        throwaway = keys.generate(str(tmp_path / "throwaway"), "throwaway").public
        nonces: list[str] = []
        recorded = ask(
            cluster.pods[0], real.address, hello_for(TOKEN, throwaway, real.name, nonces)
        )
        # Control: the recorded reply is valid for the request it answered.
        rec = exchange.read_reply(recorded, TOKEN, nonces[0], real.name)
        assert rec.host == real.name
        cluster.signal(procs[1])  # job-worker-1's real worker gives way
        procs[1].wait(timeout=15)
        start_impostor(cluster, impostor, "replay", recorded.decode())
        done = net_launch(cluster, tmp_path, ["job-worker-1"], "state", TOKEN)
        assert done.returncode == 69, done.stderr
        assert "no record from job-worker-1" in done.stderr
        assert "answers another request (replay)" in done.stderr  # the reason is named
        assert rec.host_key not in trusted_keys(tmp_path, "state")
        assert logs.no_rank_started(done.stderr)


# ---------------------------------------------------------------- 6. secrets in output


def leaks(outputs: Mapping[str, str], key_lines: set[str]) -> list[str]:
    found = []
    for where, text in outputs.items():
        if TOKEN in text:
            found.append(f"{where}: the token")
        if "PRIVATE KEY" in text:
            found.append(f"{where}: a PRIVATE KEY marker")
        found += [f"{where}: a private key line" for ln in key_lines if ln in text][:1]
    return found


# Every level for the exchange that uses the token; every exchange at debug; each
# exchange at debug on the agent's own ssh server too.
LOG_CASES = [
    *(
        pytest.param(("net", level, "json", "openssh"), id=f"net-{level}-json")
        for level in ("debug", "info", "warning", "error")
    ),
    *(
        pytest.param((mode, "debug", "json", "openssh"), id=f"{mode}-debug-json")
        for mode in ("dir", "secret")
    ),
    *(
        pytest.param((mode, "debug", "console", "openssh"), id=f"{mode}-debug-console")
        for mode in ("dir", "net", "secret")
    ),
    *(
        pytest.param(("net-file", "debug", fmt, "openssh"), id=f"net-file-debug-{fmt}")
        for fmt in ("json", "console")
    ),
    *(
        pytest.param((mode, "debug", "json", "agent-ssh-server"), id=f"{mode}-agent-ssh-server")
        for mode in ("dir", "net", "secret")
    ),
]


class TestNoSecretInOutput:
    """No token and no private key material appears in any log line, `--explain` output
    or command line, at any log level and format, and the token never reaches mpirun's
    environment."""

    @pytest.mark.parametrize("case", LOG_CASES)
    def test_job_and_explain(
        self, cluster: Cluster, tmp_path: Path, case: tuple[str, str, str, str]
    ) -> None:
        """At each log level and format, no token or private key line appears in logs, --explain,
        probe or command lines, and no rank's environment holds the token."""
        mode, level, fmt, server = case
        run = run_job(cluster, tmp_path, mode, level=level, fmt=fmt, server=SSH_SERVERS[server])
        roots = [tmp_path / p.name / "state" for p in cluster.pods]
        roots += [tmp_path / d for d in ("exchange", "secret") if (tmp_path / d).exists()]
        count, key_lines = private_key_lines(roots)
        # host keys of both workers (or the Secret's key) and the client key: ≥ 3 files
        assert count >= 3 and key_lines
        assert leaks(run.outputs, key_lines) == []
        # The rank on the launcher inherits mpirun's environment (the marker proves it
        # is there), and the token is not in it; nor in any remote rank's.
        ranks = run.job.stdout.count("OMPI_COMM_WORLD_RANK=")
        assert ranks == 3, run.job.stdout
        assert run.job.stdout.count(MARKER) == 1
        assert "MPI_BOOTSTRAP_TOKEN=" not in run.job.stdout  # (the file's path may be)
        if level == "debug":  # the logs were really collected
            assert "mpirun start" in run.outputs["launcher job: stderr"]
            assert "sshd ready" in run.outputs["worker job-worker-0: stderr"]
        if level != "error":  # the token in the environment is warned about, the file not
            for where in ("launcher job: stderr", "worker job-worker-0: stderr"):
                assert ("token exposed" in run.outputs[where]) == (mode != "net-file"), where

    def test_failures(self, cluster: Cluster, tmp_path: Path) -> None:
        """Error paths: a token mismatch, and a token too short to be accepted."""
        procs = start_workers(
            cluster, tmp_path, MPI_BOOTSTRAP_TOKEN=TOKEN, MPI_BOOTSTRAP_LOG_LEVEL="debug"
        )
        outputs = {}
        done = net_launch(cluster, tmp_path, WORKERS, "state", WRONG_TOKEN)
        assert done.returncode == 69, done.stderr
        outputs["launcher, wrong token"] = done.stdout + done.stderr
        # The launcher stops at the first refusal, and names that worker; the other may
        # not have been asked by then (the records are fetched as the names resolve).
        error = str((logs.event(done.stderr, "failed") or {}).get("error"))
        refused = [w for w in WORKERS if w in error]
        assert refused, done.stderr
        short = "short-secret-1"  # < 16 characters: a config error that must not echo it
        env = launcher_env(tmp_path, cluster, "job-worker-0 slots=1\n", MPI_BOOTSTRAP_TOKEN=short)
        done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env)
        assert done.returncode == 64, done.stderr
        assert "MPI_BOOTSTRAP_TOKEN" in done.stderr
        assert short not in done.stdout + done.stderr
        for pod, (out, err) in zip(cluster.pods[1:], stop(cluster, procs), strict=True):
            outputs[f"worker {pod.name}"] = out + err
        assert "exchange refused" in outputs[f"worker {refused[0]}"], (error, outputs)
        _, key_lines = private_key_lines([tmp_path / w / "state" for w in WORKERS])
        assert leaks(outputs, key_lines) == []
        assert all(WRONG_TOKEN not in text for text in outputs.values())
