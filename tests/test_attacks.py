"""Attacks on the agent's trust — its state directory, the exchanges, the keys, the
token, sshd — each made for real against the real agent, its real sshd and the real ssh
client, in a simulated cluster: the attacker is a real unprivileged user (uid 1000) in
the pod, or a pod on the network without the token. The outside review's seven findings,
and the second one's first (a planted state directory, also for the doctor and the
readiness probe). Each test fails on the code the review attacked, and passes only when
the attack fails. SECURITY.md cites these classes. (The data check attacked:
tests/test_datacheck_attacks.py; a termination message through a swapped directory:
tests/test_termlog.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mpi_bootstrap.core import names
from mpi_bootstrap.ssh import keys, sshd
from tests.conftest import AGENT, SSH_SERVERS
from tests.support import logs, wire
from tests.support.attacker import as_attacker
from tests.support.cluster import Cluster, agent_env
from tests.support.podnet import EXCHANGE_PORT, LISTEN, ask, hello_for, replay, wait_listening
from tests.support.wait import holds_for, wait_until
from tests.support.workers import (
    TOKEN,
    WORKERS,
    kubelet_exec,
    launcher_env,
    start_workers,
    token_volume,
    wait_ready,
)

pytestmark = [pytest.mark.timeout(240)]

# Long enough for the workers' look for job-done (once a second) to come round.
JOB_DONE_POLLS_S = 1.5


def attacker_keys(base: Path) -> Path:
    """The attacker's key pair (and a host key for a fake sshd), owned by uid 1000."""
    d = base / "attacker"
    d.mkdir()
    keys.generate(str(d / "id"), "attacker")
    keys.generate(str(d / "host"), "attacker host key")
    for path in (d, *d.iterdir()):
        os.chown(path, 1000, 1000)
    return d / "id"


def login(
    cluster: Cluster, address: str, port: int, key: Path, user: str = "root"
) -> subprocess.CompletedProcess[str]:
    """The real ssh client, from the launcher pod, logging in with `key`; accepts any host
    key (the attacker does not care who answers)."""
    return cluster.pods[0].run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=5",
            "-p",
            str(port),
            f"{user}@{address}",
            "id -u",
        ],
        {"PATH": "/usr/bin:/bin"},
        timeout=30,
    )


def assert_kept_out(done: subprocess.CompletedProcess[str]) -> None:
    assert not (done.returncode == 0 and done.stdout.strip() == "0"), (
        "the attacker logged in as root"
    )


def worker_up_or_gone(p: subprocess.Popen[str], record: Path) -> None:
    wait_until(
        lambda: p.poll() is not None or record.exists(),
        20,
        "the worker to publish its record or exit",
    )


# ---------------------------------------------------------------- finding 1


class TestStateDirSwap:
    """Finding 1: a state directory under a parent others may write (a Kubernetes
    emptyDir: 0777, no sticky bit) or another uid owns can be renamed away and replaced
    by one holding someone else's `authorized_keys` and host key, which sshd would read
    by path. The agent holds such a directory open and every program reaches it through
    /proc/PID/fd/N (system/files.py state_dir): the swap gets no login, and the job
    still runs (an emptyDir at /tmp is all a hardened pod has: tests/test_platforms.py)."""

    @pytest.mark.parametrize("how", ["emptydir", "owned-by-1000"])
    def test_swap_gets_no_login(
        self, cluster: Cluster, base: Path, how: str, ssh_server: dict[str, str]
    ) -> None:
        """uid 1000 renames the worker's state directory away and puts its own key and
        host key in its place: its login is refused, and a launcher whose own state
        directory is in such a place too runs the job on the worker after the swap."""
        parent = base / "parent"
        parent.mkdir()
        if how == "emptydir":
            parent.chmod(0o777)  # what kubelet makes of an emptyDir (kubernetes#110835)
        else:
            os.chown(parent, 1000, 1000)
        state = parent / "worker-state"
        xdir = base / "exchange"
        xdir.mkdir()
        worker = cluster.pods[1]
        p = cluster.start(
            worker,
            [AGENT, "worker"],
            agent_env(
                base,
                worker,
                MPI_BOOTSTRAP_STATE_DIR=str(state),
                MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
                MPI_BOOTSTRAP_SSHD_PORT="2222",
                **ssh_server,
            ),
        )
        worker_up_or_gone(p, xdir / f"{worker.name}.json")
        assert p.poll() is None, p.stderr.read()  # type: ignore[union-attr]
        key = attacker_keys(base)
        as_attacker(
            f"mv {state} {parent}/taken; mkdir -m 700 {state}; "
            f"cp {key}.pub {state}/authorized_keys; "
            f"cp {base}/attacker/host {state}/ssh_host_ed25519_key; "
            f"chmod 600 {state}/authorized_keys {state}/ssh_host_ed25519_key"
        )
        assert_kept_out(login(cluster, worker.address, 2222, key))
        env = launcher_env(
            base,
            cluster,
            f"{worker.name} slots=1\n",
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_BOOTSTRAP_STATE_DIR=str(parent / "launcher-state"),
        )
        done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env)
        assert done.returncode == 0, done.stderr
        assert "state directory held" in done.stderr
        assert (parent / "launcher-state" / "ssh_config").exists()


# ---------------------------------------------------------------- finding 2


class TestDoctorTrustsNoPlantedFile:
    """The second outside review's finding 1: `doctor` ran `ssh -F STATE_DIR/ssh_config`
    from a state directory the launcher refuses, so a ProxyCommand planted there by another
    uid ran as root. The doctor (and the readiness probe) now read nothing from a directory
    the launcher would refuse (the same check, system/files.py state_dir) and say so."""

    @pytest.mark.parametrize("how", ["emptydir", "owned-by-1000"])
    def test_planted_ssh_config_is_not_run(self, cluster: Cluster, base: Path, how: str) -> None:
        """uid 1000 plants `ProxyCommand` in the state directory's ssh_config; the launcher
        refuses the directory (64); the doctor, run as root after it, refuses it too and runs
        nothing from it. Control: with the launcher's own directory the doctor runs the data
        network check over the config the launcher wrote."""
        loot = base / "loot"
        loot.mkdir()
        loot.chmod(0o777)
        proof = loot / "pwned"
        if how == "emptydir":  # 0777 without the sticky bit: anyone may swap what is in it
            parent = base / "emptydir"
            parent.mkdir()
            parent.chmod(0o777)
            state, why = parent / "mpi-bootstrap", f"{parent} above it is writable by others"
        else:  # /tmp/mpi-bootstrap-UID made first by someone else, in a sticky /tmp
            parent = base / "tmp"
            parent.mkdir()
            parent.chmod(0o1777)
            state, why = parent / "mpi-bootstrap-0", "belongs to uid 1000"
        as_attacker(
            f"mkdir -m 700 {state}; printf 'Host *\\n  ProxyCommand /bin/sh -c "
            f'"id > {proof}; exec nc %%h %%p"\\n\' > {state}/ssh_config'
        )
        xdir = base / "exchange"
        xdir.mkdir()
        start_workers(cluster, base, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        hostfile = "job-worker-0 slots=1\njob-worker-1 slots=1\n"
        env = launcher_env(
            base,
            cluster,
            hostfile,
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_BOOTSTRAP_STATE_DIR=str(state),
        )
        launched = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env)
        assert launched.returncode == 64, launched.stderr
        assert "belongs to uid 1000, not to this user" in launched.stderr
        doctor = cluster.pods[0].run([AGENT, "doctor", "--json"], env, timeout=60)
        assert not proof.exists(), f"the planted ProxyCommand ran: {proof.read_text()}"
        findings = json.loads(doctor.stdout)["findings"]
        refused = [f for f in findings if f["check"] == "state directory"]
        assert len(refused) == 1 and not refused[0]["ok"], findings
        detail = refused[0]["detail"]
        assert detail.startswith(f"would be refused: MPI_BOOTSTRAP_STATE_DIR: {state}"), detail
        assert why in detail
        assert not [f for f in findings if f["host"] == "data network"], findings
        assert doctor.returncode == 1

        # A program that fails: no job-done, so the workers stay up for the doctor's check.
        env = launcher_env(base, cluster, hostfile, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
        done = cluster.pods[0].run([AGENT, "launcher", "--", "false"], env)
        assert done.returncode == 1 and "mpirun start" in done.stderr, done.stderr
        findings = json.loads(cluster.pods[0].run([AGENT, "doctor", "--json"], env).stdout)[
            "findings"
        ]
        state_ok = [f for f in findings if f["check"] == "state directory"]
        data = [f for f in findings if f["host"] == "data network"]
        assert [f["ok"] for f in state_ok] == [True] and [f["ok"] for f in data] == [True], findings

    def test_probe_reads_no_planted_record(self, cluster: Cluster, base: Path) -> None:
        """The readiness probe trusts a record only from a state directory the worker would
        accept: uid 1000's record.json in an emptyDir-like parent, naming a port something
        listens on, does not make a worker that never started look ready."""
        parent = base / "emptydir"
        parent.mkdir()
        parent.chmod(0o777)
        state = parent / "mpi-bootstrap"
        record = {
            "v": 1,
            "host": "job-worker-0",
            "addresses": [],
            "port": 22,
            "host_key": "ssh-ed25519 " + "A" * 68,
            "user": "root",
        }
        as_attacker(f"mkdir -m 700 {state}; echo '{json.dumps(record)}' > {state}/record.json")
        pod = cluster.pods[1]
        listener = cluster.start(pod, [sys.executable, "-c", LISTEN, pod.address, "22"])
        assert listener.stdout is not None and listener.stdout.readline().startswith("listening")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "MPI_BOOTSTRAP_STATE_DIR": str(state)}
        probe = pod.run([AGENT, "probe"], env)
        assert probe.returncode == 69, probe.stdout
        assert f"{parent} above it is writable by others" in probe.stdout


class TestDirExchangeKeyPlanting:
    """Finding 2: a `job-key` in the exchange directory that is not this user's own 0700
    directory of 0600 files — made first by another user, or a symlink to theirs — is
    refused (64), never authorised."""

    @pytest.mark.parametrize("form", ["directory", "symlink"])
    def test_planted_key_is_refused(
        self, cluster: Cluster, base: Path, form: str, ssh_server: dict[str, str]
    ) -> None:
        """A job-key dir planted by uid 1000 in a shared exchange dir, or a symlink to one, is
        refused (64): the attacker's key never logs in nor reaches authorized_keys."""
        xdir = base / "exchange"
        xdir.mkdir()
        xdir.chmod(0o777)  # a shared volume every uid in the pod may write
        key = attacker_keys(base)
        planted = xdir / "job-key" if form == "directory" else base / "attacker" / "kd"
        as_attacker(
            f"mkdir -m 700 {planted}; cp {key} {planted}/id; "
            f"cp {key}.pub {planted}/id.pub; chmod 600 {planted}/id"
        )
        if form == "symlink":
            as_attacker(f"ln -s {planted} {xdir}/job-key")
        worker = cluster.pods[1]
        p = cluster.start(
            worker,
            [AGENT, "worker"],
            agent_env(
                base,
                worker,
                MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
                MPI_BOOTSTRAP_SSHD_PORT="2222",
                **ssh_server,
            ),
        )
        worker_up_or_gone(p, xdir / f"{worker.name}.json")
        assert_kept_out(login(cluster, worker.address, 2222, key))
        assert p.wait(timeout=20) == 64
        err = p.stderr.read()  # type: ignore[union-attr]
        assert f"refusing {xdir}/job-key" in err
        assert ("belongs to uid 1000" if form == "directory" else "not a directory") in err
        authorized = base / worker.name / "state" / "authorized_keys"
        assert (
            not authorized.exists()
            or key.with_suffix(".pub").read_text().split()[1] not in authorized.read_text()
        )


class TestDirExchangeReuse:
    """Finding 2: a second job in the same exchange directory (a compose volume `up`
    again, a reused PVC) neither adopts the first job's key nor stops on its `job-done`:
    the first pod of the new job clears the finished job's state and makes a new key."""

    def test_second_job(self, cluster: Cluster, base: Path) -> None:
        """A second job in a reused exchange dir makes and authorises only its own new key, is not
        stopped by the old job-done, and runs to completion."""
        xdir = base / "exchange"
        xdir.mkdir()
        fingerprints = []
        for job in (1, 2):
            work = base / f"job{job}"
            work.mkdir()
            procs = start_workers(cluster, work, MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir))
            # the workers look for job-done each second
            holds_for(
                lambda ps=procs: all(p.poll() is None for p in ps),
                JOB_DONE_POLLS_S,
                "the workers running (a worker stopped on the old job's job-done?)",
            )
            pub = (xdir / "job-key" / "id.pub").read_text()
            fingerprints.append(names.fingerprint(pub))
            for w in WORKERS:  # exactly this job's key may log in
                authorized = (work / w / "state" / "authorized_keys").read_text()
                assert authorized.split("\n")[0] == " ".join(pub.split()[:2])
            env = launcher_env(
                work,
                cluster,
                "".join(f"{w} slots=1\n" for w in WORKERS),
                MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            )
            done = cluster.pods[0].run([AGENT, "launcher", "--", "hostname"], env)
            assert done.returncode == 0, done.stderr
            assert sorted(done.stdout.split()) == WORKERS
            assert [p.wait(timeout=15) for p in procs] == [0, 0]  # job-done: this job's
            assert (xdir / "job-done").read_text() == f"done {fingerprints[-1]}\n"
        assert fingerprints[0] != fingerprints[1]


# ---------------------------------------------------------------- finding 3


class TestBakedKeys:
    """Finding 3: keys baked into the image at ~/.ssh are not authorised by the `net` and
    `dir` exchanges unless MPI_BOOTSTRAP_SSH_AUTH_DIR is set; every key that is
    authorised is logged with its fingerprint and where it came from."""

    @pytest.mark.parametrize("mode", ["net", "dir"])
    def test_image_key_is_not_trusted(
        self, cluster: Cluster, base: Path, mode: str, ssh_server: dict[str, str]
    ) -> None:
        """Keys baked into the image's ~/.ssh cannot log in under the net or dir exchange, while
        the job's key does (dir); only the job's key is logged as authorised (dir), and none
        at all (net)."""
        worker = cluster.pods[1]
        home = base / worker.name
        home.mkdir()
        baked = home / ".ssh"  # what `docker pull` gives everyone
        baked.mkdir()
        keys.generate(str(baked / "id_rsa"), "baked into the image")
        other = keys.generate(str(base / "other"), "another baked key")
        (baked / "authorized_keys").write_text(
            (baked / "id_rsa.pub").read_text() + other.public + "\n"
        )
        extra = (
            {"MPI_BOOTSTRAP_TOKEN": TOKEN}
            if mode == "net"
            else {"MPI_BOOTSTRAP_EXCHANGE_DIR": str(base / "exchange")}
        )
        if mode == "dir":
            (base / "exchange").mkdir()
        env = agent_env(base, worker, MPI_BOOTSTRAP_SSHD_PORT="2222", **extra, **ssh_server)
        p = cluster.start(worker, [AGENT, "worker"], env)
        wait_until(
            lambda: (home / "state" / "record.json").exists() or p.poll() is not None,
            20,
            "the worker to publish its record or exit",
        )
        for key in (baked / "id_rsa", base / "other"):
            assert_kept_out(login(cluster, worker.address, 2222, key))
        if mode == "dir":  # the control: the job's own key does log in, the same way
            job_key = base / "exchange" / "job-key" / "id"
            done = login(cluster, worker.address, 2222, job_key)
            assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        authorized = logs.named(err, "key authorized")
        if mode == "net":
            assert authorized == []
        else:
            job = (base / "exchange" / "job-key" / "id.pub").read_text()
            assert [(e["fingerprint"], e["origin"]) for e in authorized] == [
                (names.fingerprint(job), f"{base}/exchange/job-key")
            ]

    def test_explicit_mount_is_trusted_and_logged(
        self, cluster: Cluster, base: Path, ssh_server: dict[str, str]
    ) -> None:
        """Set explicitly, the directory is the job's Secret: its keys log in, and the log
        says which keys, from which file and line."""
        worker = cluster.pods[1]
        mount = base / "secret"
        mount.mkdir()
        pair = keys.generate(str(mount / "id_rsa"), "the job's key")
        other = keys.generate(str(base / "other"), "second key")
        (mount / "authorized_keys").write_text(pair.public + "\n" + other.public + "\n")
        env = agent_env(
            base,
            worker,
            MPI_BOOTSTRAP_SSHD_PORT="2222",
            MPI_BOOTSTRAP_TOKEN=TOKEN,
            MPI_BOOTSTRAP_SSH_AUTH_DIR=str(mount),
            **ssh_server,
        )
        p = cluster.start(worker, [AGENT, "worker"], env)
        wait_until(
            (base / worker.name / "state" / "record.json").exists,
            20,
            "the worker to publish its record",
        )
        done = login(cluster, worker.address, 2222, base / "other")
        assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        logged = [(e["fingerprint"], e["origin"]) for e in logs.named(err, "key authorized")]
        assert logged == [
            (names.fingerprint(pair.public), f"{mount}/id_rsa"),
            (names.fingerprint(other.public), f"{mount}/authorized_keys:2"),
        ]


# ---------------------------------------------------------------- finding 4

# A pod without the token that holds job-worker-0's address (stale DNS, a reused IP):
# every connection to its exchange port is relayed to job-worker-1's, both ways.
RELAY = r"""
import socket, sys, threading
listen, port, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((listen, port))
srv.listen(16)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    conn, _ = srv.accept()
    out = socket.create_connection((target, port))
    threading.Thread(target=pipe, args=(conn, out), daemon=True).start()
    threading.Thread(target=pipe, args=(out, conn), daemon=True).start()
"""


class TestNetExchangeRelay:
    """Finding 4: a hello names the worker it is for, and a worker answers only hellos for
    itself; a relayed hello gets `denied`, the launcher exits 69 naming the host, and no
    rank runs anywhere."""

    def test_relayed_hello_is_refused(self, cluster: Cluster, base: Path) -> None:
        """A pod relaying job-worker-0's exchange to job-worker-1 is denied: the launcher exits 69
        with no rank run, and a hello for another worker authorises nothing."""
        relay_pod, real = cluster.pods[1], cluster.pods[2]
        env = agent_env(base, real, MPI_BOOTSTRAP_TOKEN=TOKEN)
        p = cluster.start(real, [AGENT, "worker"], env)
        wait_until(
            (base / real.name / "state" / "record.json").exists,
            20,
            "job-worker-1 to publish its record",
        )
        relay = cluster.start(
            relay_pod,
            ["/usr/bin/python3", "-c", RELAY, relay_pod.address, "2223", real.address],
            {"PATH": "/usr/bin:/bin"},
        )
        wait_listening(cluster.pods[0], relay_pod.address, 2223, relay)
        # The launcher asks job-worker-0 (the relay) and job-worker-1. (Before: both
        # ranks ran on job-worker-1, and the job "succeeded".)
        env = launcher_env(
            base,
            cluster,
            "".join(f"{w} slots=1\n" for w in WORKERS),
            MPI_BOOTSTRAP_TOKEN=TOKEN,
            MPI_DNS_WAIT_SECONDS="20",
        )
        done = cluster.pods[0].run([AGENT, "launcher", "--", "hostname"], env, timeout=60)
        assert done.returncode == 69, done.stdout + done.stderr
        assert "job-worker-0: exchange refused" in done.stderr
        assert logs.no_rank_started(done.stderr)
        assert done.stdout.strip() == ""  # no rank ran, on job-worker-1 or anywhere
        # A captured hello meant for job-worker-0, sent straight to job-worker-1: denied.
        throwaway = keys.generate(str(base / "throwaway"), "throwaway").public
        hello = hello_for(TOKEN, throwaway, relay_pod.name)
        assert json.loads(ask(cluster.pods[0], real.address, hello)) == {"type": "denied"}
        assert throwaway not in (base / real.name / "state" / "authorized_keys").read_text()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        assert "addressed to 'job-worker-0', not to this worker" in err


class TestNetExchangeReplay:
    """Round 3's finding 3: a stranger on the pod network who captured a launcher's hello
    replays it to a worker that has restarted since (nothing in its memory). The worker
    refuses it and changes nothing: the running launcher's key stays, and its login works
    (before: the hello's key replaced it, and the launcher's next login was refused)."""

    def test_replayed_hello_after_restart(self, cluster: Cluster, base: Path) -> None:
        """Launcher A's hello, captured off the wire by tcpdump, replayed (by another
        pod) to the restarted worker after launcher B authorised its key: denied; B's key is
        still authorised, A's is not, and B's ssh still logs in."""
        pod, stranger = cluster.pods[1], cluster.pods[2]
        env = agent_env(base, pod, MPI_BOOTSTRAP_TOKEN=TOKEN)

        def launch(state: str) -> str:
            """A real job of a launcher with its own state (its own key); its public key (type and
            base64, as authorized_keys and the hello carry it)."""
            lenv = launcher_env(
                base,
                cluster,
                "job-worker-0 slots=1\n",
                MPI_BOOTSTRAP_TOKEN=TOKEN,
                MPI_BOOTSTRAP_STATE_DIR=str(base / state),
            )
            done = cluster.pods[0].run([AGENT, "launcher", "--", "hostname"], lenv, timeout=90)
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["job-worker-0"]
            return " ".join((base / state / "id_launcher.pub").read_text().split()[:2])

        with wire.Capture(cluster, pod, base / "wire.pcap", EXCHANGE_PORT) as capture:
            first = cluster.start(pod, [AGENT, "worker"], env)
            wait_ready(pod, env, first)
            key_a = launch("launcher-a")
        (captured,) = capture.hellos()
        assert json.loads(captured)["client_key"] == key_a  # A's, as it went over the wire
        # The worker restarts (a new process: nothing of the first one's memory is left).
        cluster.signal(first)
        first.communicate(timeout=20)
        second = cluster.start(pod, [AGENT, "worker"], env)
        wait_ready(pod, env, second)
        key_b = launch("launcher-b")
        authorized = base / pod.name / "state" / "authorized_keys"
        assert key_b in authorized.read_text()
        replies = replay(stranger, pod.address, captured)
        # B, still running, logs in again with its key (a fresh connection, no reuse).
        login = cluster.pods[0].run(
            [
                "ssh",
                "-F",
                str(base / "launcher-b" / "ssh_config"),
                "-o",
                "ControlMaster=no",
                "-o",
                "ControlPath=none",
                "job-worker-0",
                "id -u",
            ],
            {"PATH": "/usr/bin:/bin"},
            timeout=30,
        )
        assert login.returncode == 0 and login.stdout.strip() == "0", login.stderr
        assert key_b in authorized.read_text()
        assert key_a not in authorized.read_text()
        answers = [json.loads(r) for r in replies]
        assert [a for a in answers if a.get("type") != "challenge"] == [{"type": "denied"}]
        cluster.signal(second)
        _, err = second.communicate(timeout=20)
        reasons = [e.get("reason") for e in logs.named(err, "exchange refused")]
        assert reasons == ["challenge is not the one sent on this connection (a replayed hello)"]


# ---------------------------------------------------------------- finding 6

# A peer that accepts and trickles one byte every TRICKLE_EVERY_S, forever (argv: address,
# port, the pause): slow on purpose, each byte well inside any read timeout.
TRICKLE_EVERY_S = 1.5
TRICKLE = r"""
import socket, sys, threading, time
pause = float(sys.argv[3])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(16)
def trickle(conn):
    try:
        while True:
            conn.sendall(b" ")
            time.sleep(pause)
    except OSError:
        pass
while True:
    conn, _ = srv.accept()
    threading.Thread(target=trickle, args=(conn,), daemon=True).start()
"""


class TestExchangeDeadline:
    """Finding 6: one deadline (MPI_DNS_WAIT_SECONDS) over the whole exchange: a peer that
    trickles bytes, or a FIFO named like a record, ends in 69 by then, not hours later."""

    def test_trickling_peer(self, cluster: Cluster, base: Path) -> None:
        """A peer trickling a byte every 1.5 s cannot hold the launcher past its deadline (69)."""
        pod = cluster.pods[1]
        p = cluster.start(
            pod,
            ["/usr/bin/python3", "-c", TRICKLE, pod.address, "2223", str(TRICKLE_EVERY_S)],
            {"PATH": "/usr/bin:/bin"},
        )
        wait_listening(cluster.pods[0], pod.address, 2223, p)
        env = launcher_env(
            base,
            cluster,
            "job-worker-0 slots=1\n",
            MPI_BOOTSTRAP_TOKEN=TOKEN,
            MPI_DNS_WAIT_SECONDS="5",
        )
        t0 = time.monotonic()
        done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env, timeout=120)
        took = time.monotonic() - t0
        assert done.returncode == 69, done.stderr
        assert "no record from job-worker-0" in done.stderr
        assert took < 5 + 5, took  # the deadline, plus start-up (was: hours)

    def test_fifo_record(self, cluster: Cluster, base: Path) -> None:
        """A FIFO named like a worker's record is refused as not a regular file (69) within the
        deadline, instead of blocking the launcher."""
        xdir = base / "exchange"
        xdir.mkdir()
        os.mkfifo(xdir / "job-worker-0.json")
        env = launcher_env(
            base,
            cluster,
            "job-worker-0 slots=1\n",
            MPI_BOOTSTRAP_EXCHANGE_DIR=str(xdir),
            MPI_DNS_WAIT_SECONDS="5",
        )
        t0 = time.monotonic()
        done = cluster.pods[0].run([AGENT, "launcher", "--", "true"], env, timeout=120)
        took = time.monotonic() - t0
        assert done.returncode == 69, done.stderr
        assert "job-worker-0.json is not a regular file" in done.stderr
        assert took < 5 + 5, took


# ---------------------------------------------------------------- finding 7

# Each rank (argv: the reference copy of the token, seconds to scan): reads
# /proc/<pid>/environ of every process of its pod (its own PID namespace: PID 1, sshd,
# the ranks, and whatever is exec'd into the pod meanwhile) over and over for that long,
# as round 3 of the review did, and prints one JSON line: what it scanned, the probes
# and doctors it saw, and every process that held the token.
RANK_SCANS_S = 6
RANK = r"""
import json, os, sys, time
token = open(sys.argv[1], "rb").read().strip()
end = time.monotonic() + float(sys.argv[2])
scans, seen, found = 0, {}, {}
while time.monotonic() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        scans += 1
        for role in (b"probe", b"doctor"):
            if b"/mpi-bootstrap\0" in cmd and cmd.endswith(b"\0" + role + b"\0"):
                seen.setdefault(role.decode(), set()).add(pid)
        if token in env:
            found[pid] = cmd.replace(b"\0", b" ").decode(errors="replace")
print("RANK " + json.dumps({"host": os.uname().nodename, "scans": scans, "found": found,
                            "seen": {k: len(v) for k, v in seen.items()}}), flush=True)
"""


def execs_while(
    cluster: Cluster,
    running: subprocess.Popen[str],
    execs: list[tuple[subprocess.Popen[str], list[str], dict[str, str]]],
) -> int:
    """Until `running` exits, exec each (pod's PID 1, argv, the container's environment)
    into its pod again as soon as the last one ended, as the kubelet runs a readiness
    probe every period (and `kubectl exec` a doctor); how many ran."""
    ran = 0
    current: list[subprocess.Popen[str] | None] = [None] * len(execs)
    while running.poll() is None:
        for i, (pod1, argv, env) in enumerate(execs):
            if current[i] is None or current[i].poll() is not None:  # type: ignore[union-attr]
                if current[i] is not None:
                    current[i].communicate()  # type: ignore[union-attr]
                current[i] = kubelet_exec(cluster, pod1, argv, env)
                ran += 1
        time.sleep(0.05)
    for p in current:
        if p is not None:
            p.communicate(timeout=30)
    return ran


def scan_job(
    base: Path, form: str, server: Mapping[str, str] = SSH_SERVERS["openssh"]
) -> tuple[list[dict[str, Any]], dict[str, str], int]:
    """A real job whose ranks scan their pods' /proc/*/environ (RANK) while the workers'
    readiness probe and the launcher pod's doctor are exec'd kubelet-style, again and
    again, with the token given in `form` ("file": MPI_BOOTSTRAP_TOKEN_FILE from a Secret
    volume; "env": MPI_BOOTSTRAP_TOKEN). The test also reads every pod's processes'
    environ from outside. Returns the ranks' reports, what the outside scan found, and how
    many execs ran."""
    how = (
        {"MPI_BOOTSTRAP_TOKEN_FILE": str(token_volume(base))}
        if form == "file"
        else {"MPI_BOOTSTRAP_TOKEN": TOKEN}
    )
    with Cluster(["job-launcher", *WORKERS], pid1=True) as c:
        procs = start_workers(c, base, **how, **server)
        script = base / "rank.py"
        script.write_text(RANK)
        hostfile = "job-launcher slots=1\n" + "".join(f"{w} slots=1\n" for w in WORKERS)
        env = launcher_env(base, c, hostfile, **how)
        secret = base / "token"  # the ranks' reference, not on any command line
        secret.write_text(TOKEN)
        secret.chmod(0o600)
        argv = ["/usr/bin/python3", str(script), str(secret), str(RANK_SCANS_S)]
        job = c.start(c.pods[0], [AGENT, "launcher", "--", *argv], env)
        execs = [
            (p, [AGENT, "probe"], agent_env(base, pod, **how))
            for p, pod in zip(procs, c.pods[1:], strict=True)
        ]
        # (no data check: that one runs ssh to every worker for seconds)
        execs.append((job, [AGENT, "--data-check=false", "doctor"], env))
        outside: dict[str, str] = {}
        scanner = threading.Thread(target=scan_outside, args=(c, job, outside), daemon=True)
        scanner.start()
        ran = execs_while(c, job, execs)
        scanner.join(timeout=30)
        out, err = job.communicate(timeout=30)
        assert job.returncode == 0, err
    reports = [json.loads(ln[5:]) for ln in out.splitlines() if ln.startswith("RANK ")]
    assert len(reports) == 3, out
    return reports, outside, ran


def scan_outside(c: Cluster, job: subprocess.Popen[str], found: dict[str, str]) -> None:
    """Every process in every pod, read from outside (the host) until the job ends."""
    while job.poll() is None:
        for pod in c.pods:
            for pid in pod.netns.pids():
                try:
                    data = Path(f"/proc/{pid}/environ").read_bytes()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if TOKEN.encode() in data:
                    found[f"{pod.name}:{pid}"] = cmd.replace(b"\0", b" ").decode()
        time.sleep(0.1)


class TestTokenNotInEnviron:
    """Finding 7, and round 3's finding 1: MPI_BOOTSTRAP_TOKEN is in no process's
    /proc/<pid>/environ while a job runs — not the agent's (PID 1 of every pod), not its
    sshd's, not a rank's, and not the readiness probe's or the doctor's that the kubelet
    and `kubectl exec` start with the container's environment: the token comes from a
    Secret volume's file. In the environment it would be (the control), and the agent,
    --explain and the doctor say so."""

    def test_no_process_has_it(self, base: Path, netns: None, ssh_server: dict[str, str]) -> None:
        """With the token in a file, a rank scanning its pod's /proc/*/environ for 6 s, while the
        readiness probe and the doctor are exec'd into the pods with the container's
        environment again and again, finds it nowhere; nor does a scan from outside."""
        reports, outside, ran = scan_job(base, "file", ssh_server)
        assert ran >= 6, ran
        assert all(r["scans"] > 100 for r in reports), reports
        # The ranks did see the probes (both workers) and the doctor (the launcher) run.
        seen = {r["host"]: r["seen"] for r in reports}
        assert all(seen[w].get("probe", 0) >= 2 for w in WORKERS), seen
        assert seen["job-launcher"].get("doctor", 0) >= 1, seen
        assert [r["found"] for r in reports] == [{}, {}, {}], reports
        assert outside == {}, outside

    def test_control_environment_form(self, base: Path, netns: None) -> None:
        """The same job with MPI_BOOTSTRAP_TOKEN in the environment: the ranks find the token in
        the readiness probes' and the doctor's environment (what round 3 reported), so the
        scan above would have seen it."""
        reports, _, _ = scan_job(base, "env")
        by_host = {r["host"]: r["found"] for r in reports}
        assert all(
            any(cmd.endswith("mpi-bootstrap probe ") for cmd in by_host[w].values())
            for w in WORKERS
        ), by_host
        assert any(cmd.endswith(" doctor ") for cmd in by_host["job-launcher"].values()), by_host

    def test_environment_form_is_said(self, cluster: Cluster, base: Path) -> None:
        """With MPI_BOOTSTRAP_TOKEN set, --explain shows a `token` decision and the doctor a
        warning (not a failed check) that it is exposed and how to move; with the file, the
        decision says where it is read, and the doctor does not warn. Never the token."""
        hostfile = "".join(f"{w} slots=1\n" for w in WORKERS)
        outputs = []
        for how in (
            {"MPI_BOOTSTRAP_TOKEN": TOKEN},
            {"MPI_BOOTSTRAP_TOKEN_FILE": str(token_volume(base))},
        ):
            env = launcher_env(base, cluster, hostfile, MPI_DNS_WAIT_SECONDS="1", **how)
            explain = cluster.pods[0].run(
                [AGENT, "launcher", "--explain", "--json", "--", "true"], env
            )
            assert explain.returncode == 0, explain.stderr
            (decision,) = [
                d for d in json.loads(explain.stdout)["decisions"] if d["setting"] == "token"
            ]
            doctor = cluster.pods[0].run([AGENT, "doctor", "--json"], env)
            (finding,) = [
                f for f in json.loads(doctor.stdout)["findings"] if f["check"].startswith("token")
            ]
            outputs.append(explain.stdout + explain.stderr + doctor.stdout + doctor.stderr)
            if "MPI_BOOTSTRAP_TOKEN" in how:
                assert decision["value"] == "environment", decision
                assert decision["source"] == "env MPI_BOOTSTRAP_TOKEN"
                assert (
                    "WARNING" in decision["reason"] and "the readiness probe" in decision["reason"]
                )
                assert "MPI_BOOTSTRAP_TOKEN_FILE" in decision["reason"]
                assert finding["ok"] and finding["warning"], finding
                assert "the readiness probe" in finding["detail"]
                assert "MPI_BOOTSTRAP_TOKEN_FILE" in finding["advice"]
            else:
                assert decision["value"] == f"file {how['MPI_BOOTSTRAP_TOKEN_FILE']}", decision
                assert "WARNING" not in decision["reason"]
                assert finding["ok"] and not finding["warning"], finding
                assert "mode 0400" in finding["detail"]
        assert all(TOKEN not in text for text in outputs)


# ---------------------------------------------------------------- review 4, finding 3


class TestTokenFileSwap:
    """Security review 4, finding 3: the token file's owner and the directories of its path
    were not checked, so another uid that could rename its own 0600 token over the real one
    (in a Kubernetes emptyDir: 0777, no sticky bit) chose the worker's token, had its key
    authorised and logged in as root. The worker now refuses such a file (64, naming it and
    why) and publishes nothing; the doctor says the same."""

    def test_renamed_over(self, cluster: Cluster, base: Path) -> None:
        """uid 1000 renames its own 0600 token over root's 0400 one in a 0777 directory; the
        worker exits 64 naming MPI_BOOTSTRAP_TOKEN_FILE, the file and its owner, publishes no
        record, and the attacker's hello and login get nothing (before: its key was
        authorised, and it logged in as root). The doctor reports the file as refused."""
        open_dir = base / "emptydir"
        open_dir.mkdir()
        open_dir.chmod(0o777)  # what kubelet makes of an emptyDir (kubernetes#110835)
        token = open_dir / "token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o400)
        theirs = "attacker-token-0123456789"
        as_attacker(
            f"umask 077; printf %s {theirs} > {open_dir}/mine; mv -f {open_dir}/mine {token}"
        )
        assert token.stat().st_uid == 1000  # the swap took
        worker = cluster.pods[1]
        env = agent_env(
            base, worker, MPI_BOOTSTRAP_TOKEN_FILE=str(token), MPI_BOOTSTRAP_SSHD_PORT="2222"
        )
        p = cluster.start(worker, [AGENT, "worker"], env)
        record = base / worker.name / "state" / "record.json"
        worker_up_or_gone(p, record)
        key = attacker_keys(base)
        if p.poll() is None:  # the attack: its key, in a hello signed with its token
            public = " ".join((base / "attacker" / "id.pub").read_text().split()[:2])
            ask(cluster.pods[0], worker.address, hello_for(theirs, public, worker.name))
        assert_kept_out(login(cluster, worker.address, 2222, key))
        assert p.wait(timeout=20) == 64
        err = p.stderr.read()  # type: ignore[union-attr]
        assert (
            f"MPI_BOOTSTRAP_TOKEN_FILE: cannot read {token}: it belongs to uid 1000, who may "
            "write it whatever its mode" in err
        ), err
        assert not record.exists() and theirs not in err
        env = launcher_env(
            base,
            cluster,
            "job-worker-0 slots=1\n",
            MPI_BOOTSTRAP_TOKEN_FILE=str(token),
            MPI_DNS_WAIT_SECONDS="1",
        )
        doctor = cluster.pods[0].run([AGENT, "doctor", "--json"], env, timeout=60)
        (finding,) = [
            f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "token file"
        ]
        assert not finding["ok"] and "belongs to uid 1000" in finding["detail"], finding


class TestSshdDisablesForwarding:
    """README: the worker's sshd allows no forwarding of any kind — what `sshd -T` (sshd's
    own reading of the config) says, not only what the file says."""

    def test_sshd_t(self, tmp_path: Path) -> None:
        """sshd -T reads the generated config as every kind of forwarding off, StrictModes
        off (the agent checks: SECURITY.md 14), and password and keyboard-interactive auth
        off."""
        host = keys.generate(str(tmp_path / "host"), "host")
        cfg = tmp_path / "sshd_config"
        cfg.write_text(
            sshd.config_text(
                port=2222,
                listen=["127.0.0.1"],
                host_key=host.private_path,
                authorized_keys=str(tmp_path / "ak"),
                pid_file=str(tmp_path / "pid"),
                user="root",
            )
        )
        done = subprocess.run(
            ["/usr/sbin/sshd", "-T", "-f", str(cfg)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        effective = dict(ln.split(" ", 1) for ln in done.stdout.splitlines() if " " in ln)
        assert {
            k: effective[k]
            for k in (
                "disableforwarding",
                "allowtcpforwarding",
                "allowstreamlocalforwarding",
                "allowagentforwarding",
                "x11forwarding",
                "permittunnel",
                "strictmodes",
                "passwordauthentication",
                "kbdinteractiveauthentication",
            )
        } == {
            "disableforwarding": "yes",
            "allowtcpforwarding": "no",
            "allowstreamlocalforwarding": "no",
            "allowagentforwarding": "no",
            "x11forwarding": "no",
            "permittunnel": "no",
            "strictmodes": "no",
            "passwordauthentication": "no",
            "kbdinteractiveauthentication": "no",
        }
