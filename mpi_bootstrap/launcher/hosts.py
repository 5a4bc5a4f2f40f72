"""The hosts as mpirun names them: each with its address and the name mpirun uses
(--rewrite), and the hostfile mpirun reads. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.model import Answer, Decision
from mpi_bootstrap.launcher.model import Gathered, HostEntry


def host_entries(
    config: Config, hostfile: hf.Hostfile, answers: Mapping[str, Answer]
) -> list[HostEntry]:
    """Each host with its address and the name mpirun will use for it."""
    entries = []
    for host in hostfile.hosts:
        lname = hf.lookup_name(host.name, config.rewrite, config.cluster_domain)
        answer = answers.get(lname)
        address = answer.addresses[0] if answer and answer.ok else None
        new = address if config.rewrite == "ip" and address else lname
        if ":" in new:  # an IPv6 address: the name had no IPv4 one (system/dns.py)
            raise ConfigError([
                f"MPI_BOOTSTRAP_REWRITE=ip: {host.name} has only an IPv6 address ({address}), "
                "and no MPI takes one in its hostfile (Open MPI 4 and 5 hang, or stop at an "
                "'illegal character' in the node name; hydra's HOST:N reads its colons): "
                "keep the names (MPI_BOOTSTRAP_REWRITE=none or fqdn)"
            ])  # fmt: skip
        entries.append(HostEntry(host.name, address, host.slots, new, host.line))
    return entries


def hostfile(facts: Gathered, entries: list[HostEntry], remote: set[str]) -> tuple[str, Decision]:
    """The hostfile mpirun reads (its names as planned, in its MPI's form), and why.
    Where mpirun resolves every name itself to tell this pod's hosts from the others'
    (hydra: Gate.literal), it reads each remote worker's IPv4 address in its name's
    place: a second DNS answer naming this pod would have it start that worker's ranks
    here, without ssh or a check (SECURITY.md 32); ssh knows the worker by its address
    too (sshplan.py `_peers`)."""
    given = {e.name: e.rewritten_to for e in entries}
    why = f"the form {facts.mpi.vendor} reads"
    if facts.mpi.runtime.gate.literal:
        ips = {
            e.name: e.address
            for e in entries
            if e.rewritten_to in remote and e.address and ":" not in e.address
        }
        given.update(ips)
        if ips:
            why += (
                "; the workers by the IPv4 addresses the agent resolved and checked: "
                f"{facts.mpi.vendor}'s mpirun resolves a name itself to tell this pod's "
                "hosts, and a second DNS answer naming this pod would start that worker's "
                "ranks here without ssh"
            )
    hosts = hf.rename(facts.hostfile, given)
    form = facts.mpi.runtime.hostfile_form
    return hf.render(hosts, form), Decision("hostfile form", form, "detected", why)


def by_name(facts: Gathered, entries: list[HostEntry], remote: set[str]) -> tuple[str, ...]:
    """The remote workers mpirun resolves itself where it should read addresses
    (Gate.literal): those with only an IPv6 address, which no MPI's hostfile takes."""
    literal = facts.mpi.runtime.gate.literal
    return tuple(
        e.rewritten_to
        for e in entries
        if literal and e.rewritten_to in remote and ":" in (e.address or "")
    )
