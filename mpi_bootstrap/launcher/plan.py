"""The launcher's Plan: a pure function of the config and the gathered facts.

The same Plan drives `--explain` (rendered, then the agent stops) and the real run
(the executor writes its files and starts its argv). Nothing here touches the system.
"""

from __future__ import annotations

import dataclasses
import shlex

from mpi_bootstrap.core import gate, nccl, records
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.model import Decision, PlannedFile
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.launcher import dataplan, hosts, model, mpi, nodecheck
from mpi_bootstrap.launcher.model import Gathered, Plan
from mpi_bootstrap.launcher.sshplan import control_dir, launch_gate, ssh_setup


def data_plan(config: Config, facts: Gathered) -> dataplan.DataPlan:
    """What NCCL will use on the launcher and on each worker, and why (core/nccl.py)."""
    names = facts.ifaces or tuple(sorted(facts.interfaces))
    rule = nccl.rule(config.data_iface, facts.environ, names, DATA_IFACE_CANDIDATES)
    return dataplan.plan(
        rule,
        names,
        control=config.control_iface,
        configured=str(config.source("data_iface")) if config.data_iface else None,
        made=config.ex.made,
        remote=facts.remote,
        recs=facts.records,
        own_rdma=facts.rdma,
    )


def _base_decisions(config: Config, facts: Gathered) -> list[Decision]:
    """Role, MPI, hostfile and rewrite: what every plan starts from."""
    return [
        Decision("role", config.role, str(config.source("role")), "launcher runs mpirun"),
        Decision(
            "mpi",
            f"{facts.mpi.vendor} {facts.mpi.version}",
            facts.mpi.source,
            f"{facts.mpi.mpirun} --version: {facts.mpi.version_line!r}",
        ),
        Decision(
            "hostfile", facts.hostfile.path, str(config.source("hostfile")), facts.hostfile.summary
        ),
        Decision(
            "rewrite",
            config.rewrite,
            str(config.source("rewrite")),
            {
                "none": "names kept as written",
                "fqdn": f"x.svc → x.svc.{config.cluster_domain}",
                "ip": "names replaced by the addresses the DNS wait found",
            }[config.rewrite],
        ),
        *(Decision("note", "", "config", n) for n in config.notes),
        *filter(None, [config.token_decision()]),
    ]


def _control(config: Config, facts: Gathered) -> Decision:
    """Whether the control interface is here."""
    source = str(config.source("control_iface"))
    if config.control_iface not in facts.interfaces:
        return Decision(
            "control interface",
            config.control_iface,
            source,
            f"WARNING: not present here (have: {', '.join(sorted(facts.interfaces))})",
        )
    return Decision(
        "control interface",
        config.control_iface,
        source,
        "ssh and MPI control traffic stay on the pod network",
    )


def _data_check(config: Config, data: dataplan.DataPlan, preflight: bool) -> Decision:
    nics = ", ".join(dict.fromkeys(n for nics in data.probe.values() for n in nics))
    why = (
        "disabled"
        if not config.data_check
        else "needs preflight's ssh sessions (preflight is off or all ranks are local)"
        if not preflight
        else f"no worker has a data NIC beside {config.control_iface}, which preflight crosses"
        if not nics
        else f"the workers test {nics} among themselves before mpirun: ring neighbours and "
        "one random peer each, a TCP connection and full-MTU packets that may not "
        "fragment, in parallel; a failure names the pair and exits 69"
    )
    on = config.data_check and bool(nics) and preflight
    return Decision("data check", "on" if on else "off", str(config.source("data_check")), why)


def _launch(
    config: Config,
    facts: Gathered,
    data: nccl.Rule,
    ssh_cmd: tuple[str, ...],
    *,
    rdma: tuple[tuple[str, str], ...] = (),
    ssh_gate: str | None = None,
    local: tuple[str, ...] = (),
    by_name: tuple[str, ...] = (),
) -> mpi.LaunchSpec:
    return mpi.build(
        mpi.LaunchFacts(
            mpi=facts.mpi,
            program=config.program,
            hostfile=config.output_hostfile,
            input_hostfile=facts.hostfile.path,
            total_slots=facts.hostfile.total_slots,
            np=config.np,
            np_source=str(config.source("np")),
            control_iface=config.control_iface,
            nccl_rule=data,
            environ=facts.environ,
            is_root=facts.is_root,
            ssh_command=ssh_cmd,
            ssh_wrapper=f"{config.state_dir}/ssh-launcher",
            forward_patterns=config.forward_env,
            forward_source=str(config.source("forward_env")),
            startup_timeout=config.startup_timeout,
            multi_host=bool(facts.remote),
            rdma=rdma,
            ssh_gate=ssh_gate,
            local_hosts=local,
            by_name=by_name,
        )
    )


def _run_decisions(
    config: Config, facts: Gathered, data: dataplan.DataPlan
) -> tuple[bool, list[Decision]]:
    """How mpirun is supervised, and whether the workers (and their nodes: an NCCL job's,
    whose environment has NCCL_*, the agent's NCCL_SOCKET_IFNAME included) are checked."""
    how, why = model.supervision(facts.is_pid1, config.exec)
    if how != "exec":
        why += (
            f"; after mpirun exits, leftovers get SIGTERM, then SIGKILL after "
            f"{config.grace_seconds:g} s; the resident supervisor imports only the "
            "standard library"
        )
    preflight = config.preflight and bool(facts.remote)
    return preflight, [
        Decision("supervision", how, str(config.source("exec")), why),
        Decision(
            "preflight",
            "on" if preflight else "off",
            str(config.source("preflight")),
            f"ssh to {len(facts.remote)} workers in parallel: the MPI's daemon is "
            "found and LD_LIBRARY_PATH arrives, else exit 69 before mpirun"
            if preflight
            else "disabled"
            if not config.preflight
            else "no remote workers (all ranks local)",
        ),
        nodecheck.decision(
            config.node_checks,
            str(config.source("node_checks")),
            preflight,
            data.rule.by_agent or nodecheck.nccl_job(config.node_checks, facts.environ),
        ),
    ]


def build_plan(config: Config, facts: Gathered) -> Plan:
    """The Plan: each step below returns its value and the decisions that say why, and
    --explain lists them in the order the steps are taken here; a pipelined one's, the
    Plan it starts mpirun from first (`first plan`)."""
    plan = _plan(config, facts)
    if not (config.explain and plan.pipeline):
        return plan
    return dataclasses.replace(plan, decisions=(*plan.decisions, _first(config, facts, plan)))


def changes(first: Plan, final: Plan) -> list[str]:
    """What of mpirun's launch the Plan of every fact changes from a pipelined launch's
    first Plan."""
    return [
        what
        for what, a, b in (
            ("command", first.argv, final.argv),
            ("environment", first.env_set, final.env_set),
            ("forwarded variables", first.forwarded, final.forwarded),
            ("hostfile", first.hostfile_text, final.hostfile_text),
        )
        if a != b
    ]


def _first(config: Config, facts: Gathered, final: Plan) -> Decision:
    """The Plan a pipelined launch starts mpirun from: that of the first worker in alone
    (here: the hostfile's first remote worker whose record is read), its record the only
    one (the answers as here: they place the hosts, not what mpirun is told)."""
    name = next((h for h in facts.remote if h in facts.records), None)
    if name is None:  # no exchange (nothing a record could change), or none read here
        none = facts.client is None
        value, why = ("mpirun as below", "no exchange") if none else ("?", "no record read here")
        return Decision("first plan", value, "launch order", why)
    alone = dataclasses.replace(facts, records={name: facts.records[name]})
    plan = final if len(facts.records) == 1 else _plan(config, alone)
    if not (changed := changes(plan, final)):
        why = f"from {name}'s record alone: the same as this Plan's"
        return Decision("first plan", "mpirun as below", "launch order", why)
    diff = [f"{k}={v}" for k, v in plan.env_set.items() if final.env_set.get(k) != v]
    return Decision(
        "first plan",
        f"{' and '.join(changed)} differ",
        "launch order",
        f"from {name}'s record alone: {shlex.join(plan.argv)}"
        f"{' with ' + ', '.join(diff) if diff else ''}; where mpirun starts before every "
        "worker is in, a later worker that changes this fails the launch (exit 69)",
    )


def _plan(config: Config, facts: Gathered) -> Plan:
    entries = hosts.host_entries(config, facts.hostfile, facts.answers)
    remote = set(facts.remote)  # not the tuple: `in` it for each of 4,096 hosts took 50 ms
    entries = [e.own_named(remote, facts.own_name) for e in entries]
    text, form = hosts.hostfile(facts, entries, remote)
    data = data_plan(config, facts)
    preflight, run_decisions = _run_decisions(config, facts, data)
    control, reuse = control_dir(config, facts, preflight)
    ssh = ssh_setup(config, facts, entries, control)
    local = tuple(e.rewritten_to for e in entries if e.rewritten_to not in remote)
    by_name = hosts.by_name(facts, entries, remote)
    spec, check, (mode, gate_files, gate_decision) = _mpirun(
        config, facts, (local, by_name), data, preflight=preflight, ssh_cmd=ssh.command
    )
    pipeline, order = _order(config, mode)
    decisions = (
        *_base_decisions(config, facts),
        form,
        data.decisions[0],
        _control(config, facts),
        reuse,
        *ssh.decisions,
        *data.decisions[1:],
        *spec.decisions,
        *run_decisions,
        check,
        gate_decision,
        order,
    )
    files = (*_hostfiles(config, facts, text), *ssh.files, *spec.files, *gate_files)
    done, done_text = _job_done(config, facts)
    return Plan(
        mpi=facts.mpi,
        hosts=tuple(entries),
        hostfile_path=config.output_hostfile,
        hostfile_text=text,
        files=files,
        argv=spec.argv,
        env_set=spec.env_set,
        forwarded=spec.forwarded,
        decisions=decisions,
        wrap=spec.wrap,
        program_index=spec.program_index,
        ssh_command=ssh.command,
        ssh_targets=ssh.targets,
        remote=facts.remote,
        preflight=preflight,
        prefix=_prefix(spec),
        done_file=done,
        done_text=done_text,
        deadline=facts.deadline,
        control_dir=control if ssh.files else None,
        data_check=data.probe if check.value == "on" else {},
        data_value=data.rule.value,
        published_data={h: r.data for h, r in facts.records.items() if r.data and h in remote},
        gate=mode,
        pipeline=pipeline,
    )


def _mpirun(
    config: Config,
    facts: Gathered,
    hosts: tuple[tuple[str, ...], tuple[str, ...]],
    data: dataplan.DataPlan,
    *,
    preflight: bool,
    ssh_cmd: tuple[str, ...],
) -> tuple[mpi.LaunchSpec, Decision, tuple[str | None, list[PlannedFile], Decision]]:
    """mpirun's argv and environment, the data check, and the launch gate; `hosts`: the
    hostfile's hosts of this pod's, and the remote ones mpirun gets by name (Gate.literal)."""
    # The checks run beside mpirun where the resident supervisor carries them (not
    # --exec): mpirun's ssh is then the gate, where it alone can start ranks
    # (launcher/mpi/gating.py: not the user's own agent, no rank on this pod unseen).
    gate_path = f"{config.state_dir}/{gate.SCRIPT}" if preflight and not config.exec else None
    spec = _launch(
        config,
        facts,
        data.rule,
        ssh_cmd,
        rdma=data.rdma,
        ssh_gate=gate_path,
        local=hosts[0],
        by_name=hosts[1],
    )
    check = _data_check(config, data, preflight)
    return spec, check, launch_gate(config, facts, spec, ssh_cmd, preflight)


def _order(config: Config, mode: str | None) -> tuple[bool, Decision]:
    """Whether each worker is taken as soon as it is ready (the launcher's pipeline:
    launcher/pipeline.py) or after every name resolved and every record was read."""
    source = str(config.source("pipeline"))
    why = (
        "disabled: every name resolves and every record is read before the first ssh"
        if not config.pipeline
        else "no launch gate (see above): the checks come first, so every worker is "
        "awaited before them"
        if mode is None
        else "--rewrite ip writes the addresses the DNS wait finds into mpirun's hostfile: "
        "every name must resolve before mpirun starts"
        if config.rewrite == "ip"
        else None
    )
    if why is not None:
        return False, Decision("launch order", "every worker first", source, why)
    then = (
        "its daemon starts through the gate as its checks pass"
        if mode == gate.EACH
        else "mpirun's ssh waits for every check (its ranks start as it connects), and "
        "while a name is not resolved mpirun itself waits for every worker (a name it "
        "found to be this pod would start ranks here without ssh)"
    )
    return True, Decision(
        "launch order",
        "pipelined",
        source,
        "while the others are awaited, each worker is trusted and checked as soon as its "
        f"name resolves and its record is in, and {then}; mpirun starts once the first "
        "worker is in, planned from what is known then (once every worker is in where the "
        "first's record lists RDMA devices: NCCL_IB_HCA names every worker's; a later "
        "worker that would change its command or environment fails the launch, exit 69); "
        "no rank starts before every worker passed every check",
    )


def _hostfiles(config: Config, facts: Gathered, text: str) -> tuple[PlannedFile, ...]:
    """The hostfile mpirun reads, and the input's text beside it."""
    original = f"original text of {facts.hostfile.path}, kept for reference"
    return (
        PlannedFile(f"{config.output_hostfile}.orig", facts.hostfile.text, 0o644, original),
        PlannedFile(config.output_hostfile, text, 0o644, "hostfile for mpirun"),
    )


def _prefix(spec: mpi.LaunchSpec) -> str | None:
    """Open MPI's --prefix in the argv (where preflight looks for its daemon), if any."""
    options = spec.argv[: spec.program_index]
    return next((options[i + 1] for i, a in enumerate(options) if a == "--prefix"), None)


def _job_done(config: Config, facts: Gathered) -> tuple[str | None, str]:
    """The dir exchange's `job-done` and what it says once the job succeeded."""
    if config.ex.shared and config.exchange_dir and facts.client is not None:
        return f"{config.exchange_dir}/{records.DONE_FILE}", records.done_text(
            facts.client.job or "(created at run time)"
        )
    return None, ""
