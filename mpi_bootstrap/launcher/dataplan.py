"""Which interfaces NCCL will use on each pod, for the plan: the NCCL_SOCKET_IFNAME the
ranks get (core/nccl.py `rule`) applied to the launcher's interfaces and to each worker's,
as its record lists them; what the data check probes there (all but the control
interface, which preflight's ssh crossed); where NCCL would find nothing (exit 69 before
any rank starts); and the RDMA devices behind the data NICs (NCCL_IB_HCA). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core import nccl, records
from mpi_bootstrap.core.model import Decision


@dataclasses.dataclass(frozen=True)
class DataPlan:
    rule: nccl.Rule
    own: tuple[str, ...]  # the launcher's data NICs (NCCL's, less the control interface)
    probe: Mapping[str, tuple[str, ...]]  # worker → the data NICs its check probes
    rdma: tuple[tuple[str, str], ...]  # (where, device) behind the data NICs
    decisions: tuple[Decision, ...]


def no_match(host: str, value: str | None, have: Sequence[str]) -> str:
    """Why NCCL cannot start on `host`: its interfaces and the value that selects none."""
    return (
        f"{host} has no interface {nccl.SOCKET_IFNAME}={value} selects (it has "
        f"{', '.join(have) or 'none'} up with an address): NCCL fails there; attach "
        f"the data network to it, or change {nccl.SOCKET_IFNAME}"
    )


def _launcher(
    configured: str | None, rule: nccl.Rule, names: Sequence[str], control: str
) -> tuple[tuple[str, ...], Decision]:
    """The launcher's data NICs, and the decision saying what the ranks are told."""
    nics, why = rule.select(names)
    source = (
        f"env {nccl.SOCKET_IFNAME}"
        if rule.value and not rule.by_agent
        else configured
        if rule.by_agent and configured
        else "detected"
    )
    head = (
        rule.why
        if not rule.by_agent
        else (
            f"the agent's: {rule.why}, named exactly (left unset, NCCL would take ib*, else "
            "every interface but docker*, lo*, virbr*: the pod network too)"
        )
    )
    how = f" by its own rule ({why})" if rule.value is None else ""
    return nccl.data_of(nics, control), Decision(
        "data interface",
        rule.value or "(unset)",
        source,
        f"{head}; on the launcher NCCL uses {', '.join(nics) or 'nothing'}{how} (of "
        f"{', '.join(names) or 'no interface'})",
    )


def worker(
    host: str, rule: nccl.Rule, rec: records.Record | None, own: Sequence[str], control: str
) -> tuple[tuple[str, ...], str | None, Decision]:
    """One worker's data NICs, why NCCL finds none there (None: it does), its decision.
    Without the list of its interfaces (the secret exchange, an older worker's record)
    it is taken to have the launcher's data NICs: nothing is refused on that guess."""
    if rec is None or rec.ifaces is None:
        return (
            tuple(own),
            None,
            Decision(
                f"data NIC {host}",
                ", ".join(own) or "(none)",
                "as the launcher's",
                "its record lists no interfaces: the data check probes the launcher's data "
                "NICs there"
                if own
                else "its record lists no interfaces: no data check",
            ),
        )
    nics, why = rule.select(rec.ifaces)
    if not nics:
        missing = no_match(host, rule.value, rec.ifaces)
        return (
            (),
            missing,
            Decision(
                f"data NIC {host}", "(none)", "exchange record", f"WARNING: {missing}; exit 69"
            ),
        )
    data = nccl.data_of(nics, control)
    parts = [f"{why}: {', '.join(nics)} of {', '.join(rec.ifaces)}"]
    if rec.data is not None:
        parts.append(f"its record: {rec.data.summary()}")
    parts.append(
        f"the data check probes {', '.join(data)}"
        if data
        else f"only the control interface {control}, which preflight crosses"
    )
    return (
        data,
        None,
        Decision(f"data NIC {host}", ", ".join(nics), "exchange record", "; ".join(parts)),
    )


def plan(
    rule: nccl.Rule,
    names: Sequence[str],
    *,
    control: str,
    configured: str | None,
    made: bool,
    remote: Sequence[str],
    recs: Mapping[str, records.Record],
    own_rdma: Mapping[str, tuple[str, ...]],
) -> DataPlan:
    """The data NICs of the launcher (its interfaces `names`, in NCCL's order) and of
    each remote worker (its record's list; the launcher's where it has none).
    `configured`: where MPI_BOOTSTRAP_DATA_IFACE came from, when it is set; `made`: the
    workers' records are made by the launcher (the secret exchange), not published."""
    own, first = _launcher(configured, rule, names, control)
    decisions = [first]
    rdma = [("launcher", dev) for nic in own for dev in own_rdma.get(nic, ())]
    probe: dict[str, tuple[str, ...]] = {}
    made = made or not recs  # no record at all (no exchange, too): one decision for all
    if made and remote:
        decisions.append(
            Decision(
                "data NICs",
                ", ".join(own) or "(none)",
                "as the launcher's",
                "workers publish no record; each is taken to have the launcher's "
                "interfaces (one that lacks them fails the data check, naming its own)",
            )
        )
    for host in remote:
        rec = recs.get(host)
        data, _, decision = worker(host, rule, rec, own, control)
        if not made:
            decisions.append(decision)
        if data:
            probe[host] = data
        if rec is not None and rec.data is not None and rec.data.nic in data:
            rdma += [(host, dev) for dev in rec.data.rdma]
    return DataPlan(rule, own, probe, tuple(rdma), tuple(decisions))
