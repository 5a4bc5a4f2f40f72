"""Workers and the launcher on the simulated cluster (tests/support/cluster.py), the way
the SSH, security and attack tests drive them: `mpi-bootstrap worker` in each worker pod
with whichever exchange the test sets, ready when its probe passes, and the launcher's
environment in the first pod. (tests/support/job.py drives whole MPI jobs.)"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.conftest import AGENT
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.wait import wait_until

WORKERS = ["job-worker-0", "job-worker-1"]
PODS = ["job-launcher", *WORKERS]

# The job's token where a test sets one. Fresh per run: a value that cannot appear in any
# output by accident.
TOKEN = "tok-" + secrets.token_hex(16)


def token_volume(tmp: Path, token: str = TOKEN, mode: int = 0o400) -> Path:
    """TOKEN in a Secret volume at tmp/token-secret, laid out as the kubelet writes one
    (kubernetes pkg/volume/util/atomic_writer.go: `token -> ..data/token`, `..data ->`
    a timestamped directory, the file itself there, defaultMode `mode`). Returns the path
    MPI_BOOTSTRAP_TOKEN_FILE names."""
    volume = tmp / "token-secret"
    stamp = volume / "..2025_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    (stamp / "token").write_text(token + "\n")  # as `echo TOKEN | kubectl create secret`
    (stamp / "token").chmod(mode)
    (volume / "..data").symlink_to(stamp.name)
    (volume / "token").symlink_to("..data/token")
    return volume / "token"


def kubelet_exec(
    cluster: Cluster, p: subprocess.Popen[str], argv: list[str], env: Mapping[str, str]
) -> subprocess.Popen[str]:
    """Start argv inside the pod whose PID 1 `p` is, the way the kubelet runs an exec
    readinessProbe and `kubectl exec` runs a command: in the pod's namespaces (network,
    UTS, PID, mount), with the container's own environment `env` (the one its PID 1 was
    started with), and nothing on the command line. (pid1 pods only.)"""
    pid = cluster.pid_of(p)
    return subprocess.Popen(
        ["nsenter", "-t", str(pid), "-n", "-u", "-p", "-m", "--", *argv],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(
    pod: Pod,
    env: Mapping[str, str],
    proc: subprocess.Popen[str],
    timeout: float = 20,
    *,
    log: Callable[[], str] | None = None,
) -> None:
    """Until `mpi-bootstrap probe` passes in `pod`; fails at once if the worker `proc`
    exits (saying what it printed: `log`, or else its stderr)."""

    def ready() -> bool:
        if proc.poll() is not None:
            said = log() if log else proc.stderr.read()  # type: ignore[union-attr]
            raise AssertionError(f"{pod.name}: worker exited {proc.returncode}: {said}")
        return pod.run([AGENT, "probe"], env, timeout=10).returncode == 0

    wait_until(ready, timeout, f"{pod.name} to be ready (its probe to pass)")


def record_of(tmp: Path, pod: Pod) -> dict[str, object]:
    """The record the worker in `pod` published (its state directory below `tmp`)."""
    return json.loads((tmp / pod.name / "state" / "record.json").read_text())  # type: ignore[no-any-return]


def start_workers(cluster: Cluster, tmp: Path, **extra: str) -> list[subprocess.Popen[str]]:
    """A worker in every pod but the first, one after the other, each ready before the
    next starts; `extra` adds to or overrides the environment (tests/support/cluster.py's
    agent_env)."""
    procs = []
    for pod in cluster.pods[1:]:
        env = agent_env(tmp, pod, **extra)
        p = cluster.start(pod, [AGENT, "worker"], env)
        wait_ready(pod, env, p)
        procs.append(p)
    return procs


def launcher_env(tmp: Path, cluster: Cluster, hostfile: str, **extra: str) -> dict[str, str]:
    """The launcher's environment, its hostfile (`hostfile`, written to tmp/hostfile) and
    output hostfile (tmp/mpi-hostfile) set."""
    hf = tmp / "hostfile"
    hf.write_text(hostfile)
    return agent_env(
        tmp,
        cluster.pods[0],
        MPI_HOSTFILE=str(hf),
        MPI_BOOTSTRAP_OUTPUT_HOSTFILE=str(tmp / "mpi-hostfile"),
        **extra,
    )


def make_mount(tmp: Path) -> Path:
    """MPI Operator's Secret: one ECDSA P-521 key, mounted 0644 as a Secret mounted
    outside /root/.ssh is (mpi-operator #429)."""
    mount = tmp / "secret"
    mount.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(mount / "id_rsa")],
        check=True,
    )
    (mount / "authorized_keys").write_text((mount / "id_rsa.pub").read_text())
    for f in mount.iterdir():
        f.chmod(0o644)
    return mount


def command_lines(cluster: Cluster) -> str:
    """Every process's argv in every pod (what `ps` shows to any user)."""
    out = []
    for pod in cluster.pods:
        for pid in pod.netns.pids():
            with contextlib.suppress(OSError):
                out.append(
                    Path(f"/proc/{pid}/cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                )
    return "\n".join(out)


def stop(cluster: Cluster, procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    """SIGTERM the workers still running; (stdout, stderr) of each."""
    for p in procs:
        if p.poll() is None:
            cluster.signal(p)
    return [p.communicate(timeout=20) for p in procs]
