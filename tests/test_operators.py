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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REAL_MPIS
from tests.support import operators
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


K8S = Path(__file__).resolve().parent.parent / "container" / "k8s"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "operators"
TAGS = {"openmpi4": "openmpi4", "latest": "openmpi4", "openmpi5": "openmpi5",
        "mpich": "mpich", "intel-mpi": "intel"}  # fmt: skip  # image tag → its MPI


def _image(specs: Sequence[operators.PodSpec], docs: list[dict[str, Any]], programs: Path,
           rt: Path, expect: Mapping[str, str]) -> operators.Image:  # fmt: skip
    """The image the pods name (its tag says its MPI) with the job's program: the
    allreduce, run only where every variable of `expect` has its value (a rank without
    the launcher's trainer.env exits 3 saying so)."""
    (tag,) = {c["image"].rsplit(":", 1)[1] for d in docs for c in _containers(d)}
    m = REAL_MPIS[TAGS[tag]]
    exe = compile_allreduce(m, programs)
    check = "".join(
        f'[ "${{{k}}}" = {shlex.quote(v)} ] || {{ echo "$(hostname): {k} not set" >&2; exit 3; }}\n'
        for k, v in expect.items()
    )
    prog = programs / f"pi-{os.getpid()}-{TAGS[tag]}"
    prog.write_text(f'#!/bin/sh\n{check}exec {exe} "$@"\n')
    prog.chmod(0o755)
    pypi = m.bindir if not m.bindir.startswith("/usr/") else None
    return operators.Image(rt, prog, pypi)


def _containers(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container template of a ClusterTrainingRuntime or a JobSet."""
    spec = (
        doc["spec"]["template"]["spec"] if doc["kind"] == "ClusterTrainingRuntime" else doc["spec"]
    )
    for rjob in spec.get("replicatedJobs") or []:
        yield from rjob["template"]["spec"]["template"]["spec"]["containers"]


def _trainjob(path: Path, runtime: str | None, as_node: bool) -> tuple[
    list[operators.PodSpec], list[dict[str, Any]], dict[str, str]
]:  # fmt: skip
    """The pods of the TrainJob in `path` (on `runtime` in its place: one of the file's),
    runLauncherAsNode set as asked, and its trainer.env."""
    docs = operators.documents(path)
    tj = next(d for d in docs if d["kind"] == "TrainJob")
    if runtime:
        tj["spec"]["runtimeRef"]["name"] = runtime
    rt = next(d for d in docs if d["kind"] == "ClusterTrainingRuntime"
              and d["metadata"]["name"] == tj["spec"]["runtimeRef"]["name"])  # fmt: skip
    rt["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = as_node
    env = {e["name"]: e["value"] for e in tj["spec"]["trainer"].get("env") or []}
    return operators.trainjob_pods(tj, rt), [rt], env


TRAINJOBS = {  # id: (file, runtime, runLauncherAsNode)
    "openmpi4": (K8S / "trainer-v2.yaml", None, False),
    "openmpi4-as-node": (K8S / "trainer-v2.yaml", None, True),
    "openmpi5": (K8S / "trainer-v2.yaml", "mpi-bootstrap-openmpi5", False),
    "openmpi5-as-node": (K8S / "trainer-v2.yaml", "mpi-bootstrap-openmpi5", True),
    "mpich": (K8S / "trainer-v2.yaml", "mpi-bootstrap-mpich", False),
    "mpich-as-node": (K8S / "trainer-v2.yaml", "mpi-bootstrap-mpich", True),
    "intel": (K8S / "trainer-v2.yaml", "mpi-bootstrap-intel-mpi", False),
    "intel-as-node": (K8S / "trainer-v2.yaml", "mpi-bootstrap-intel-mpi", True),
    "trainers-own-runtime": (FIXTURES / "trainer-deepspeed-distributed.yaml", None, True),
}


@pytest.mark.parametrize(("path", "runtime", "as_node"), TRAINJOBS.values(), ids=TRAINJOBS)
@pytest.mark.usefixtures("uid1000", "dnsmasq")
def test_trainjob(
    path: Path, runtime: str | None, as_node: bool, programs: Path, runtime_for_others: Path
) -> None:
    """A TrainJob's pods as Trainer v2 and JobSet make them (tests/support/operators.py:
    nothing set that they do not set), the agent as each one's ENTRYPOINT and no agent
    setting: every rank runs on every host of Trainer's hostfile (the launcher's too with
    runLauncherAsNode), and every rank reads the TrainJob's trainer.env."""
    specs, docs, env = _trainjob(path, runtime, as_node)
    assert env, "the TrainJob has a trainer.env variable to look for"
    image = _image(specs, docs, programs, runtime_for_others, env)
    code, out, err, agents = operators.run(specs, image)
    assert code == 0, operators.said(agents)
    if os.environ.get("DBG"):
        print(out, operators.said(agents))
    hosts = [s.name for s in specs if not s.launcher or as_node]
    np = int(next(a for a in specs if a.launcher).argv[-2])  # mpirun -n N PROGRAM
    check_allreduce(subprocess.CompletedProcess([], code, out, err), np, hosts[:np])


@pytest.mark.usefixtures("dnsmasq")
def test_jobset_as_shipped(programs: Path, runtime_for_others: Path) -> None:
    """container/k8s/jobset.yaml as JobSet makes its pods (no variable of JobSet's: the
    roles from the pods' names), its token Secret and hostfile ConfigMap as the kubelet
    writes them: both ranks run on the workers."""
    docs = operators.documents(K8S / "jobset.yaml")
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    (js,) = (d for d in docs if d["kind"] == "JobSet")
    specs = operators.jobset_pods(js, objects)
    image = _image(specs, [js], programs, runtime_for_others, {})
    code, out, err, agents = operators.run(specs, image)
    assert code == 0, operators.said(agents)
    check_allreduce(subprocess.CompletedProcess([], code, out, err), 2,
                    [s.name for s in specs if not s.launcher])  # fmt: skip


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
