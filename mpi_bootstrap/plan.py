"""The launcher's Plan: a pure function of the config and the gathered facts.

The same Plan drives `--explain` (rendered, then the agent stops) and the real run
(the executor writes its files and starts its argv). Nothing here touches the system.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap import hostfile as hf
from mpi_bootstrap import mpi, proc
from mpi_bootstrap.config import Config
from mpi_bootstrap.dns import Answer
from mpi_bootstrap.model import Decision, PlannedFile
from mpi_bootstrap.netif import DATA_IFACE_CANDIDATES

SECRET_VARIABLES = frozenset({"MPI_BOOTSTRAP_TOKEN"})


@dataclasses.dataclass(frozen=True)
class HostEntry:
    name: str  # as written in the input hostfile
    address: str | None  # first address the system resolver gave
    slots: int
    rewritten_to: str  # the name mpirun sees
    line: int


@dataclasses.dataclass(frozen=True)
class Facts:
    """Everything the launcher learned before planning."""

    environ: Mapping[str, str]
    hostfile: hf.Hostfile
    answers: Mapping[str, Answer]  # lookup name → last answer
    mpi: mpi.MPIInfo
    interfaces: frozenset[str]
    is_root: bool
    is_pid1: bool
    launcher_hostname: str


@dataclasses.dataclass(frozen=True)
class Plan:
    mpi: mpi.MPIInfo
    hosts: tuple[HostEntry, ...]
    hostfile_path: str
    hostfile_text: str
    files: tuple[PlannedFile, ...]
    argv: tuple[str, ...]
    env_set: Mapping[str, str]
    forwarded: tuple[str, ...]
    decisions: tuple[Decision, ...]
    wrap: bool
    program_index: int  # argv[program_index:] is the user's program

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """mpirun's environment: the agent's own, then what the plan adds, in its order.

        Order matters: the plan's variables come last (see mpi.ENV_END).
        """
        # The agent's own secret never reaches mpirun (local ranks inherit its env).
        env = {k: v for k, v in environ.items()
               if k not in self.env_set and k not in SECRET_VARIABLES}
        env.update(self.env_set)
        return env


def lookup_name(name: str, config: Config) -> str:
    """The name the DNS wait asks for: what mpirun will use, before any IP rewrite.

    `ip` mode looks the FQDN form up, so it also works where only `.svc.<domain>`
    resolves (MPI Operator clusters whose DNS refuses the short `.svc` form).
    """
    if config.rewrite in ("fqdn", "ip"):
        return hf.fqdn(name, config.cluster_domain)
    return name


def data_iface(config: Config, environ: Mapping[str, str],
               interfaces: frozenset[str]) -> tuple[str | None, Decision]:
    if config.data_iface:
        return config.data_iface, Decision("data interface", config.data_iface,
                                           str(config.source("data_iface")), "set explicitly")
    nccl = environ.get("NCCL_SOCKET_IFNAME")
    if nccl:
        return nccl, Decision("data interface", nccl, "env NCCL_SOCKET_IFNAME",
                              "the user's NCCL setting names it")
    for name in DATA_IFACE_CANDIDATES:
        if name in interfaces:
            return name, Decision("data interface", name, "detected",
                                  f"first of {', '.join(DATA_IFACE_CANDIDATES)} present")
    return None, Decision("data interface", "(none)", "detected",
                          f"none of {', '.join(DATA_IFACE_CANDIDATES)} present")


def build_plan(config: Config, facts: Facts) -> Plan:
    decisions: list[Decision] = [
        Decision("role", config.role, str(config.source("role")), "launcher runs mpirun"),
        Decision("mpi", f"{facts.mpi.vendor} {facts.mpi.version}", facts.mpi.source,
                 f"{facts.mpi.mpirun} --version: {facts.mpi.version_line!r}"),
        Decision("hostfile", facts.hostfile.path, str(config.source("hostfile")),
                 f"{len(facts.hostfile.hosts)} hosts, {facts.hostfile.total_slots} slots"),
        Decision("rewrite", config.rewrite, str(config.source("rewrite")),
                 {"none": "names kept as written",
                  "fqdn": f"x.svc → x.svc.{config.cluster_domain}",
                  "ip": "names replaced by the addresses the DNS wait found"}[config.rewrite]),
    ]
    decisions.extend(Decision("note", "", "config", n) for n in config.notes)

    entries: list[HostEntry] = []
    names: dict[str, str] = {}
    for host in facts.hostfile.hosts:
        lname = lookup_name(host.name, config)
        answer = facts.answers.get(lname)
        address = answer.addresses[0] if answer and answer.ok else None
        new = address if config.rewrite == "ip" and address else lname
        names[host.name] = new
        entries.append(HostEntry(host.name, address, host.slots, new, host.line))
    hosts = hf.rename(facts.hostfile, names)
    runtime = facts.mpi.runtime
    form = hf.HYDRA if runtime == mpi.HYDRA else hf.OPENMPI
    text = hf.render(hosts, form)
    decisions.append(Decision("hostfile form", form, "detected",
                              f"the form {facts.mpi.vendor} reads"))

    data, data_decision = data_iface(config, facts.environ, facts.interfaces)
    decisions.append(data_decision)
    if config.control_iface not in facts.interfaces:
        decisions.append(Decision("control interface", config.control_iface,
                                  str(config.source("control_iface")),
                                  f"WARNING: not present here (have: "
                                  f"{', '.join(sorted(facts.interfaces))})"))
    else:
        decisions.append(Decision("control interface", config.control_iface,
                                  str(config.source("control_iface")),
                                  "ssh and MPI control traffic stay on the pod network"))

    spec = mpi.build(mpi.LaunchFacts(
        mpi=facts.mpi,
        program=config.program,
        hostfile=config.output_hostfile,
        input_hostfile=facts.hostfile.path,
        total_slots=facts.hostfile.total_slots,
        np=config.np,
        np_source=str(config.source("np")),
        control_iface=config.control_iface,
        data_iface=data,
        environ=facts.environ,
        is_root=facts.is_root,
        ssh_command=ssh_command(config),
        ssh_wrapper=f"{config.state_dir}/ssh-launcher",
        forward_patterns=config.forward_env,
        startup_timeout=config.startup_timeout,
    ))
    decisions.extend(spec.decisions)
    how, why = proc.mode(facts.is_pid1, config.exec)
    if how != "exec":
        why += (f"; after mpirun exits, leftovers get SIGTERM, then SIGKILL after "
                f"{config.grace_seconds:g} s; the resident supervisor imports only the "
                "standard library")
    decisions.append(Decision("supervision", how, str(config.source("exec")), why))
    files = (
        PlannedFile(f"{config.output_hostfile}.orig", facts.hostfile.text, 0o644,
                    f"original text of {facts.hostfile.path}, kept for reference"),
        PlannedFile(config.output_hostfile, text, 0o644, "hostfile for mpirun"),
        *spec.files,
    )
    return Plan(mpi=facts.mpi, hosts=tuple(entries), hostfile_path=config.output_hostfile,
                hostfile_text=text, files=files, argv=spec.argv, env_set=spec.env_set,
                forwarded=spec.forwarded, decisions=tuple(decisions), wrap=spec.wrap,
                program_index=spec.program_index)


def ssh_command(config: Config) -> tuple[str, ...]:
    """The ssh client command mpirun's launcher uses to reach workers.

    BatchMode: a PID 1 has no terminal, so a password or host-key prompt would hang the
    job instead of failing it. (Issue 4 adds the per-host config with pinned host keys.)
    """
    return ("ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={config.ssh_connect_timeout}")

