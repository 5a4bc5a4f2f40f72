"""Each operator's own pod layout, no agent setting: Kubeflow Trainer v2 (a TrainJob's
JobSet: replicated jobs `launcher` and `node`, uid 1000 with fsGroup 1000, the job's
Secret at /home/mpiuser/.ssh with an ECDSA P-521 `id_rsa` 0640, the hostfile ConfigMap
at /etc/mpi on the launcher only, Trainer's OMPI_MCA_* on the launcher, `trainer.env` on
the launcher only), also with runLauncherAsNode (the launcher is the hostfile's first
host and runs ranks); and Volcano (plugins `ssh` and `svc`: /etc/volcano/<task>.host one
name a line without slots, VC_* variables, an RSA key and ssh `config` at /root/.ssh) in
both of its example's command forms. Each pod is the agent as PID 1 of its namespaces,
every pod started together."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import REAL_MPIS
from tests.support.cluster import Cluster, Pod
from tests.support.job import Agent, check_allreduce
from tests.support.programs import compile_allreduce

pytestmark = [pytest.mark.usefixtures("netns", "realmpi"), pytest.mark.timeout(300)]

NAMES = ["pi-launcher-0-0", "pi-node-0-0", "pi-node-0-1"]
SETTING = "MY_SETTING"  # a variable of the TrainJob's trainer.env: on the launcher only


@pytest.fixture
def secret(programs: Path) -> Iterator[Path]:
    """Trainer's Secret `<trainjob>-mpi-ssh-auth` as kubelet mounts it with fsGroup 1000:
    an ECDSA P-521 key named id_rsa, its public half, authorized_keys; root:1000 0640."""
    mount = Path(programs) / f"secret-{os.getpid()}"
    mount.mkdir(mode=0o755)
    key = mount / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(key)],
                   check=True)  # fmt: skip
    (mount / "authorized_keys").write_text((mount / "id_rsa.pub").read_text())
    for f in mount.iterdir():
        os.chown(f, 0, 1000)
        f.chmod(0o640)
    os.chown(mount, 0, 1000)
    yield mount
    subprocess.run(["rm", "-rf", str(mount)], check=False)


# Each pod's own /run/mpi-bootstrap, where root's default state directory lies: pods of
# two tests beside each other have the same names (os.makedirs below: the mount point).
OWN_RUN = "mount -t tmpfs -o mode=0755 run /run/mpi-bootstrap && "


class Trainer:
    """Trainer's pods in `c`, each run as its pod spec runs it: /home/mpiuser (/root for
    uid 0) with the Secret at .ssh, the ConfigMap at /etc/mpi on the launcher, then the
    pod's uid and fsGroup; the agent from `rt` (readable by that uid)."""

    def __init__(self, c: Cluster, secret: Path, rt: Path, uid: int) -> None:
        self.c, self.secret, self.rt, self.uid = c, secret, rt, uid

    def start(self, pod: Pod, env: dict[str, str], argv: Sequence[str] = (),
              hostfile: str | None = None, more: str = "") -> Agent:  # fmt: skip
        uid, home = self.uid, "/home/mpiuser" if self.uid else "/root"
        mounts = more + (
            f"mount -t tmpfs -o mode=0755 home {os.path.dirname(home) if uid else home} && "
            f"mkdir -p {home}/.ssh && chown {uid}:{uid} {home} && "
            f"mount --bind {shlex.quote(str(self.secret))} {home}/.ssh && {OWN_RUN}"
        )
        if hostfile is not None:
            (Path(pod.tmp or "") / "etc-mpi").mkdir()
            (Path(pod.tmp or "") / "etc-mpi" / "hostfile").write_text(hostfile)
            mounts += "mount --bind /tmp/etc-mpi /etc/mpi && "
        user = [] if uid == 0 else [
            "setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={uid}", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all",
        ]  # fmt: skip
        agent = [*user, "/usr/bin/python3", "-m", "mpi_bootstrap", *argv]
        env = {"HOME": home, "LANG": "C.UTF-8", "PYTHONPATH": str(self.rt), **env}
        return Agent(self.c, pod, ["sh", "-c", f'{mounts}exec "$0" "$@"', *agent], env)


CASES = [  # (MPI, runLauncherAsNode, the pods' uid)
    ("openmpi4", False, 1000),
    ("openmpi4", True, 1000),
    ("openmpi5", True, 0),
    ("mpich", False, 0),
    ("mpich", True, 0),
    ("intel", True, 0),
]


@pytest.mark.parametrize(("mpi", "as_node", "uid"), CASES)
@pytest.mark.usefixtures("uid1000")
def test_trainer_v2(  # noqa: PLR0917 - the case and its fixtures
    mpi: str, as_node: bool, uid: int, secret: Path, programs: Path, runtime_for_others: Path
) -> None:
    """The TrainJob runs every rank on every host of Trainer's hostfile (the launcher's
    too with runLauncherAsNode) and every rank reads the launcher's trainer.env variable;
    the node pods' own identity (HOSTNAME, JOB_COMPLETION_INDEX) is theirs."""
    m = REAL_MPIS[mpi]
    exe = compile_allreduce(m, programs)
    for point in ("/etc/mpi", "/run/mpi-bootstrap"):  # mount points, empty
        os.makedirs(point, mode=0o755, exist_ok=True)
    with Cluster(NAMES, pid1=True, job="pi") as c:
        hosts = c.pods if as_node else c.pods[1:]
        path = f"{m.bindir}:/usr/local/bin:/usr/bin:/bin"
        every = {"PATH": path, "JOBSET_NAME": "pi", "REPLICATED_JOB_REPLICAS": "1",
                 "JOB_INDEX": "0"}  # fmt: skip
        pods = Trainer(c, secret, runtime_for_others, uid)
        nodes = [
            pods.start(p, {**every, "REPLICATED_JOB_NAME": "node", "JOB_COMPLETION_INDEX": str(i)})
            for i, p in enumerate(c.pods[1:])
        ]
        launcher_env = {
            **every, "REPLICATED_JOB_NAME": "launcher", "JOB_COMPLETION_INDEX": "0",
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": "2",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            SETTING: "from-trainer-env",
        }  # fmt: skip
        hostfile = "".join(f"{p.name} slots=2\n" for p in hosts)
        check = (
            f'[ "${SETTING}" = from-trainer-env ] && {{ [ "$(hostname)" = {NAMES[0]} ] || '
            f'[ "${{REPLICATED_JOB_NAME:-}}" != launcher ]; }} && exec {exe}'
        )
        launcher = pods.start(
            c.pods[0], launcher_env, ["--", "mpirun", "sh", "-c", check], hostfile
        )
        code, out, err = launcher.finish(timeout=150)
        said = "\n".join(n.stderr()[-2000:] for n in nodes)
        assert code == 0, f"{err}\n{said}"
        check_allreduce(subprocess.CompletedProcess([], code, out, err), 2 * len(hosts),
                        [p.name for p in hosts])  # fmt: skip


VC = ["lm-mpimaster-0", "lm-mpiworker-0", "lm-mpiworker-1"]


@pytest.mark.parametrize("form", ["mpirun", "mpiexec-host"])
def test_volcano(form: str, programs: Path, runtime_for_others: Path) -> None:
    """Volcano's MPI example, the agent as each task's command: the master's task and the
    workers' from VC_*_HOSTS, the hostfile /etc/volcano/mpiworker.host (no slots: 1 each),
    the ssh plugin's RSA key; `mpirun -np 2 PROG` and the example's `mpiexec
    --allow-run-as-root --host $VC_MPIWORKER_HOSTS -np 2 PROG` each run both ranks."""
    exe = compile_allreduce(REAL_MPIS["openmpi4"], programs)
    for point in ("/etc/volcano", "/run/mpi-bootstrap"):  # mount points, empty
        os.makedirs(point, mode=0o755, exist_ok=True)
    key = programs / f"vc-ssh-{os.getpid()}-{form}"
    key.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f",
                    str(key / "id_rsa")], check=True)  # fmt: skip
    (key / "authorized_keys").write_text((key / "id_rsa.pub").read_text())
    (key / "config").write_text("StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n")
    for f in key.iterdir():
        f.chmod(0o600)
    fq = [f"{n}.lm" for n in VC]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PYTHONPATH": str(runtime_for_others),
           "VC_MPIMASTER_HOSTS": fq[0], "VC_MPIMASTER_NUM": "1",
           "VC_MPIWORKER_HOSTS": ",".join(fq[1:]), "VC_MPIWORKER_NUM": "2"}  # fmt: skip
    argv = {
        "mpirun": ["mpirun", "-np", "2", str(exe)],
        "mpiexec-host": ["mpiexec", "--allow-run-as-root", "--host", ",".join(fq[1:]),
                         "-np", "2", str(exe)],
    }[form]  # fmt: skip
    with Cluster(VC, pid1=True, domain="lm") as c:
        mounts = f"mount -t tmpfs -o mode=0700 root /root && mkdir /root/.ssh && {OWN_RUN}"
        mounts += f"mount --bind {shlex.quote(str(key))} /root/.ssh && "
        etc = Path(c.pods[0].tmp or "") / "etc-volcano"
        etc.mkdir()
        for task, hosts in (("mpimaster", fq[:1]), ("mpiworker", fq[1:])):
            (etc / f"{task}.host").write_text("".join(f"{h}\n" for h in hosts))
        agent = ["/usr/bin/python3", "-m", "mpi_bootstrap"]  # the machine's /root is hidden
        workers = [Agent(c, p, ["sh", "-c", f'{mounts}exec "$0" "$@"', *agent], env)
                   for p in c.pods[1:]]  # fmt: skip
        mounts += "mount --bind /tmp/etc-volcano /etc/volcano && "
        launcher = Agent(c, c.pods[0], ["sh", "-c", f'{mounts}exec "$0" "$@"', *agent, "--",
                                        *argv], env)  # fmt: skip
        code, out, err = launcher.finish(timeout=120)
        said = "\n".join(w.stderr()[-2000:] for w in workers)
        assert code == 0, f"{err}\n{said}"
        check_allreduce(subprocess.CompletedProcess([], code, out, err), 2, VC[1:])


def _nccl(pod: Pod, version: str, banner: bool) -> None:
    """A libnccl.so.2 of `version` in the pod's /tmp/nccl: its versioned file and link, as
    NCCL's packages install it, or (`banner`) one file carrying NCCL's banner, as pip's."""
    lib = Path(pod.tmp or "") / "nccl"
    lib.mkdir()
    body = b"\x7fELF\0" + f"NCCL version {version}+cuda12.4\0".encode()
    if banner:
        (lib / "libnccl.so.2").write_bytes(body)
    else:
        (lib / f"libnccl.so.{version}").write_bytes(body)
        (lib / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")


@pytest.mark.parametrize("fault", ["none", "shm", "nccl", "launcher-as-node"])
def test_node_checks(fault: str, secret: Path, programs: Path, runtime_for_others: Path) -> None:
    """MPI Operator's layout, 2 slots a worker, an NCCL job's environment (net1, NCCL on
    LD_LIBRARY_PATH): a 64 MiB /dev/shm on one worker, or NCCL 2.21.5 there and 2.26.2 on
    the other, ends the launch before any rank (69) naming that worker and what it found,
    as does another NCCL on a launcher that runs ranks too; without a fault the job runs."""
    exe = compile_allreduce(REAL_MPIS["openmpi4"], programs)
    for point in ("/etc/mpi", "/run/mpi-bootstrap"):  # mount points, empty
        os.makedirs(point, mode=0o755, exist_ok=True)
    names = ["nc-launcher", "nc-worker-0", "nc-worker-1"]
    with Cluster(names, pid1=True) as c:
        pods = Trainer(c, secret, runtime_for_others, 0)
        every = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/tmp/nccl",
                 "NCCL_SOCKET_IFNAME": "net1"}  # fmt: skip
        for i, p in enumerate(c.pods[1:]):
            _nccl(p, "2.26.2" if fault == "nccl" and i else "2.21.5", banner=bool(i))
        _nccl(
            c.pods[0], "2.26.2", banner=False
        )  # on the launcher: the workers' unless it runs ranks
        shm = "mount -t tmpfs -o size=64m shm /dev/shm && " if fault == "shm" else ""
        workers = [
            pods.start(p, {**every, "K_MPI_JOB_ROLE": "worker"}, more=shm if i == 0 else "")
            for i, p in enumerate(c.pods[1:])
        ]
        hosts = names if fault == "launcher-as-node" else names[1:]
        hostfile = "".join(f"{n} slots=2\n" for n in hosts)
        launcher = pods.start(c.pods[0], {**every, "K_MPI_JOB_ROLE": "launcher"},
                              ["--", "mpirun", str(exe)], hostfile)  # fmt: skip
        code, out, err = launcher.finish(timeout=120)
        said = "\n".join(w.stderr()[-2000:] for w in workers)
        if fault == "none":
            check_allreduce(subprocess.CompletedProcess([], code, out, err), 4, names[1:])
            assert '"event": "node check ok"' in err, err
            return
        assert code == 69, f"{err}\n{said}"
        assert "rank " not in out  # mpirun may have started beside the checks: no rank did
        if fault == "shm":
            assert "nc-worker-0: /dev/shm has 64 MiB free of 64 MiB" in err, err
            assert "medium: Memory, sizeLimit: 1Gi" in err
        elif fault == "nccl":
            assert "2.21.5 on nc-worker-0 (/tmp/nccl/libnccl.so.2)" in err, err
            assert "2.26.2 on nc-worker-1" in err
        else:
            assert (
                "2.21.5 on nc-worker-0 and 1 more (/tmp/nccl/libnccl.so.2); 2.26.2 on nc-launcher"
                in err
            ), err
