"""Hardened pods, run as a cluster runs them, with the agent's defaults: OpenShift's
restricted SCC (an arbitrary uid without a passwd entry, gid 0, HOME=/, no capabilities,
no_new_privs) and read-only root file systems whose only writable place is an emptyDir
at /tmp (0777, no sticky bit: kubernetes#110835), as root and as uid 1000. A launcher
and two workers, each the agent as PID 1 of its own PID, mount, UTS and network
namespaces, started together; Open MPI 4.1 runs an allreduce on both workers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import AGENT, NO_SSHD, REAL_MPIS
from tests.support.cluster import Cluster
from tests.support.job import check_allreduce
from tests.support.programs import compile_allreduce

OPENSHIFT_UID = 1000680000  # from a namespace's range, as OpenShift assigns them
TOKEN = "platforms-" + "t" * 32

# (uid, gid, HOME, root file system, a state directory set): the pod's securityContext
# and volumes. "ro": read-only, an emptyDir at /tmp only; "ro+run": and one at
# /run/mpi-bootstrap (docs/exchanges.md's advice for root); "ro-sshd": read-only, and
# the image has no /run/sshd (auto then takes the agent's own ssh server for root).
SHAPES = {
    "openshift": (OPENSHIFT_UID, 0, "/", "", ""),
    "openshift-no-sshd": (OPENSHIFT_UID, 0, "/", "", ""),
    "readonly-root": (0, 0, "/root", "ro", ""),
    "readonly-root-no-run-sshd": (0, 0, "/root", "ro-sshd", ""),
    "readonly-root-run-emptydir": (0, 0, "/root", "ro+run", ""),
    "readonly-uid1000": (1000, 1000, "/home/mpiuser", "ro", ""),
    "readonly-uid1000-no-sshd": (1000, 1000, "/home/mpiuser", "ro-sshd", ""),
    "readonly-uid1000-state-in-tmp": (1000, 1000, "/home/mpiuser", "ro", "/tmp/mpi-state"),
}
# The workers' own settings beside the job's: an image with no OpenSSH server.
WORKERS_OWN = {"openshift-no-sshd": NO_SSHD, "readonly-uid1000-no-sshd": NO_SSHD}
# The pod's /run without sshd's directory, as an image without it has: every other entry
# of this machine's /run (the tests' files) bound read-only into a tmpfs (`mount` itself
# makes /run/mount on the way).
NO_RUN_SSHD = (
    "mkdir -p /tmp/.run && mount --rbind /run /tmp/.run && mount -t tmpfs -o mode=0755 run /run"
    ' && for e in /tmp/.run/* /tmp/.run/.[!.]*; do n=${e##*/}; [ -e "$e" ] || continue;'
    ' [ "$n" != sshd ] || continue; if [ -d "$e" ]; then mkdir -p "/run/$n";'
    ' else : > "/run/$n"; fi; mount --rbind "$e" "/run/$n"'
    ' && mount -o remount,bind,ro "/run/$n" || exit; done'
    " && mount -o remount,ro /run && "
)


@pytest.fixture
def pods(netns: None, realmpi: object) -> Iterator[Cluster]:
    """Three pods, each its agent as PID 1, with an emptyDir at /tmp."""
    os.makedirs("/run/mpi-bootstrap", mode=0o755, exist_ok=True)  # a mount point, empty
    # Root's sshd needs its privsep directory, which a read-only root cannot make: the
    # image has it (container/Dockerfile), and so does this machine, whatever ran first.
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    with Cluster(["job-launcher", "job-worker-0", "job-worker-1"]) as c:
        for pod in c.pods:
            pod.pid1 = True
            assert pod.tmp is not None
            os.chmod(pod.tmp, 0o777)  # noqa: S103 - kubelet's emptyDir
        yield c


def _in_pod(shape: str, runtime: Path, argv: list[str]) -> list[str]:
    """`argv` (the agent's) as the pod's securityContext runs it: the root file system
    remounted read-only where asked, then setpriv to its uid and gid."""
    uid, gid, _, root, _ = SHAPES[shape]
    remount = "mount -t tmpfs -o mode=0777 run /run/mpi-bootstrap && " if "run" in root else ""
    remount += NO_RUN_SSHD if "sshd" in root else ""
    remount += "mount -o remount,bind,ro / && " if root else ""
    user = [] if uid == 0 else [
        "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all",
    ]  # fmt: skip
    agent = [*user, "/usr/bin/python3", "-m", "mpi_bootstrap", *argv]
    return ["sh", "-c", f'{remount}exec "$0" "$@"', *agent]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_job_runs(
    shape: str, pods: Cluster, runtime_for_others: Path, programs: Path, uid1000: str
) -> None:
    """Each shape runs the job to 0 with every rank on a worker, no setting but the
    job's own; an arbitrary uid's entry comes from nss_wrapper, never /etc/passwd (uid
    1000 has one: the `uid1000` fixture makes it where the machine has none)."""
    uid, _, home, _, state = SHAPES[shape]
    m = REAL_MPIS["openmpi4"]
    exe = compile_allreduce(m, programs)
    hostfile = programs / "hostfile"  # the ConfigMap's, readable by the pod's uid
    hostfile.write_text("".join(f"{p.name} slots=2\n" for p in pods.pods[1:]))
    passwd = Path("/etc/passwd").read_bytes()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(runtime_for_others),
        "MPI_BOOTSTRAP_TOKEN": TOKEN,
        "MPI_BOOTSTRAP_LOG_FORMAT": "json",
        **({"MPI_BOOTSTRAP_STATE_DIR": state} if state else {}),
    }
    own = WORKERS_OWN.get(shape, {})
    workers = [
        pods.start(pod, _in_pod(shape, runtime_for_others, ["worker"]), {**env, **own})
        for pod in pods.pods[1:]
    ]
    done = pods.pods[0].run(
        _in_pod(shape, runtime_for_others, ["launcher", "--", "mpirun", str(exe)]),
        {**env, "MPI_HOSTFILE": str(hostfile)},
        timeout=180,
    )
    check_allreduce(done, 4, [p.name for p in pods.pods[1:]])
    assert [w.poll() for w in workers] == [None, None]  # up for the next launch
    # The readiness probe, run as kubelet runs an exec probe: in the worker's namespaces,
    # as its user. It finds the state directory where the worker holds it.
    enter = ["nsenter", "-t", str(pods.pid_of(workers[0])), "-m", "-p", "-n", "-u"]
    probe = subprocess.run(
        [*enter, *_in_pod(shape, runtime_for_others, ["probe"])[3:]],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    server = "the agent's ssh server" if own or "sshd" in shape else "sshd"
    assert probe.returncode == 0 and probe.stdout.startswith(f"ready: {server} on"), probe
    assert Path("/etc/passwd").read_bytes() == passwd
    assert ("passwd entry" in done.stderr) == (uid == OPENSHIFT_UID)
    assert "state directory held" in done.stderr  # /tmp/mpi-bootstrap-UID in an emptyDir
    # A worker on the agent's own ssh server gives its uid no entry: nss_wrapper is in
    # none of its pod's processes, and no passwd file is written; nor has it /run/sshd.
    entries = list(Path(pods.pods[1].tmp or "/nonexistent").glob("mpi-bootstrap-*/*/passwd"))
    assert bool(entries) == (shape == "openshift"), entries
    if server != "sshd":
        assert not [p for p in pods.pods[1].netns.pids() if _maps_nss_wrapper(p)]
        runs = subprocess.run([*enter, "test", "-e", "/run/sshd"], check=False)
        assert runs.returncode == (1 if "sshd" in SHAPES[shape][3] else 0)


def _maps_nss_wrapper(pid: int) -> bool:
    try:
        return "libnss_wrapper" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_privsep_dir_that_cannot_be_made_says_what_to_mount() -> None:
    """Root's sshd needs /run/sshd, which a read-only root without it in the image
    cannot give: the worker says so (64) with the volume to add, as YAML."""
    from mpi_bootstrap.core.errors import ConfigError
    from mpi_bootstrap.worker.main import _privsep_dir

    with pytest.raises(ConfigError) as exc:
        _privsep_dir("/proc/mpib-none/sshd")
    assert exc.value.status == 64
    assert "root's sshd needs /proc/mpib-none/sshd" in exc.value.message
    assert "mountPath: /proc/mpib-none/sshd" in exc.value.message


@pytest.mark.parametrize("rewrite", ["none", "ip"])
@pytest.mark.parametrize("family", ["6", "dual"])
def test_ipv6(family: str, rewrite: str, netns: None, realmpi: object, programs: Path) -> None:
    """An IPv6-only and a dual-stack pod network (hosts files with AAAA addresses), names
    and their addresses in the hostfile: Open MPI 4.1 runs every rank, with the data check
    and liveness on; in dual-stack every pod takes IPv4 (system/dns.py), and IPv6-only
    addresses in the hostfile are refused before any rank: no MPI takes them."""
    m = REAL_MPIS["openmpi4"]
    exe = compile_allreduce(m, programs)
    with Cluster(["job-launcher", "job-worker-0", "job-worker-1"], family=family) as c:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
               "MPI_BOOTSTRAP_TOKEN": TOKEN, "MPI_BOOTSTRAP_LOG_FORMAT": "json",
               "MPI_BOOTSTRAP_STATE_DIR": "/tmp/state"}  # the pod's own /tmp  # fmt: skip
        for pod in c.pods[1:]:
            c.start(pod, [AGENT, "worker"], env)
        hostfile = programs / "hostfile"
        hostfile.write_text("".join(f"{p.name} slots=2\n" for p in c.pods[1:]))
        done = c.pods[0].run(
            [AGENT, "launcher", "--", "mpirun", str(exe)],
            {**env, "MPI_HOSTFILE": str(hostfile), "MPI_BOOTSTRAP_REWRITE": rewrite},
            timeout=90,
        )
        if (family, rewrite) == ("6", "ip"):
            assert done.returncode == 64, done.stderr
            assert "job-worker-0 has only an IPv6 address (fd00:10:250::b)" in done.stderr
            assert "mpirun start" not in done.stderr
            return
        check_allreduce(done, 4, [p.name for p in c.pods[1:]])
        assert "watches armed" in done.stderr and "data check ok" in done.stderr
