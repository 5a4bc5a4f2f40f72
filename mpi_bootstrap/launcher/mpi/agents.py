"""How mpirun reaches the workers: Open MPI's rsh agent and hydra's launcher-exec, each
the launch gate (core/gate.py) where it can hold every rank back (gating.py), else the
agent's own ssh command."""

from __future__ import annotations

import shlex

from mpi_bootstrap.core.model import PlannedFile
from mpi_bootstrap.core.runtimes.schema import Default, LaunchExec, RshAgent
from mpi_bootstrap.launcher.mpi import gating
from mpi_bootstrap.launcher.mpi.userwins import Choice, Context, Part, apply, join, theirs

# Why the launch gate is off when mpirun's ssh is the user's own.
OWN_AGENT = "the user's own ssh agent for mpirun (it would not wait)"
# Runs the launch gate: the agent's first word must exist on every worker too.
GATE_SHELL = "/bin/sh"
SSH_LIKE = frozenset({"rsh", "ssh"})


def rsh_agent(row: RshAgent, c: Context) -> Part:
    """Open MPI: the rsh agent is the gate, or the agent's ssh command."""
    layer, f = row.layer, c.facts
    parts: list[Part] = []
    choice: Choice = (None, "")
    if f.ssh_gate:
        # Through /bin/sh: every daemon is given mpirun's MCA parameters and looks the
        # agent's first word up on its own host, where the gate (the launcher's file) is
        # not: orted then failed, and mpirun waited for it (seen in containers).
        why = "the launch gate: ssh to a worker once its checks passed (core/gate.py), run by a "
        why += "shell every worker has"
        agent = layer.param(row.agent, f"{GATE_SHELL} {f.ssh_gate}", why)
        if theirs(agent, c):
            choice = (None, OWN_AGENT)
        else:
            choice, pins = gating.choose(c, f.mpi.runtime.gate, _plm_why(row, c), _plm_pin(row, c))
            parts += [apply(d, c) for d in pins]
            if choice[0] is not None:
                parts.append(apply(agent, c))
    if choice[0] is None:
        parts.append(
            apply(layer.param(row.agent, " ".join(f.ssh_command), "the agent's ssh settings"), c)
        )
    return join(*parts, Part(gate=choice))


def _plm_why(row: RshAgent, c: Context) -> str | None:
    """Why the plm the user chose (a flag, or a variable the agent does not override)
    may start daemons without ssh, if it may."""
    flag = c.user.mca_value("plm") if c.user else None
    plm = flag if flag is not None else c.facts.environ.get(f"{row.layer.env_prefix}plm")
    if plm is None or (flag is None and not row.layer.reaches(plm)):
        return None  # none, or overridden by the agent's own (the runtime's plm row)
    if plm.strip().startswith("^") or not {p.strip() for p in plm.split(",")} <= SSH_LIKE:
        return f"the user's plm {plm!r} may start daemons without ssh"
    return None


def _plm_pin(row: RshAgent, c: Context) -> tuple[Default, ...]:
    """The agent's plm, where nothing of the user's or the image's environment names one
    (the runtime's plm row added it where a variable names one that cannot work): an MCA
    parameter file may (`plm = isolated` runs a local host's ranks with no daemon to
    wait for)."""
    layer = row.layer
    if "plm" in c.user_mca or f"{layer.env_prefix}plm" in c.facts.environ:
        return ()
    why = f"the launch gate: daemons start over {layer.plm} only, whatever an MCA parameter "
    why += "file says"
    return (Default(f"{layer.flag} plm", (layer.flag, "plm", layer.plm), why, mca=("plm",)),)


def launch_exec(row: LaunchExec, c: Context) -> Part:
    """hydra takes one path for the ssh program, so the options live in a script: the
    launch gate where there is one, else a wrapper."""
    f = c.facts

    def exec_default(value: str, why: str) -> Default:
        full = f"hydra takes a single path: {why}"
        return Default(row.option, (row.option, value), full, flags=row.flags, env=(row.env,))

    choice: Choice = (None, "")
    if f.ssh_gate:
        why = "the launch gate: ssh to a worker once every check passed (core/gate.py)"
        through = exec_default(f.ssh_gate, why)
        pins: tuple[Default, ...] = ()
        if theirs(through, c):
            choice = (None, OWN_AGENT)
        else:
            choice, pins = gating.choose(c, f.mpi.runtime.gate, _launcher_why(row, c))
        if choice[0] is not None:
            return join(*(apply(d, c) for d in pins), apply(through, c), Part(gate=choice))
    wrapper = apply(exec_default(f.ssh_wrapper, "this wrapper adds the agent's ssh options"), c)
    if not wrapper.args:
        return join(wrapper, Part(gate=choice))
    script = (
        "#!/bin/sh\n"
        "# Written by mpi-bootstrap: hydra's launcher-exec takes one path, so the ssh\n"
        "# options the agent needs live here.\n"
        f'exec {shlex.join(f.ssh_command)} "$@"\n'
    )
    return join(
        wrapper,
        Part(
            files=(PlannedFile(f.ssh_wrapper, script, 0o755, "ssh wrapper for hydra", shown=True),),
            gate=choice,
        ),
    )


def _launcher_why(row: LaunchExec, c: Context) -> str | None:
    """Why the launcher the user chose starts proxies without ssh, if it does."""
    given = [v for name in row.launchers for v in (c.user.values(name) if c.user else [])]
    if given and given[0].strip().lower() not in SSH_LIKE:
        return f"the user's launcher {given[0]!r}: hydra starts its proxies without ssh"
    return None
