"""The launcher's Plan: a pure function of the config and the gathered facts.

The same Plan drives `--explain` (rendered, then the agent stops) and the real run
(the executor writes its files and starts its argv). Nothing here touches the system.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap.core import gate, records, tokens
from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.datanet import DataNIC
from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.model import Answer, ClientKey, Decision, PlannedFile
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.launcher import mpi
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
    data_check: str | None = None  # the data NIC the workers test before mpirun
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


def _interfaces(config: Config, facts: Facts, decisions: list[Decision]) -> str | None:
    """The data interface (for NCCL), and whether the control interface is here."""
    data, data_decision = data_iface(config, facts.environ, facts.interfaces)
    decisions.append(data_decision)
    source = str(config.source("control_iface"))
    if config.control_iface not in facts.interfaces:
        decisions.append(Decision("control interface", config.control_iface, source,
                                  f"WARNING: not present here (have: "
                                  f"{', '.join(sorted(facts.interfaces))})"))
    else:
        decisions.append(Decision("control interface", config.control_iface, source,
                                  "ssh and MPI control traffic stay on the pod network"))
    return data


def data_nics(config: Config, facts: Facts, data: str | None,
              decisions: list[Decision]) -> tuple[tuple[str, str], ...]:
    """Each worker's data NIC as its record says (--explain), flagged where it differs
    from the plan's; and the RDMA devices behind the plan's data NIC, by host."""
    rdma = [("launcher", dev) for dev in facts.rdma.get(data or "", ())]
    if config.exchange == "secret" and facts.remote:
        decisions.append(Decision("data NICs", "(found by the data check)", "exchange",
                                  "secret: workers publish no record"))
    for host in facts.remote if config.exchange != "secret" else ():
        rec = facts.records.get(host)
        nic = rec.data if rec is not None else None
        if rec is None:
            continue
        if nic is None:
            why = f"WARNING: no data NIC ({data} planned)" if data else "none"
            decisions.append(Decision(f"data NIC {host}", "(none)", "exchange record", why))
            continue
        why = "as the worker published it"
        if data and nic.nic != data:
            why = f"WARNING: not {data}, the data NIC NCCL_SOCKET_IFNAME names"
        elif nic.nic == data:
            rdma += [(host, dev) for dev in nic.rdma]
        decisions.append(Decision(f"data NIC {host}", nic.summary(), "exchange record", why))
    return tuple(rdma) if data else ()


def _data_check(config: Config, data: str | None, preflight: bool) -> Decision:
    why = ("disabled" if not config.data_check else "no data NIC in the plan" if not data
           else "needs preflight's ssh sessions (preflight is off or all ranks are local)"
           if not preflight else
           f"the workers test {data} among themselves before mpirun: ring neighbours and "
           "one random peer each, a TCP connection and full-MTU packets that may not "
           "fragment, in parallel; a failure names the pair and exits 69")
    on = config.data_check and bool(data) and preflight
    return Decision("data check", "on" if on else "off", str(config.source("data_check")),
                    why)


def _launch(config: Config, facts: Facts, data: str | None, ssh_cmd: tuple[str, ...], *,
            rdma: tuple[tuple[str, str], ...] = (), ssh_gate: str | None = None,
            local: tuple[str, ...] = ()) -> mpi.LaunchSpec:
    return mpi.build(mpi.LaunchFacts(
        mpi=facts.mpi, program=config.program, hostfile=config.output_hostfile,
        input_hostfile=facts.hostfile.path, total_slots=facts.hostfile.total_slots,
        np=config.np, np_source=str(config.source("np")),
        control_iface=config.control_iface, data_iface=data, environ=facts.environ,
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
    rdma = data_nics(config, facts, data, decisions)
    # The checks run beside mpirun where the resident supervisor carries them (not
    # --exec): mpirun's ssh is then the gate, where it alone can start ranks
    # (launcher/mpi/gating.py: not the user's own agent, no rank on this pod unseen).
    gate_path = f"{config.state_dir}/{gate.SCRIPT}" if preflight and not config.exec else None
    local = tuple(e.rewritten_to for e in entries if e.rewritten_to not in facts.remote)
    spec = _launch(config, facts, data, ssh_cmd, rdma=rdma, ssh_gate=gate_path, local=local)
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
                data_check=data if check.value == "on" else None,
                published_data={h: r.data for h, r in facts.records.items()
                                if r.data is not None and h in facts.remote}, gate=mode)


def host_entries(config: Config, hostfile: hf.Hostfile, answers: Mapping[str, Answer]
                 ) -> list[HostEntry]:
    """Each host with its address and the name mpirun will use for it."""
    entries = []
    for host in hostfile.hosts:
        lname = lookup_name(host.name, config)
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
