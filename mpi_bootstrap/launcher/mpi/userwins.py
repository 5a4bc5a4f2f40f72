"""The rule every agent default follows: the user wins.

Every agent default can be overridden by the user, either with the same flag in their
own mpirun command (wrap mode) or with the MPI's own environment variable; the user wins
and the plan records why (DeepSpeed #4460). The one exception is a value that cannot
work for a multi-host job (`Default.works`): the agent overrides it and says so.

Reading a row gives a `Part` — the arguments, variables, decisions and files it adds —
and the parts are joined in the rows' order (launcher/mpi/resolve.py): nothing here is
changed after it is made.
"""

from __future__ import annotations

import dataclasses

from mpi_bootstrap.core.model import Decision, PlannedFile
from mpi_bootstrap.core.runtimes.schema import Default
from mpi_bootstrap.launcher.mpi.command import UserCommand, scan_user_command
from mpi_bootstrap.launcher.mpi.detect import is_launcher
from mpi_bootstrap.launcher.mpi.launch import LaunchFacts

# The launch gate's choice: (gate.EACH | gate.EVERY | None (off), why).
Choice = tuple[str | None, str]


@dataclasses.dataclass(frozen=True)
class Context:
    """The facts, and the user's own mpirun command where the program is one (wrap mode)."""

    facts: LaunchFacts
    user: UserCommand | None
    user_mca: frozenset[str]  # the MCA parameters the user's command sets


def context(facts: LaunchFacts) -> Context:
    user = (
        scan_user_command(facts.program, facts.mpi.runtime) if is_launcher(facts.program) else None
    )
    return Context(facts, user, frozenset(user.mca_names()) if user else frozenset())


@dataclasses.dataclass(frozen=True)
class Part:
    """What one row adds to the launch, in order."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # variables for mpirun's environment
    decisions: tuple[Decision, ...] = ()
    files: tuple[PlannedFile, ...] = ()
    gate: Choice | None = None  # the remote launch's row: the launch gate, or why none


def join(*parts: Part) -> Part:
    return Part(
        args=tuple(a for p in parts for a in p.args),
        env=tuple(e for p in parts for e in p.env),
        decisions=tuple(d for p in parts for d in p.decisions),
        files=tuple(f for p in parts for f in p.files),
        gate=next((p.gate for p in reversed(parts) if p.gate is not None), None),
    )


def decision(setting: str, value: str, source: str, reason: str) -> Part:
    return Part(decisions=(Decision(setting, value, source, reason),))


def theirs(d: Default, c: Context) -> str | None:
    """Where the user set `d` so that their setting wins (`user flag --novm`, `env
    OMPI_MCA_plm`), or None."""
    if c.user and (spelled := c.user.has(*d.flags)):
        return f"user flag {spelled}"
    for name in d.mca:
        if name in c.user_mca:
            return f"user flag --mca {name}"
    environ = c.facts.environ
    for var in d.env:  # the first one set: the agent overrides a value that cannot work
        if var in environ:
            works = d.works is None or d.works(environ[var]) or not c.facts.multi_host
            return f"env {var}" if works else None
    return None


def apply(d: Default, c: Context) -> Part:
    """`d`'s arguments unless the user set it, and the decision either way."""
    value = d.args[-1] if len(d.args) > 1 else "on"
    if source := theirs(d, c):
        return decision(
            d.setting, "(user's)", source, f"user wins: agent default {value!r} not added"
        )
    environ = c.facts.environ
    for var in d.env:
        if var in environ:
            return Part(
                d.args,
                decisions=(
                    Decision(
                        d.setting,
                        value,
                        f"env {var}",
                        f"overrides {var}={environ[var]!r} (from the image's environment?): "
                        f"{d.why}; a flag in the command itself would win",
                    ),
                ),
            )
    if d.only_to_override:
        return Part()
    reason = d.reason
    if ignored := [v for v in d.ignored_env if v in environ]:
        mpi = c.facts.mpi
        reason += (
            f"; {', '.join(ignored)} is set but ignored by {mpi.vendor} "
            f"{mpi.version} (mpi-operator #731)"
        )
    return Part(d.args, decisions=(Decision(d.setting, value, "agent default", reason),))
