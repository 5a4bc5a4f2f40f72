"""The launcher's Plan: a pure function of the config and the gathered facts.

The same Plan drives `--explain` (rendered, then the agent stops) and the real run
(the executor writes its files and starts its argv). Nothing here touches the system.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap.core import gate, nccl, records, tokens
from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.datanet import DataNIC
from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.model import Answer, ClientKey, Decision, PlannedFile
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.launcher import dataplan, mpi
from mpi_bootstrap.launcher.sshplan import control_dir, launch_gate, ssh_setup


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
    # SSH trust: the job's client key, and the records of the remote workers
    # by the name mpirun uses. Empty with MPI_BOOTSTRAP_EXCHANGE=none.
    client: ClientKey | None = None
    records: Mapping[str, records.Record] = dataclasses.field(default_factory=dict)
    remote: tuple[str, ...] = ()  # names mpirun reaches over ssh
    deadline: float = 0.0  # monotonic: DNS, records, sshd readiness and preflight share it
    rdma: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # own NICs
    # The interfaces NCCL could use here, in its order (system/netif.py nccl_order);
    # empty: `interfaces`, sorted.
    ifaces: tuple[str, ...] = ()


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
    ssh_command: tuple[str, ...] = ("ssh",)
    ssh_targets: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    remote: tuple[str, ...] = ()
    preflight: bool = False
    prefix: str | None = None  # Open MPI's --prefix, where preflight looks for orted
    control_dir: str | None = None  # ssh's ControlPath directory (connection reuse)
    # The data NICs each worker tests before mpirun (core/nccl.py chose them); empty: off.
    data_check: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # Workers where NCCL_SOCKET_IFNAME selects no interface: why, by host (exit 69, as
    # part of the data check: off with it).
    data_missing: Mapping[str, str] = dataclasses.field(default_factory=dict)
    data_value: str | None = None  # the NCCL_SOCKET_IFNAME the ranks get (None: unset)
    # The data NICs the workers' records name, by host: their check's reports must agree.
    published_data: Mapping[str, DataNIC] = dataclasses.field(default_factory=dict)
    # The launch gate (core/gate.py): mpirun starts with the checks, its ssh to a worker
    # waits for them. None: the checks run first, mpirun after them.
    gate: str | None = None  # gate.EACH or gate.EVERY
    done_file: str | None = None  # dir exchange: `job-done`, written after success
    done_text: str = ""
    deadline: float = 0.0

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """mpirun's environment: the agent's own, then what the plan adds, in its order.

        Order matters: the plan's variables come last (see mpi.ENV_END).
        """
        # The agent's own secret never reaches mpirun (local ranks inherit its env).
        env = {k: v for k, v in public(environ).items() if k not in self.env_set}
        env.update(self.env_set)
        return env


def data_plan(config: Config, facts: Facts) -> dataplan.DataPlan:
    """What NCCL will use on the launcher and on each worker, and why (core/nccl.py)."""
    names = facts.ifaces or tuple(sorted(facts.interfaces))
    rule = nccl.rule(config.data_iface, facts.environ, names, DATA_IFACE_CANDIDATES)
    return dataplan.plan(rule, names, control=config.control_iface,
                         configured=str(config.source("data_iface"))
                         if config.data_iface else None,
                         exchange=config.exchange, remote=facts.remote,
                         recs=facts.records, own_rdma=facts.rdma)


def _base_decisions(config: Config, facts: Facts) -> list[Decision]:
    """Role, MPI, hostfile and rewrite: what every plan starts from."""
    return [
        Decision("role", config.role, str(config.source("role")), "launcher runs mpirun"),
        Decision("mpi", f"{facts.mpi.vendor} {facts.mpi.version}", facts.mpi.source,
                 f"{facts.mpi.mpirun} --version: {facts.mpi.version_line!r}"),
        Decision("hostfile", facts.hostfile.path, str(config.source("hostfile")),
                 f"{len(facts.hostfile.hosts)} hosts, {facts.hostfile.total_slots} slots"),
        Decision("rewrite", config.rewrite, str(config.source("rewrite")),
                 {"none": "names kept as written",
                  "fqdn": f"x.svc → x.svc.{config.cluster_domain}",
                  "ip": "names replaced by the addresses the DNS wait found"}[config.rewrite]),
        *(Decision("note", "", "config", n) for n in config.notes),
        *filter(None, [tokens.decision(config)]),
    ]


def _interfaces(config: Config, facts: Facts, decisions: list[Decision]
                ) -> dataplan.DataPlan:
    """The data interfaces (for NCCL), and whether the control interface is here."""
    data = data_plan(config, facts)
    decisions.append(data.decisions[0])
    source = str(config.source("control_iface"))
    if config.control_iface not in facts.interfaces:
        decisions.append(Decision("control interface", config.control_iface, source,
                                  f"WARNING: not present here (have: "
                                  f"{', '.join(sorted(facts.interfaces))})"))
    else:
        decisions.append(Decision("control interface", config.control_iface, source,
                                  "ssh and MPI control traffic stay on the pod network"))
    return data


def _data_check(config: Config, data: dataplan.DataPlan, preflight: bool) -> Decision:
    nics = ", ".join(dict.fromkeys(n for nics in data.probe.values() for n in nics))
    why = ("disabled" if not config.data_check else
           "needs preflight's ssh sessions (preflight is off or all ranks are local)"
           if not preflight else
           f"no worker has a data NIC beside {config.control_iface}, which preflight "
           "crosses" if not nics else
           f"the workers test {nics} among themselves before mpirun: ring neighbours and "
           "one random peer each, a TCP connection and full-MTU packets that may not "
           "fragment, in parallel; a failure names the pair and exits 69")
    on = config.data_check and bool(nics) and preflight
    return Decision("data check", "on" if on else "off", str(config.source("data_check")),
                    why)


def _launch(config: Config, facts: Facts, data: nccl.Rule, ssh_cmd: tuple[str, ...], *,
            rdma: tuple[tuple[str, str], ...] = (), ssh_gate: str | None = None,
            local: tuple[str, ...] = ()) -> mpi.LaunchSpec:
    return mpi.build(mpi.LaunchFacts(
        mpi=facts.mpi, program=config.program, hostfile=config.output_hostfile,
        input_hostfile=facts.hostfile.path, total_slots=facts.hostfile.total_slots,
        np=config.np, np_source=str(config.source("np")),
        control_iface=config.control_iface, nccl_rule=data, environ=facts.environ,
        is_root=facts.is_root, ssh_command=ssh_cmd,
        ssh_wrapper=f"{config.state_dir}/ssh-launcher",
        forward_patterns=config.forward_env, startup_timeout=config.startup_timeout,
        multi_host=bool(facts.remote), rdma=rdma, ssh_gate=ssh_gate, local_hosts=local,
    ))


def _run_decisions(config: Config, facts: Facts) -> tuple[bool, list[Decision]]:
    """How mpirun is supervised, and whether the workers are checked first."""
    how, why = supervision(facts.is_pid1, config.exec)
    if how != "exec":
        why += (f"; after mpirun exits, leftovers get SIGTERM, then SIGKILL after "
                f"{config.grace_seconds:g} s; the resident supervisor imports only the "
                "standard library")
    preflight = config.preflight and bool(facts.remote)
    return preflight, [
        Decision("supervision", how, str(config.source("exec")), why),
        Decision("preflight", "on" if preflight else "off", str(config.source("preflight")),
                 f"ssh to {len(facts.remote)} workers in parallel: the MPI's daemon is "
                 "found and LD_LIBRARY_PATH arrives, else exit 69 before mpirun"
                 if preflight else "disabled" if not config.preflight
                 else "no remote workers (all ranks local)"),
    ]


def build_plan(config: Config, facts: Facts) -> Plan:
    decisions = _base_decisions(config, facts)
    entries = host_entries(config, facts.hostfile, facts.answers)
    hosts = hf.rename(facts.hostfile, {e.name: e.rewritten_to for e in entries})
    form = hf.HYDRA if facts.mpi.runtime == mpi.HYDRA else hf.OPENMPI
    text = hf.render(hosts, form)
    decisions.append(Decision("hostfile form", form, "detected",
                              f"the form {facts.mpi.vendor} reads"))
    data = _interfaces(config, facts, decisions)
    preflight, run_decisions = _run_decisions(config, facts)
    control = control_dir(config, facts, preflight, decisions)
    ssh_cmd, ssh_files, targets = ssh_setup(config, facts, entries, decisions, control)
    decisions.extend(data.decisions[1:])
    # The checks run beside mpirun where the resident supervisor carries them (not
    # --exec): mpirun's ssh is then the gate, where it alone can start ranks
    # (launcher/mpi/gating.py: not the user's own agent, no rank on this pod unseen).
    gate_path = f"{config.state_dir}/{gate.SCRIPT}" if preflight and not config.exec else None
    local = tuple(e.rewritten_to for e in entries if e.rewritten_to not in facts.remote)
    spec = _launch(config, facts, data.rule, ssh_cmd, rdma=data.rdma, ssh_gate=gate_path,
                   local=local)
    decisions.extend(spec.decisions)
    decisions.extend(run_decisions)
    check = _data_check(config, data, preflight)
    decisions.append(check)
    mode, gate_files, gate_decision = launch_gate(config, facts, spec, ssh_cmd, preflight)
    decisions.append(gate_decision)
    files = (
        PlannedFile(f"{config.output_hostfile}.orig", facts.hostfile.text, 0o644,
                    f"original text of {facts.hostfile.path}, kept for reference"),
        PlannedFile(config.output_hostfile, text, 0o644, "hostfile for mpirun"),
        *ssh_files,
        *spec.files,
        *gate_files,
    )
    prefix = next((spec.argv[i + 1] for i, a in enumerate(spec.argv[:spec.program_index])
                   if a == "--prefix"), None)
    done = done_text = None
    if config.exchange == "dir" and config.exchange_dir and facts.client is not None:
        done = f"{config.exchange_dir}/{records.DONE_FILE}"
        done_text = records.done_text(facts.client.job or "(created at run time)")
    return Plan(mpi=facts.mpi, hosts=tuple(entries), hostfile_path=config.output_hostfile,
                hostfile_text=text, files=files, argv=spec.argv, env_set=spec.env_set,
                forwarded=spec.forwarded, decisions=tuple(decisions), wrap=spec.wrap,
                program_index=spec.program_index, ssh_command=ssh_cmd, ssh_targets=targets,
                remote=facts.remote, preflight=preflight, prefix=prefix, done_file=done,
                done_text=done_text or "", deadline=facts.deadline,
                control_dir=control if ssh_files else None,
                data_check=data.probe if check.value == "on" else {},
                data_missing=data.missing if config.data_check and preflight else {},
                data_value=data.rule.value,
                published_data={h: r.data for h, r in facts.records.items()
                                if r.data is not None and h in facts.remote}, gate=mode)


def host_entries(config: Config, hostfile: hf.Hostfile, answers: Mapping[str, Answer]
                 ) -> list[HostEntry]:
    """Each host with its address and the name mpirun will use for it."""
    entries = []
    for host in hostfile.hosts:
        lname = hf.lookup_name(host.name, config.rewrite, config.cluster_domain)
        answer = answers.get(lname)
        address = answer.addresses[0] if answer and answer.ok else None
        new = address if config.rewrite == "ip" and address else lname
        entries.append(HostEntry(host.name, address, host.slots, new, host.line))
    return entries


def supervision(is_pid1: bool, exec_requested: bool) -> tuple[str, str]:
    """(mode, reason) for --explain: how the child will be run."""
    if exec_requested:
        return "exec", "--exec: the agent is replaced by mpirun (for images that run tini)"
    if is_pid1:
        return "pid1", "the agent is PID 1: it supervises mpirun, forwards signals, reaps"
    return "subreaper", ("not PID 1: the agent becomes a child subreaper so orphans are "
                         "still reaped")
