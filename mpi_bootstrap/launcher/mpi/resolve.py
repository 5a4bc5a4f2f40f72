"""The mpirun argv, environment additions and files for a launch: the runtime's rows
(core/runtimes/) read once, in order, against the facts, then the NCCL variables and the
forwarded names. Pure: facts in, spec out; argv lists only, never a shell string
(Horovod #948)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from mpi_bootstrap.core import nccl
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.runtimes.schema import (
    Absent,
    Default,
    EnvDefault,
    Hostfile,
    LaunchExec,
    Note,
    Ranks,
    Refuse,
    Row,
    RshAgent,
)
from mpi_bootstrap.launcher.mpi import agents, env
from mpi_bootstrap.launcher.mpi.command import HOSTFILE_OPTIONS
from mpi_bootstrap.launcher.mpi.launch import LaunchFacts, LaunchSpec
from mpi_bootstrap.launcher.mpi.userwins import Context, Part, apply, context, decision, join


def resolve(facts: LaunchFacts) -> LaunchSpec:
    """The mpirun argv, environment additions and files for `facts.mpi`'s runtime."""
    runtime = facts.mpi.runtime
    c = context(facts)
    rows = join(*(row_part(row, c) for row in runtime.rows), _nccl(c))
    forwarding, forwarded = env.forward(runtime.forward, c, dict(rows.env))
    whole = join(rows, forwarding)
    launcher = facts.program[0] if c.user else facts.mpi.mpirun
    mode, why = whole.gate or (None, "")
    return LaunchSpec(
        argv=(launcher, *whole.args, *_user_tail(c)),
        env_set=dict(whole.env),
        forwarded=tuple(forwarded),
        files=whole.files,
        decisions=whole.decisions,
        wrap=c.user is not None,
        program_index=1 + len(whole.args) + (c.user.program_index - 1 if c.user else 0),
        gate=mode,
        gate_why=why,
    )


def row_part(row: Row, c: Context) -> Part:
    """What one row adds, where its condition holds."""
    if row.when is not None and not row.when(c.facts):
        return Part()
    return READERS[type(row)](row, c)


def _default(row: Default, c: Context) -> Part:
    return apply(_filled(row, c.facts), c)


def _note(row: Note, c: Context) -> Part:
    environ = c.facts.environ
    return (
        decision(f"env {row.var}", environ[row.var], f"env {row.var}", row.reason)
        if row.var in environ
        else Part()
    )


def _absent(row: Absent, c: Context) -> Part:
    return decision(row.setting, "(not added)", "agent default", row.reason)


def _ranks(row: Ranks, c: Context) -> Part:
    f = c.facts
    count = f.np if f.np is not None else f.total_slots
    why = f"from {f.np_source}" if f.np is not None else f"sum of slots in the hostfile ({count})"
    return apply(Default("ranks", (row.flag, str(count)), why, flags=row.flags), c)


def _env_default(row: EnvDefault, c: Context) -> Part:
    if row.var in c.facts.environ:
        return decision(row.var, "(user's)", f"env {row.var}", "user wins")
    value = row.value.format_map(_values(c.facts))
    return join(
        Part(env=((row.var, value),)), decision(row.var, value, "agent default", row.reason)
    )


def _refuse(row: Refuse, c: Context) -> Part:
    value = c.facts.environ.get(row.var, "")
    if c.facts.multi_host and not row.works(value):
        raise ConfigError([f"{row.var}={value!r} (from the image's environment?): {row.why}"])
    return Part()


def _values(f: LaunchFacts) -> dict[str, object]:
    """The facts a row may name in braces (core/runtimes/schema.py)."""
    return {
        "prefix": f.mpi.prefix,
        "control_iface": f.control_iface,
        "startup_timeout": f.startup_timeout,
    }


def _filled(d: Default, f: LaunchFacts) -> Default:
    values = _values(f)
    return dataclasses.replace(
        d, args=tuple(a.format_map(values) for a in d.args), reason=d.reason.format_map(values)
    )


def _hostfile(row: Hostfile, c: Context) -> Part:
    """Point mpirun at the rewritten hostfile, however the user named a hostfile."""
    f, user = c.facts, c.user
    if user is not None and (spelled := user.has(*row.host_flags)):
        why = "user wins: the user's host list chooses the hosts"
        return decision("hostfile", "(not passed)", f"user flag {spelled}", why)
    if user is not None and user.has(*row.flags):
        why = "the user's hostfile argument now names the rewritten copy"
        named = decision("hostfile", f.hostfile, "user flag", why)
    else:
        why = f"rewritten copy of {f.input_hostfile}"
        named = join(
            Part((row.flag, f.hostfile)), decision("hostfile", f.hostfile, "agent default", why)
        )
    why = "pointed at the rewritten hostfile: a default hostfile with the old names would "
    why += "conflict with it"
    return join(
        named,
        *(
            join(
                Part(env=((var, f.hostfile),)),
                decision(f"env {var}", f.hostfile, f"env {var}", why),
            )
            for var in row.env
            if var in f.environ
        ),
    )


def _user_tail(c: Context) -> list[str]:
    """The user's command after argv[0], with hostfile arguments redirected."""
    f = c.facts
    if c.user is None:
        return list(f.program)
    argv = list(f.program[1:])
    for name, index, values in c.user.options:
        if name in HOSTFILE_OPTIONS and values:
            tok = argv[index - 1]
            if "=" in tok:
                argv[index - 1] = tok.split("=", 1)[0] + "=" + f.hostfile
            else:
                argv[index] = f.hostfile
    return argv


def _nccl(c: Context) -> Part:
    """NCCL_SOCKET_IFNAME as the rule says (the user's, or the agent's data NIC, or
    unset), and NCCL_IB_HCA: the RDMA devices behind the data NICs."""
    f = c.facts
    r = f.nccl_rule
    if r.by_agent and r.value is not None:
        why = f"NCCL data on the data interface ({r.why}); control stays on {f.control_iface}"
        told = decision(nccl.SOCKET_IFNAME, r.value, "agent default", why)
        ifname = join(Part(env=((nccl.SOCKET_IFNAME, r.value),)), told)
    elif r.value is not None:
        why = f"user wins: NCCL reads {r.value!r} as written"
        ifname = decision(nccl.SOCKET_IFNAME, "(user's)", f"env {nccl.SOCKET_IFNAME}", why)
    else:
        why = "no data interface (net1, dranet0) found; NCCL picks its own"
        ifname = decision(nccl.SOCKET_IFNAME, "(unset)", "agent default", why)
    return join(ifname, _ib_hca(f))


def _ib_hca(f: LaunchFacts) -> Part:
    if not f.rdma:
        return Part()
    devices = [dev for _, dev in f.rdma]
    seen = "; ".join(f"{where}: {dev}" for where, dev in f.rdma[:4])
    more = f" (+{len(f.rdma) - 4} more)" if len(f.rdma) > 4 else ""
    theirs = nccl.given(f.environ, nccl.IB_HCA)
    if theirs is not None:
        taken = nccl.hca_select(theirs, sorted(set(devices)))
        near = f"the RDMA devices behind the data NICs ({seen}{more})"
        why = f"user wins: of {near} it selects {', '.join(taken)}"
        if not taken:
            why = f"user wins, but WARNING: it selects none of {near}"
        return decision(nccl.IB_HCA, "(user's)", f"env {nccl.IB_HCA}", why)
    value = nccl.ib_hca(devices)
    why = f"the RDMA devices behind the data NICs (sysfs device/infiniband): {seen}{more}; "
    why += "NCCL uses no other HCA in the pod"
    return join(Part(env=((nccl.IB_HCA, value),)), decision(nccl.IB_HCA, value, "detected", why))


# How each kind of row is read (tests/test_plan.py checks that every kind of `Row` has one).
READERS: Mapping[type, Callable[[Any, Context], Part]] = {
    Default: _default,
    Note: _note,
    Absent: _absent,
    Ranks: _ranks,
    Hostfile: _hostfile,
    EnvDefault: _env_default,
    Refuse: _refuse,
    RshAgent: agents.rsh_agent,
    LaunchExec: agents.launch_exec,
}
