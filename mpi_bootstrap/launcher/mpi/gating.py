"""Which launch gate (core/gate.py) a launch can have, a runtime's `Gate`
(core/runtimes/schema.py) saying what holds for it: on only where no rank can start
without mpirun's ssh; elsewhere off (the checks, then mpirun), the plan's `launch gate`
decision saying why: docs/architecture.md, "Where the gate is off" (tests/test_gate.py's
class TestRanksWithoutTheRshAgent).
"""

from __future__ import annotations

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.runtimes.schema import Default, Gate
from mpi_bootstrap.launcher.mpi.userwins import Choice, Context, theirs


def _host_list(c: Context, g: Gate) -> str | None:
    """Why the hosts mpirun starts ranks on may not be the hostfile's, or None."""
    source = theirs(g.host_lists, c)
    return (
        None
        if source is None
        else (
            f"a host list of the user's ({source}): mpirun may start ranks on hosts the "
            "agent did not check, or on this pod without ssh"
        )
    )


def _resolves(c: Context, g: Gate) -> str | None:
    """Why mpirun may take a worker's name for this pod by what DNS answers it, or None."""
    source = theirs(g.resolves, c) if g.resolves else None
    if source is None or source.startswith("env "):  # a value of the env that works
        return None
    return (
        f"{source}: {g.label} may take a worker's name for this pod by a DNS answer the "
        "agent did not check, and start its ranks here without ssh"
    )


def choose(
    c: Context, g: Gate, launcher: str | None, pins: tuple[Default, ...] = ()
) -> tuple[Choice, tuple[Default, ...]]:
    """The gate's mode (or None) and why, and the defaults it needs pinned.

    Each gate waits for its worker's check and one (the last worker's) for every check,
    where a daemon starts on every host before any rank (EACH); every gate waits for
    every check where a remote process starts its ranks as soon as it connects, or where
    daemons may start only on some hosts and no rank can start without one (EVERY); off
    elsewhere. `launcher`: why the user's own launcher may start ranks without ssh, if
    it may; `pins`: what the gate needs besides `g.pins` (the plm where nobody named one).
    """
    why = _host_list(c, g) or launcher or _resolves(c, g)
    local = c.facts.local_hosts[0] if c.facts.local_hosts else None
    if why is None and local and not g.each:
        why = g.local.format(local=local)
    if why is None and g.literal and c.facts.by_name:
        why = (
            f"{c.facts.by_name[0]} has no IPv4 address to give mpirun in its place: mpirun "
            "resolves the name itself, and a second DNS answer naming this pod would start "
            "its ranks here without ssh"
        )
    if why:
        return (None, why), ()
    if not g.each:
        return (gate.EVERY, g.why), pins
    vm = next((source for d in g.fewer if (source := theirs(d, c))), None)
    fewer = f"{vm}: {g.label} may start daemons on some hosts only"
    if vm is not None and local:
        return (
            None,
            f"{fewer}, and {local} in the hostfile is this pod, whose ranks need none",
        ), ()
    if vm is None:
        return (gate.EACH, g.why), (*g.pins, *pins)
    return (
        gate.EVERY,
        f"{fewer}, so each waits for every check; no host of the hostfile "
        "is this pod, so every rank needs one",
    ), (*(p for p in g.pins if p not in g.fewer), *pins)
