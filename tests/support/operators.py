"""The operators as they really make pods, from a manifest: what each sets in a pod and
nothing more (environment, mounts and their modes, hostname, subdomain, uid, command and
args over the image's ENTRYPOINT, start order), each rule cited where it is built.
`run` starts those pods on the simulated cluster, the agent as each one's PID 1.

- JobSet (kubernetes-sigs/jobset 08dfbdf): `jobset_pods`.
- Kubeflow Trainer v2 (kubeflow/trainer 8c0f505): `trainjob_pods`, a JobSet from the
  runtime's template as its MPI and trainer plugins change it.
Not built here (yet): MPI Operator's MPIJob and Volcano's Job (tests/test_operators.py
builds their layouts by hand).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import Cluster, Pod
from tests.support.job import Agent

# The image (container/Dockerfile): its ENTRYPOINT, no CMD, Debian's PATH, WORKDIR /.
ENTRYPOINT = ["mpi-bootstrap"]
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The image's users (its /etc/passwd: MPI Operator's and Trainer's base images).
HOMES = {0: "/root", 1000: "/home/mpiuser"}
# What the kubelet gives every container (the default namespace's `kubernetes` Service).
KUBELET_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
}


@dataclasses.dataclass
class Volume:
    """A volume as the kubelet writes it: files (name → bytes) with `mode`, owned by
    root (and group fsGroup when the pod has one)."""

    files: dict[str, bytes]
    mode: int


@dataclasses.dataclass
class PodSpec:
    """One pod as its operator and Kubernetes make it."""

    name: str  # the pod's hostname
    subdomain: str
    replicated_job: str
    env: dict[str, str]
    argv: list[str]  # the container's process: command + args, or ENTRYPOINT + args
    uid: int
    fs_group: int | None
    mounts: dict[str, Volume]  # mount path → volume
    depends_on: list[str] = dataclasses.field(default_factory=list)  # replicated jobs Ready
    tcp_probe: int | None = None  # readinessProbe.tcpSocket.port

    @property
    def launcher(self) -> bool:
        """The pod whose end is the job's (the tests' view: JobSet's successPolicy)."""
        return self.replicated_job == "launcher"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _env(container: Mapping[str, Any], labels: Mapping[str, str], name: str) -> dict[str, str]:
    """A container's `env`, with the downward API's fieldRefs to the pod's labels and name."""
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = str(e["value"])
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "metadata.name":
            out[e["name"]] = name
        elif path.startswith("metadata.labels['"):
            out[e["name"]] = labels[path[len("metadata.labels['") : -2]]
        else:
            raise NotImplementedError(f"fieldRef {path}")
    return out


def _volumes(
    spec: Mapping[str, Any], container: Mapping[str, Any], objects: Mapping[str, Any]
) -> dict[str, Volume]:
    """The container's volumeMounts of Secrets and ConfigMaps of `objects` (kind/name)."""
    by_name = {v["name"]: v for v in spec.get("volumes") or []}
    mounts: dict[str, Volume] = {}
    for m in container.get("volumeMounts") or []:
        v = by_name[m["name"]]
        kind, src = ("Secret", v["secret"]) if "secret" in v else ("ConfigMap", v["configMap"])
        obj = objects[f"{kind}/{src.get('secretName') or src.get('name')}"]
        data = {k: s.encode() for k, s in (obj.get("stringData") or obj.get("data") or {}).items()}
        mode = src.get("defaultMode", 0o644)  # the API's default for both kinds
        files = {i["path"]: data[i["key"]] for i in src["items"]} if "items" in src else data
        mounts[m["mountPath"]] = Volume(files, mode)
    return mounts


def jobset_pods(jobset: Mapping[str, Any], objects: Mapping[str, Any]) -> list[PodSpec]:
    """The pods of a JobSet (jobset_controller.go constructJobsFromTemplate: each
    replicated job's `replicas` Jobs `<jobset>-<rjob>-<jobIndex>`, made Indexed by the
    webhook; Kubernetes names an Indexed Job's pods `<job>-<index>`, that name their
    hostname, and sets JOB_COMPLETION_INDEX; the subdomain is `network.subdomain`, else
    the JobSet's name). JobSet itself adds no variable to any container."""
    name, spec = jobset["metadata"]["name"], jobset["spec"]
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    pods = []
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        pod_spec = job_spec["template"]["spec"]
        container = pod_spec["containers"][0]
        sc = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
        uid = int(sc.get("runAsUser", 0))
        for j in range(int(rjob.get("replicas", 1))):
            for p in range(int(job_spec.get("parallelism", 1))):
                host = f"{name}-{rjob['name']}-{j}-{p}"
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                    "jobset.sigs.k8s.io/job-index": str(j),
                }
                env = {
                    "PATH": IMAGE_PATH,
                    "HOSTNAME": host,  # the container runtime's
                    "HOME": HOMES[uid],  # from the image's passwd entry
                    **KUBELET_ENV,
                    "JOB_COMPLETION_INDEX": str(p),  # Kubernetes', for an Indexed Job
                    **_env(container, labels, host),
                }
                command, args = container.get("command"), container.get("args") or []
                probe = container.get("readinessProbe") or {}
                pods.append(
                    PodSpec(
                        name=host,
                        subdomain=subdomain,
                        replicated_job=rjob["name"],
                        env=env,
                        argv=[*command, *args] if command else [*ENTRYPOINT, *args],
                        uid=uid,
                        fs_group=sc.get("fsGroup"),
                        mounts=_volumes(pod_spec, container, objects),
                        depends_on=[d["name"] for d in rjob.get("dependsOn") or []],
                        tcp_probe=(probe.get("tcpSocket") or {}).get("port"),
                    )
                )
    return pods


def _ssh_auth() -> dict[str, bytes]:
    """Trainer's Secret `<trainjob>-mpi-ssh-auth` (mpi.go buildSSHAuthSecret): an ECDSA
    P-521 key, PEM `EC PRIVATE KEY`, as items id_rsa, id_rsa.pub, authorized_keys."""
    with tempfile.TemporaryDirectory() as d:
        key = os.path.join(d, "id_rsa")
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", key],
            check=True,
        )
        private, public = Path(key).read_bytes(), Path(key + ".pub").read_bytes()
    return {"id_rsa": private, "id_rsa.pub": public, "authorized_keys": public}


def trainjob_pods(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> list[PodSpec]:
    """The pods of a TrainJob on a ClusterTrainingRuntime with an MPI policy: the runtime's
    JobSet named after the TrainJob, as Trainer's plugins change it (kubeflow/trainer
    8c0f505, pkg/runtime/framework/plugins/mpi/mpi.go EnforceMLPolicy and Build; the
    trainer's command, args and env go to the container `node` of the replicated job
    labelled trainjob-ancestor-step: trainer, the launcher)."""
    tj_name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer") or {}
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    as_node = bool(mpi.get("runLauncherAsNode"))
    nodes = int(trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes", 1))
    slots = int(trainer.get("numProcPerNode") or mpi.get("numProcPerNode", 1))
    if mpi.get("mpiImplementation", "OpenMPI") != "OpenMPI":
        raise NotImplementedError("Trainer's MPI plugin supports OpenMPI only (mpi.go)")
    jobset = {"metadata": {"name": tj_name}, "spec": yaml.safe_load(yaml.safe_dump(
        runtime["spec"]["template"]["spec"]))}  # fmt: skip
    auth = Volume(_ssh_auth(), 0o640)  # mpi.go: WithDefaultMode(0640)
    subdomain = (jobset["spec"].get("network") or {}).get("subdomain") or tj_name
    for rjob in jobset["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        count = max(nodes - 1, 1) if as_node else nodes
        if rjob["name"] == "node":  # its PodSet's count: parallelism and completions
            job_spec["parallelism"] = job_spec["completions"] = count
        for c in job_spec["template"]["spec"]["containers"]:
            if c["name"] != "node":
                continue
            if rjob["name"] == "launcher":  # the trainer plugin's, then the MPI plugin's
                c.update({k: trainer[k] for k in ("command", "args") if k in trainer})
                c["env"] = [*(c.get("env") or []), *(trainer.get("env") or []), *[
                    {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
                    {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                    {"name": "OMPI_MCA_orte_set_default_slots", "value": str(slots)},
                    {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
                ]]  # fmt: skip
    pods = jobset_pods(jobset, {})
    # Both roles get the ssh Secret at sshAuthMountPath; the launcher, the hostfile
    # ConfigMap at /etc/mpi (item mode 0444): a line `<endpoint> slots=N` for each pod of
    # the node PodSets (the launcher's too with runLauncherAsNode), in the PodSets' order.
    hosts = [p for p in pods if p.replicated_job == "node" or (as_node and p.launcher)]
    hostfile = "".join(f"{p.name}.{subdomain} slots={slots}\n" for p in hosts)
    for p in pods:
        p.mounts[mpi.get("sshAuthMountPath", "/root/.ssh")] = auth
        if p.launcher:
            p.mounts["/etc/mpi"] = Volume({"hostfile": hostfile.encode()}, 0o444)
    return pods


# ----------------------------------------------------------------- running them


@dataclasses.dataclass
class Image:
    """What the simulated image holds: the agent (`agent`: a directory another uid can
    read, tests/conftest.py runtime_for_others), the MPI's bin directory first in PATH
    (the PyPI MPIs' venvs), and the job's program at /home/mpiuser/pi."""

    agent: Path
    program: Path
    mpi_bindir: str | None = None


def _kubelet_volume(where: Path, vol: Volume, fs_group: int | None) -> None:
    """`vol` as the kubelet's atomic writer lays it out: the files in a timestamped
    directory, `..data` a link to it, each name a link through `..data`; the volume's
    directory 1777 (with fsGroup: root:fsGroup 3777, the files' group fsGroup)."""
    stamp = where / "..2026_11_28_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, data in vol.files.items():
        f = stamp / name
        f.write_bytes(data)
        f.chmod(vol.mode)
        os.chown(f, 0, fs_group or 0)
        (where / name).symlink_to(f"..data/{name}")
    (where / "..data").symlink_to(stamp.name)
    os.chown(where, 0, fs_group or 0)
    where.chmod(0o3777 if fs_group is not None else 0o1777)


def _setup(spec: PodSpec, pod: Pod, image: Image) -> str:
    """The shell that lays out the pod's filesystem before its process starts: its own
    /home (the image's mpiuser and the program), /root, /run/mpi-bootstrap, its volumes
    bind-mounted from the pod's /tmp, and the image's agent on PATH."""
    tmp = Path(pod.tmp or "")
    home = tmp / "image-home"
    (home / "mpiuser").mkdir(parents=True)
    os.chown(home / "mpiuser", 1000, 1000)
    pi = home / "mpiuser" / "pi"
    pi.write_text(f'#!/bin/sh\nexec {shlex.quote(str(image.program))} "$@"\n')
    pi.chmod(0o755)
    bindir = tmp / "image-bin"
    bindir.mkdir()
    agent = bindir / "mpi-bootstrap"
    agent.write_text(  # as pip's console script, the agent's directory on its path
        f"#!/usr/bin/python3\nimport sys\nsys.path.insert(0, {str(image.agent)!r})\n"
        "from mpi_bootstrap.entry import main\nsys.exit(main())\n"
    )
    agent.chmod(0o755)
    # The image's passwd and group: root's, and mpiuser (uid 1000, /home/mpiuser) in place
    # of whatever this machine calls uid 1000 (sshd looks the user up, and ssh its home).
    for name, entry in (("passwd", "mpiuser:x:1000:1000::/home/mpiuser:/bin/sh"),
                        ("group", "mpiuser:x:1000:")):  # fmt: skip
        mine = [
            line for line in Path(f"/etc/{name}").read_text().splitlines()
            if line.split(":")[2:3] != ["1000"]
        ]  # fmt: skip
        (tmp / f"image-{name}").write_text("\n".join([*mine, entry]) + "\n")
        (tmp / f"image-{name}").chmod(0o644)
    shell = [
        "mount --bind /tmp/image-passwd /etc/passwd",
        "mount --bind /tmp/image-group /etc/group",
        "mount -t tmpfs -o mode=0700 image-root /root",
        "mount -t tmpfs -o mode=0755 image-run /run/mpi-bootstrap",
        f"mount --bind {shlex.quote(str(home))} /home",
        "mount --bind /tmp/image-bin /usr/local/bin",
    ]
    for i, (path, vol) in enumerate(sorted(spec.mounts.items())):
        where = tmp / f"volume-{i}"
        _kubelet_volume(where, vol, spec.fs_group)
        shell += [
            f"mkdir -p {shlex.quote(path)}",
            f"mount --bind /tmp/volume-{i} {shlex.quote(path)}",
        ]
    return " && ".join(shell)


def _start(c: Cluster, pod: Pod, spec: PodSpec, image: Image) -> Agent:
    """The pod's process as PID 1 of its namespaces, as its uid (groups: its own and
    fsGroup, no capability), in the image's WORKDIR /."""
    layout = _setup(spec, pod, image)
    user: list[str] = []
    if spec.uid:
        groups = ",".join(str(g) for g in {spec.uid, spec.fs_group or spec.uid})
        user = ["setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", f"--groups={groups}",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]  # fmt: skip
    env = dict(spec.env)
    if image.mpi_bindir:
        env["PATH"] = f"{image.mpi_bindir}:{env['PATH']}"
    argv = ["sh", "-c", f'{layout} && cd / && exec "$0" "$@"', *user, *spec.argv]
    return Agent(c, pod, argv, env)


def _ready(pod: Pod, port: int, timeout: float) -> None:
    """Until the pod's address takes a TCP connection on `port` (the kubelet's tcpSocket)."""
    deadline = time.monotonic() + timeout
    probe = f"exec 3<>/dev/tcp/{pod.address}/{port}"
    while time.monotonic() < deadline:
        done = pod.netns.run(["bash", "-c", probe], capture_output=True, timeout=10)
        if done.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{pod.name}: nothing listens on {port} after {timeout:g} s")


def mount_points(specs: Sequence[PodSpec]) -> Iterator[str]:
    """The directories the pods mount over that must exist on this machine (empty)."""
    yield "/run/mpi-bootstrap"
    for s in specs:
        yield from (p for p in s.mounts if not p.startswith(("/home/", "/root/")))


def run(specs: Sequence[PodSpec], image: Image, timeout: float = 150) -> tuple[
    int, str, str, dict[str, Agent]
]:  # fmt: skip
    """Start the pods on a cluster with DNS (each pod `<name>.<subdomain>` in the default
    namespace), every pod at once but those that `dependsOn` others' readiness; return
    the launcher's (exit code, stdout, stderr) and every pod's Agent."""
    for point in mount_points(specs):
        os.makedirs(point, mode=0o755, exist_ok=True)
    (subdomain,) = {s.subdomain for s in specs}
    launchers = [s for s in specs if s.launcher]
    names = [s.name for s in launchers] + [s.name for s in specs if not s.launcher]
    by_name = {s.name: s for s in specs}
    with Cluster(names, pid1=True, dns=True, job=subdomain) as c:
        agents: dict[str, Agent] = {}
        # JobSet creates every Job at once, but one that `dependsOn` another's Ready pods
        # only once they are (the kubelet's tcpSocket probe: the only kind modelled here).
        for pod in sorted(c.pods, key=lambda p: bool(by_name[p.name].depends_on)):
            for dep in by_name[pod.name].depends_on:
                for other in (o for o in c.pods if by_name[o.name].replicated_job == dep):
                    port = by_name[other.name].tcp_probe
                    if port is None:
                        raise NotImplementedError("dependsOn: readiness by tcpSocket only")
                    _ready(other, port, timeout / 2)
            agents[pod.name] = _start(c, pod, by_name[pod.name], image)
        code, out, err = agents[launchers[0].name].finish(timeout=timeout)
        return code, out, err, agents


def said(agents: Mapping[str, Agent]) -> str:
    """Every pod's whole log, for a failing test's message."""
    return "\n".join(f"--- {name}:\n{a.stderr()}" for name, a in agents.items())
