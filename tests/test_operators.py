"""Every manifest in container/k8s/ run as its operator makes its pods
(tests/support/operators.py, built from each operator's source): MPI Operator's MPIJobs,
a plain JobSet, Kubeflow Trainer v2's TrainJob on each of the project's runtimes (with
runLauncherAsNode too) and on Trainer's own runtime with only its image swapped, and
Volcano's Job; no variable an operator does not set, no agent setting beyond the
manifest's. Each pod is the agent as PID 1 of its namespaces, every pod started at once
(but where a manifest waits for readiness). Then MPI Operator's layout with an NCCL
job's environment for the node checks."""

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
        "mpich": "mpich", "intel-mpi": "intel",
        "no-sshd": "openmpi4"}  # fmt: skip  # image tag → its MPI
IMAGES = {"mpich-mpi-bootstrap": "mpich", "intel-mpi-mpi-bootstrap": "intel"}  # by name


def _image(specs: Sequence[operators.PodSpec], docs: list[dict[str, Any]], programs: Path,
           rt: Path, expect: Mapping[str, str]) -> operators.Image:  # fmt: skip
    """The image the pods name (its name or tag says its MPI) with the job's program:
    the allreduce, run only where every variable of `expect` has its value (a rank
    without the launcher's trainer.env exits 3 saying so)."""
    (image,) = {c["image"] for d in docs for c in _containers(d)}
    name, tag = image.rsplit("/", 1)[1].rsplit(":", 1)
    kind = IMAGES.get(name) or TAGS[tag]
    m = REAL_MPIS[kind]
    exe = compile_allreduce(m, programs)
    check = "".join(
        f'[ "${{{k}}}" = {shlex.quote(v)} ] || {{ echo "$(hostname): {k} not set" >&2; exit 3; }}\n'
        for k, v in expect.items()
    )
    prog = programs / f"pi-{os.getpid()}-{kind}"
    prog.write_text(f'#!/bin/sh\n{check}exec {exe} "$@"\n')
    prog.chmod(0o755)
    pypi = m.bindir if not m.bindir.startswith("/usr/") else None
    # Intel's images set LD_LIBRARY_PATH to its libraries (IMB-MPI1 has no RPATH)
    lib = {"LD_LIBRARY_PATH": os.path.dirname(m.bindir) + "/lib"} if kind == "intel" else {}
    return operators.Image(rt, prog, pypi, lib)


def _containers(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container template of an MPIJob, a ClusterTrainingRuntime or a JobSet."""
    if doc["kind"] == "MPIJob":
        for replica in doc["spec"]["mpiReplicaSpecs"].values():
            yield from replica["template"]["spec"]["containers"]
        return
    if doc["kind"] == "Job":  # Volcano's
        for task in doc["spec"]["tasks"]:
            yield from task["template"]["spec"]["containers"]
        return
    runtime = doc["kind"] == "ClusterTrainingRuntime"
    spec = doc["spec"]["template"]["spec"] if runtime else doc["spec"]
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


MPIJOBS = {  # the file's MPIJob (its index in the file) → (ranks, hosts); 0: IMB-MPI1's run
    "mpich.yaml": (4, 2),
    "hardened.yaml": (4, 2),  # restricted-readonly: uid 1000, a read-only root, /tmp
    "hardened.yaml#1": (4, 2),  # openshift-restricted, under OpenShift's restricted SCC
    "no-sshd.yaml": (4, 2),  # the workers on the agent's own ssh server, restricted, read-only
    "intel-mpi.yaml": (0, 2),
    "net-exchange.yaml": (2, 2),
    # all_reduce_perf: the image's program at nccl-tests' path is the suite's allreduce
    # (no GPU here); the job's NCCL settings and its net1 are the manifest's.
    "nccl-allreduce.yaml": (2, 2),
    # the same on DraNet: its claim's NIC dranet0 in each worker, the launcher started
    # once the workers are ready (WaitForWorkersReady: their exec probes run)
    "dranet-allreduce.yaml": (2, 2),
}


@pytest.mark.parametrize("name", MPIJOBS)
@pytest.mark.usefixtures("uid1000", "dnsmasq")
def test_mpijob_as_shipped(name: str, programs: Path, runtime_for_others: Path) -> None:
    """The MPIJob of container/k8s/NAME as MPI Operator v0.8.2 makes its pods
    (tests/support/operators.py: K_MPI_JOB_ROLE, its MPI's variables, the Secret and the
    hostfile ConfigMap, a worker's empty command made `/usr/sbin/sshd -De`), every pod
    started at once: the job runs on every worker."""
    file, _, index = name.partition("#")
    docs = operators.documents(K8S / file)
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    job = [d for d in docs if d["kind"] == "MPIJob"][int(index or 0)]
    specs = operators.mpijob_pods(job, objects)
    if job["metadata"]["name"].startswith("openshift"):
        operators.openshift(specs)
    image = _image(specs, [job], programs, runtime_for_others, {})
    code, out, err, agents = operators.run(specs, image)
    assert code == 0, operators.said(agents)
    size, workers = MPIJOBS[name]
    hosts = [s.name for s in specs if not s.launcher]
    assert len(hosts) == workers
    if size:
        check_allreduce(subprocess.CompletedProcess([], code, out, err), size, hosts)
    else:
        assert "Benchmarking Allreduce" in out and "#processes = 4" in out, out


@pytest.mark.parametrize("form", ["as-shipped", "mpiexec-host"])
@pytest.mark.usefixtures("dnsmasq")
def test_volcano(form: str, programs: Path, runtime_for_others: Path) -> None:
    """container/k8s/volcano.yaml as Volcano's svc and ssh plugins make its pods (no
    setting: the roles from VC_*_HOSTS, the hostfile /etc/volcano/mpiworker.host without
    slots, the ssh plugin's RSA key): `mpirun -np 2 PROG` as shipped, and Volcano's own
    example's form `mpiexec --allow-run-as-root --host $(VC_MPIWORKER_HOSTS) -np 2 PROG`,
    each run both ranks on the workers."""
    (job,) = operators.documents(K8S / "volcano.yaml")
    if form == "mpiexec-host":
        master = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
        master["args"] = ["--", "mpiexec", "--allow-run-as-root", "--host",
                          "$(VC_MPIWORKER_HOSTS)", "-np", "2", "/home/mpi_hello_world"]  # fmt: skip
    specs = operators.volcano_pods(job)
    image = _image(specs, [job], programs, runtime_for_others, {})
    code, out, err, agents = operators.run(specs, image, timeout=120)
    assert code == 0, operators.said(agents)
    check_allreduce(subprocess.CompletedProcess([], code, out, err), 2,
                    [s.name for s in specs if not s.launcher])  # fmt: skip


def test_every_manifest_runs() -> None:
    """Every manifest in container/k8s/ is run above as its operator makes its pods: a
    manifest we ship is a manifest that ran."""
    ran = {p.name for p, _, _ in TRAINJOBS.values()} | {n.partition("#")[0] for n in MPIJOBS}
    ran |= {"jobset.yaml", "volcano.yaml"}
    assert ran >= {p.name for p in K8S.glob("*.yaml")}


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
