"""The operators as they really make pods, from a manifest: what each sets in a pod and
nothing more (environment, mounts and their modes, hostname, subdomain, uid, command and
args over the image's ENTRYPOINT, start order), each rule cited where it is built.
`run` starts those pods on the simulated cluster, the agent as each one's PID 1.

- MPI Operator v0.8.2 (kubeflow/mpi-operator caa3c47): `mpijob_pods`.
- JobSet (kubernetes-sigs/jobset 08dfbdf): `jobset_pods`.
- Kubeflow Trainer v2 (kubeflow/trainer 8c0f505): `trainjob_pods`, a JobSet from the
  runtime's template as its MPI and trainer plugins change it.
- Volcano's Job with its svc and ssh plugins (volcano-sh/volcano ed72c7c): `volcano_pods`.
- OpenShift's restricted SCC on pods that name no uid: `openshift`.
The pod as a container runtime makes it (`run`): the image's ENTRYPOINT (the agent),
PATH, passwd entries (mpiuser, uid 1000), its own /root, /home, /opt and
/run/mpi-bootstrap, WORKDIR /; the kubelet's volumes (`..data` links, modes, fsGroup),
HOSTNAME and the `kubernetes` Service's variables; a read-only root where asked.
"""

from __future__ import annotations

import dataclasses
import os
import re
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
    modes: dict[str, int] = dataclasses.field(default_factory=dict)  # items' own modes
    flat: bool = False  # mounted by subPath: its files themselves, no `..data` links
    empty: bool = False  # an emptyDir


@dataclasses.dataclass
class Security:
    """The container's securityContext over the pod's, as the runtime applies it."""

    uid: int = 0
    gid: int | None = None  # runAsGroup; None: the uid's
    fs_group: int | None = None  # the pod's
    read_only: bool = False  # readOnlyRootFilesystem
    no_caps: bool = False  # capabilities: drop: [ALL]
    no_new_privs: bool = False  # allowPrivilegeEscalation: false
    uid_set: bool = False  # runAsUser given (else a platform's admission may choose one)


def _security(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> Security:
    pod, own = pod_spec.get("securityContext") or {}, container.get("securityContext") or {}
    sc = {**pod, **own}
    return Security(
        uid=int(sc.get("runAsUser", 0)),
        gid=sc.get("runAsGroup"),
        fs_group=pod.get("fsGroup"),
        read_only=bool(own.get("readOnlyRootFilesystem")),
        no_caps="ALL" in ((own.get("capabilities") or {}).get("drop") or []),
        no_new_privs=own.get("allowPrivilegeEscalation") is False,
        uid_set="runAsUser" in sc,
    )


def openshift(specs: Sequence[PodSpec]) -> None:
    """OpenShift's restricted SCC on each pod that names no uid: an arbitrary uid of the
    namespace's range with gid 0 and that fsGroup, no capability, no_new_privs, and (no
    passwd entry in the image) CRI-O's HOME=/."""
    for spec in specs:
        if not spec.sec.uid_set:
            uid = 1000680000  # the first of a namespace's range, as OpenShift assigns it
            spec.sec = dataclasses.replace(
                spec.sec, uid=uid, gid=0, fs_group=uid, no_caps=True, no_new_privs=True
            )
            spec.env["HOME"] = "/"


@dataclasses.dataclass
class PodSpec:
    """One pod as its operator and Kubernetes make it."""

    name: str  # the pod's hostname
    subdomain: str
    replicated_job: str
    env: dict[str, str]
    argv: list[str]  # the container's process: command + args, or ENTRYPOINT + args
    sec: Security
    mounts: dict[str, Volume]  # mount path → volume
    depends_on: list[str] = dataclasses.field(default_factory=list)  # replicated jobs Ready
    tcp_probe: int | None = None  # readinessProbe.tcpSocket.port
    exec_probe: list[str] | None = None  # readinessProbe.exec.command
    data_iface: str | None = None  # a secondary network's NIC (_data_iface)

    @property
    def launcher(self) -> bool:
        """The pod whose end is the job's (the tests' view: JobSet's successPolicy)."""
        return self.replicated_job == "launcher"


def _argv(command: list[str] | None, args: list[str], env: Mapping[str, str]) -> list[str]:
    """The container's process: `command` (else the image's ENTRYPOINT) and `args`, each
    `$(VAR)` of its environment replaced as the kubelet does (`$$` is a `$`)."""
    words = [*command, *args] if command else [*ENTRYPOINT, *args]
    pattern = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
    sub = lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0])  # noqa: E731
    return [pattern.sub(sub, w) for w in words]


def _data_iface(template: Mapping[str, Any], objects: Mapping[str, Any]) -> str | None:
    """The pod's data NIC: Multus names a pod's first secondary network `net1` (its
    annotation k8s.v1.cni.cncf.io/networks); a DraNet claim (a ResourceClaimTemplate of
    `objects` whose dra.net config names the interface) gives that name; else none."""
    if "k8s.v1.cni.cncf.io/networks" in ((template.get("metadata") or {}).get("annotations") or {}):
        return "net1"
    for claim in template["spec"].get("resourceClaims") or []:
        rct = objects.get(f"ResourceClaimTemplate/{claim.get('resourceClaimTemplateName')}")
        for c in (rct or {}).get("spec", {}).get("spec", {}).get("devices", {}).get("config", []):
            if c.get("opaque", {}).get("driver") == "dra.net":
                return str(c["opaque"]["parameters"]["interface"]["name"])
    return None


def _runtime_env(host: str, sec: Security) -> dict[str, str]:
    """What the runtime and the kubelet give every container: the image's PATH, HOSTNAME,
    HOME from the uid's passwd entry (else `/`), the `kubernetes` Service's variables."""
    return {"PATH": IMAGE_PATH, "HOSTNAME": host, "HOME": HOMES.get(sec.uid, "/"), **KUBELET_ENV}


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
    """The container's volumeMounts: emptyDirs, Secrets and ConfigMaps of `objects`
    (by kind/name)."""
    by_name = {v["name"]: v for v in spec.get("volumes") or []}
    mounts: dict[str, Volume] = {}
    for m in container.get("volumeMounts") or []:
        v = by_name[m["name"]]
        if "emptyDir" in v:
            mounts[m["mountPath"]] = Volume({}, 0o777, empty=True)
            continue
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
        sec = _security(pod_spec, container)
        for j in range(int(rjob.get("replicas", 1))):
            for p in range(int(job_spec.get("parallelism", 1))):
                host = f"{name}-{rjob['name']}-{j}-{p}"
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                    "jobset.sigs.k8s.io/job-index": str(j),
                }
                env = {
                    **_runtime_env(host, sec),
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
                        argv=_argv(command, args, env),
                        sec=sec,
                        mounts=_volumes(pod_spec, container, objects),
                        depends_on=[d["name"] for d in rjob.get("dependsOn") or []],
                        tcp_probe=(probe.get("tcpSocket") or {}).get("port"),
                    )
                )
    return pods


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
    key = _key()  # mpi.go buildSSHAuthSecret, its items id_rsa, id_rsa.pub, authorized_keys
    files = {
        "id_rsa": key["private"],
        "id_rsa.pub": key["public"],
        "authorized_keys": key["public"],
    }
    auth = Volume(files, 0o640)  # mpi.go: WithDefaultMode(0640)
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


def _key(kind: str = "ecdsa", bits: int = 521) -> dict[str, bytes]:
    """An operator's generated ssh key in PEM, as the Secret's private and public halves:
    ECDSA P-521 (`EC PRIVATE KEY`: MPI Operator's and Trainer's alike), or Volcano's ssh
    plugin's RSA 2048 (`RSA PRIVATE KEY`: ssh.go generateRsaKey)."""
    with tempfile.TemporaryDirectory() as d:
        key = os.path.join(d, "id_rsa")
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-b", str(bits), "-m", "PEM", "-N", "", "-f", key],
            check=True,
        )
        return {"private": Path(key).read_bytes(), "public": Path(key + ".pub").read_bytes()}


# MPI Operator v0.8.2's launcher variables by mpiImplementation (mpi_job_controller.go
# ompiEnvVars, intelEnvVars, mpichEnvVars, and the slots variable of each).
MPIJOB_ENV = {
    "OpenMPI": {
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": "{slots}",
    },
    "Intel": {
        "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
        "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10",
        "I_MPI_PERHOST": "{slots}",
    },
    "MPICH": {
        "HYDRA_HOST_FILE": "/etc/mpi/hostfile",
        "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10",
    },
}


def mpijob_pods(mpijob: Mapping[str, Any], objects: Mapping[str, Any]) -> list[PodSpec]:
    """The pods of an MPIJob as MPI Operator v0.8.2 makes them (kubeflow/mpi-operator
    caa3c47, pkg/controller/mpi_job_controller.go): `<job>-launcher` and
    `<job>-worker-<i>`, each its hostname, subdomain the job's; K_MPI_JOB_ROLE in both,
    the launcher's MPI variables (MPIJOB_ENV) and, unless it runs ranks, empty
    NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES (newLauncherPodTemplate); a
    worker with neither command nor args gets `command: [/usr/sbin/sshd, -De]` (newWorker,
    replacing the image's ENTRYPOINT); the Secret `<job>-ssh` (id_rsa, id_rsa.pub,
    authorized_keys) at sshAuthMountPath in both, 0600 there only when that is
    /root/.ssh (else the API's 0644: setupSSHOnPod); the ConfigMap `<job>-config` at
    /etc/mpi on the launcher (hostfile 0444, discover_hosts.sh 0555: newConfigMap)."""
    job, spec = mpijob["metadata"]["name"], mpijob["spec"]
    impl = spec.get("mpiImplementation", "OpenMPI")
    slots = int(spec.get("slotsPerWorker", 1))
    auth_path = spec.get("sshAuthMountPath", "/root/.ssh")
    as_worker = bool(spec.get("runLauncherAsWorker"))
    key = _key()
    auth = Volume({"id_rsa": key["private"], "id_rsa.pub": key["public"],
                   "authorized_keys": key["public"]},
                  0o600 if auth_path == "/root/.ssh" else 0o644)  # fmt: skip
    replicas = spec["mpiReplicaSpecs"]
    workers = int(replicas["Worker"].get("replicas", 0))
    names = [f"{job}-launcher"] * as_worker + [f"{job}-worker-{i}" for i in range(workers)]
    fqdn = [f"{n}.{job}.default.svc" for n in names]
    hostfile = "".join(f"{h} slots={slots}\n" if impl == "OpenMPI" else f"{h}:{slots}\n"
                       for h in fqdn)  # fmt: skip
    discover = "#!/bin/sh\n" + "".join(f"echo {h}\n" for h in fqdn)
    files = {"hostfile": hostfile.encode(), "discover_hosts.sh": discover.encode()}
    config = Volume(files, 0o444, {"discover_hosts.sh": 0o555})
    pods = []
    for kind, count in (("Launcher", 1), ("Worker", workers)):
        pod_spec = replicas[kind]["template"]["spec"]
        container = pod_spec["containers"][0]
        sec = _security(pod_spec, container)
        for i in range(count):
            host = f"{job}-launcher" if kind == "Launcher" else f"{job}-worker-{i}"
            env = {**_runtime_env(host, sec), **_env(container, {}, host)}
            command, args = container.get("command"), container.get("args") or []
            mounts = _volumes(pod_spec, container, objects)
            mounts[auth_path] = auth
            if kind == "Launcher":
                env["K_MPI_JOB_ROLE"] = "launcher"
                env.update({k: v.format(slots=slots) for k, v in MPIJOB_ENV[impl].items()})
                if not as_worker:
                    env |= {"NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
                mounts["/etc/mpi"] = config
            else:
                env["K_MPI_JOB_ROLE"] = "worker"
                if not command and not args:
                    command = ["/usr/sbin/sshd", "-De"]
            wait = spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
            probe = (container.get("readinessProbe") or {}).get("exec", {}).get("command")
            pods.append(PodSpec(
                name=host, subdomain=job, replicated_job=kind.lower(), env=env,
                argv=_argv(command, args, env), sec=sec, mounts=mounts,
                depends_on=["worker"] if kind == "Launcher" and wait else [],
                exec_probe=probe, data_iface=_data_iface(replicas[kind]["template"], objects),
            ))  # fmt: skip
    return pods


def volcano_pods(job: Mapping[str, Any]) -> list[PodSpec]:
    """The pods of a Volcano Job with the `svc` and `ssh` plugins (volcano-sh/volcano
    ed72c7c, pkg/controllers/job/plugins/): pods `<job>-<task>-<i>` (helpers.go
    PodNameFmt), each its hostname, subdomain the job's; every container gets
    VC_<TASK>_HOSTS (`<pod>.<job>`, a comma list) and VC_<TASK>_NUM of every task, and
    the ConfigMap `<job>-svc` at /etc/volcano (`<task>.host`, one host a line, and the
    variables as files: svc.go GenerateHosts); the ssh plugin's Secret (an RSA key,
    authorized_keys and an ssh `config`) at /root/.ssh, by subPath, 0600 (ssh.go).
    The `<task>` of a variable is upper-cased, `-` made `_`."""
    name, spec = job["metadata"]["name"], job["spec"]
    plugins = spec.get("plugins") or {}
    if set(plugins) - {"svc", "ssh"}:
        raise NotImplementedError(f"Volcano plugins {sorted(plugins)}")
    hosts = {
        t["name"]: [f"{name}-{t['name']}-{i}.{name}" for i in range(int(t.get("replicas", 1)))]
        for t in spec["tasks"]
    }
    svc: dict[str, str] = {}
    for task, names in hosts.items():
        key = task.replace("-", "_")
        svc[f"{key}.host"] = "\n".join(names)
        svc[f"VC_{key.upper()}_HOSTS"] = ",".join(names)
        svc[f"VC_{key.upper()}_NUM"] = str(len(names))
    key = _key("rsa", 2048)
    config = "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n" + "".join(
        f"Host {h.split('.')[0]}\n  HostName {h}\n  Port 22\n" for names in hosts.values()
        for h in names
    )  # fmt: skip
    files = {"id_rsa": key["private"], "id_rsa.pub": key["public"],
             "authorized_keys": key["public"], "config": config.encode()}  # fmt: skip
    ssh = Volume(files, 0o600, flat=True)
    pods = []
    for t in spec["tasks"]:
        pod_spec = t["template"]["spec"]
        container = pod_spec["containers"][0]
        sec = _security(pod_spec, container)
        for i in range(int(t.get("replicas", 1))):
            host = f"{name}-{t['name']}-{i}"
            env = {**_runtime_env(host, sec), **{k: v for k, v in svc.items() if k[:3] == "VC_"},
                   **_env(container, {}, host)}  # fmt: skip
            command, args = container.get("command"), container.get("args") or []
            mounts = {
                "/etc/volcano": Volume({k: v.encode() for k, v in svc.items()}, 0o644),
                "/root/.ssh": ssh,
            }
            pods.append(PodSpec(
                name=host, subdomain=name,
                # the tests' view of which pod's end is the job's (its CompleteJob policy)
                replicated_job="launcher" if _completes(t) else t["name"],
                env=env, argv=_argv(command, args, env),
                sec=sec, mounts=mounts,
            ))  # fmt: skip
    return pods


def _completes(task: Mapping[str, Any]) -> bool:
    """Whether the task's end completes the Job (a `TaskCompleted: CompleteJob` policy)."""
    return any(
        p.get("event") == "TaskCompleted" and p.get("action") == "CompleteJob"
        for p in task.get("policies") or []
    )


# ----------------------------------------------------------------- running them


@dataclasses.dataclass
class Image:
    """What the simulated image holds: the agent (`agent`: a directory another uid can
    read, tests/conftest.py runtime_for_others), the MPI's bin directory first in PATH
    (the PyPI MPIs' venvs), and the job's program at each path the manifests name
    (PROGRAMS: MPI Operator's pi example, container/Dockerfile.demo's, nccl-tests')."""

    agent: Path
    program: Path
    mpi_bindir: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # its ENV lines


PROGRAMS = (  # MPI Operator's pi example, Volcano's, container/Dockerfile.demo's, nccl-tests'
    "/home/mpiuser/pi",
    "/home/mpi_hello_world",
    "/opt/demo/allreduce",
    "/opt/nccl-tests/build/all_reduce_perf",
)


def _kubelet_volume(where: Path, vol: Volume, fs_group: int | None) -> None:
    """`vol` as the kubelet's atomic writer lays it out: the files in a timestamped
    directory, `..data` a link to it, each name a link through `..data`; the volume's
    directory 1777 (with fsGroup: root:fsGroup 3777, the files' group fsGroup). A `flat`
    volume (a subPath mount) is the files in a directory of the volume, 0755; an
    emptyDir, an empty directory 0777 without the sticky bit (kubernetes#110835; with
    fsGroup: root:fsGroup 2777)."""
    if vol.flat or vol.empty:
        where.mkdir()
        for name, data in vol.files.items():
            (where / name).write_bytes(data)
            (where / name).chmod(vol.modes.get(name, vol.mode))
            os.chown(where / name, 0, fs_group or 0)
        os.chown(where, 0, fs_group or 0)
        where.chmod(0o755 if vol.flat else 0o2777 if fs_group is not None else 0o777)
        return
    stamp = where / "..2026_11_28_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, data in vol.files.items():
        f = stamp / name
        f.write_bytes(data)
        f.chmod(vol.modes.get(name, vol.mode))
        os.chown(f, 0, fs_group or 0)
        (where / name).symlink_to(f"..data/{name}")
    (where / "..data").symlink_to(stamp.name)
    os.chown(where, 0, fs_group or 0)
    where.chmod(0o3777 if fs_group is not None else 0o1777)


# The image's own directories, of each pod (a tmpfs each): read-only with its root.
IMAGE_DIRS = ("/root", "/run/mpi-bootstrap", "/home", "/opt")


def _setup(spec: PodSpec, pod: Pod, image: Image) -> str:
    """The shell that lays out the pod's filesystem before its process starts: the
    image's /etc/passwd and /etc/group, /home (mpiuser's), /opt, /root and
    /run/mpi-bootstrap of its own, its programs (PROGRAMS) and the agent on PATH; its
    volumes bind-mounted from the cluster's directory of the pod; with
    readOnlyRootFilesystem, all but the volumes read-only."""
    tmp = Path(pod.tmp or "")
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
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    shell = [
        f"mount --bind {q(tmp / 'image-passwd')} /etc/passwd",
        f"mount --bind {q(tmp / 'image-group')} /etc/group",
        *(
            f"mount -t tmpfs -o mode={'0700' if d == '/root' else '0755'} image {d}"
            for d in IMAGE_DIRS
        ),
        "mkdir -m 0755 /home/mpiuser && chown 1000:1000 /home/mpiuser",
        f"mount --bind {q(bindir)} /usr/local/bin",
        *(f"mkdir -p {os.path.dirname(p)} && ln -s {q(image.program)} {p}" for p in PROGRAMS),
    ]
    for i, (path, vol) in enumerate(sorted(spec.mounts.items())):
        where = tmp / f"volume-{i}"
        _kubelet_volume(where, vol, spec.sec.fs_group)
        shell += [f"mkdir -p {q(path)}", f"mount --bind {q(where)} {q(path)}"]
    if spec.sec.read_only:
        ro = ("/", "/etc/passwd", "/etc/group", "/usr/local/bin", *IMAGE_DIRS)
        shell += [f"mount -o remount,bind,ro {d}" for d in ro]
    return " && ".join(shell)


def _start(c: Cluster, pod: Pod, spec: PodSpec, image: Image) -> Agent:
    """The pod's process as PID 1 of its namespaces, as its uid (groups: its own and
    fsGroup, no capability), in the image's WORKDIR /."""
    layout = _setup(spec, pod, image)
    argv = ["sh", "-c", f'{layout} && cd / && exec "$0" "$@"', *_user(spec), *spec.argv]
    return Agent(c, pod, argv, _env_of(spec, image))


def _user(spec: PodSpec) -> list[str]:
    """setpriv to the pod's uid, gid and groups (its gid and fsGroup); without any
    capability but root's (dropped too with `drop: [ALL]`); no_new_privs as asked."""
    sec = spec.sec
    flags = ["--no-new-privs"] * (sec.no_new_privs or bool(sec.uid))
    if sec.uid or sec.no_caps:
        flags += ["--inh-caps=-all", "--bounding-set=-all"]
    if sec.uid or sec.gid:
        gid = sec.uid if sec.gid is None else sec.gid
        groups = ",".join(
            str(g) for g in sorted({gid, sec.fs_group if sec.fs_group is not None else gid})
        )
        flags += [f"--reuid={sec.uid}", f"--regid={gid}", f"--groups={groups}"]
    return ["setpriv", *flags] if flags else []


def _env_of(spec: PodSpec, image: Image) -> dict[str, str]:
    """The container's environment over the image's ENV, the image's MPI first on PATH."""
    env = {**image.env, **spec.env}
    if image.mpi_bindir:
        env["PATH"] = f"{image.mpi_bindir}:{env['PATH']}"
    return env


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


def _exec_ready(c: Cluster, agent: Agent, spec: PodSpec, image: Image, timeout: float) -> None:
    """Until the pod's exec readinessProbe exits 0, run as the kubelet runs it: in the
    container's namespaces, as its user, with its environment."""
    pid = c.pid_of(agent.p)
    env = [f"{k}={v}" for k, v in _env_of(spec, image).items()]
    argv = ["nsenter", "-t", str(pid), "-m", "-u", "-n", "-p", "-i", "--", "env", "-i", *env,
            *_user(spec), *(spec.exec_probe or [])]  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert agent.p.poll() is None, f"{spec.name} exited: {agent.stderr()}"
        if subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{spec.name}: not ready after {timeout:g} s: {agent.stderr()}")


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
    nics = {s.name: s.data_iface for s in specs}
    with Cluster(names, pid1=True, dns=True, job=subdomain, data_ifaces=nics) as c:
        agents: dict[str, Agent] = {}
        # Every pod at once, but one that waits for others' readiness (JobSet's
        # `dependsOn`, MPI Operator's WaitForWorkersReady) only once their probes pass.
        for pod in sorted(c.pods, key=lambda p: bool(by_name[p.name].depends_on)):
            for dep in by_name[pod.name].depends_on:
                for other in (o for o in c.pods if by_name[o.name].replicated_job == dep):
                    them = by_name[other.name]
                    if them.tcp_probe is not None:
                        _ready(other, them.tcp_probe, timeout / 2)
                    elif them.exec_probe:
                        _exec_ready(c, agents[other.name], them, image, timeout / 2)
                    else:
                        raise NotImplementedError(f"{other.name}: no readinessProbe to await")
            agents[pod.name] = _start(c, pod, by_name[pod.name], image)
        code, out, err = agents[launchers[0].name].finish(timeout=timeout)
        return code, out, err, agents


def said(agents: Mapping[str, Agent]) -> str:
    """Every pod's whole log, for a failing test's message."""
    return "\n".join(f"--- {name}:\n{a.stderr()}" for name, a in agents.items())
