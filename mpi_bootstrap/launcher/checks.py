"""The checks of the workers before any rank runs. Each worker's own (NCCL's selection on
it, its preflight session, which calls `passed(host)` as it passes: the launch gate lets
mpirun's ssh through to it) are taken as it arrives (launcher/pipeline.py `Each`); then
`across` looks at every worker together (the data network). A check raises a
BootstrapError naming the host at fault (exit 69 as a rule); what it leaves for what
follows goes into the `Job`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap.core import nccl, remote
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.liveness import Claimed
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.remote import Report
from mpi_bootstrap.launcher import nodecheck
from mpi_bootstrap.launcher.model import Plan
from mpi_bootstrap.launcher.remotecheck import RemoteCheck, program_of, ranks_path
from mpi_bootstrap.proc import children
from mpi_bootstrap.proc.spawn import resolve
from mpi_bootstrap.ssh import datacheck

# With no exchange, a refused connection on every try for this long is a setup mistake
# (nothing set the workers' sshd up), not a worker still starting: said within seconds.
NO_EXCHANGE_PATIENCE = 5.0


@dataclasses.dataclass
class Job:
    """What the checks work with, and what they leave: the sessions preflight kept open
    for the data check, and the workers' answers to this launch's claim."""

    p: Plan
    config: Config
    env: Mapping[str, str]
    log: Log
    session: str | None = None  # this launch's key: preflight claims every worker with it
    opened: dict[str, children.Lines] = dataclasses.field(default_factory=dict)
    claims: dict[str, Claimed] = dataclasses.field(default_factory=dict)
    nodes: dict[str, Report] = dataclasses.field(default_factory=dict)  # their reports


def with_doctor(exc: PeerUnavailableError, config: Config) -> PeerUnavailableError:
    """A worker preflight could not pass, with what the doctor finds beside it (DNS, the
    Service, the exchange) in its details."""
    from mpi_bootstrap.doctor import diagnose

    found = diagnose.run(config, deadline_s=5.0, data=False)
    problems = [f.line() for f in found if not f.ok]
    exc.details = "\n".join(
        filter(None, [exc.details, "--- doctor", *(problems or ["(no other problem found)"])])
    )
    return exc


def across(job: Job) -> None:
    """The data network between the workers (ssh/datacheck.py), where the plan checks it,
    in rounds: each worker's first data NIC (in preflight's own sessions), then its
    second, …"""
    p, config = job.p, job.config
    nodes(job)
    for nics in data_rounds(p.data_check):  # later rounds open sessions of their own
        datacheck.run(
            list(nics),
            p.ssh_command,
            nics,
            sysfs=config.sysfs,
            env=job.env,
            deadline=p.deadline,
            log=job.log,
            opened=job.opened,
            reaper=not config.exec,
            published=p.published_data,
            value=p.data_value,
        )
        job.opened = {}


def nccl_job(config: Config, env: Mapping[str, str]) -> bool:
    """Where each worker reports its node (launcher/nodecheck.py nccl_job)."""
    return nodecheck.nccl_job(config.node_checks, env)


def nodes(job: Job) -> None:
    """Each worker's node, as its preflight reported it (launcher/nodecheck.py), and the
    launcher's where it runs ranks too (Trainer v2's runLauncherAsNode)."""
    slots: dict[str, int] = {}
    for e in job.p.hosts:
        slots[e.rewritten_to] = slots.get(e.rewritten_to, 0) + e.slots
    on = set(job.config.node_checks)
    here = [h for h in slots if h not in job.p.remote]
    if here and nccl_job(job.config, job.env):  # the workers reported theirs
        out = children.capture(["sh", "-c", remote.node(job.config.sysfs)], job.env, 10)[1]
        job.nodes[here[0]] = remote.parse(out)
    rule = nccl.Rule(job.p.data_value, "the ranks'")  # what NCCL_SOCKET_IFNAME they get
    bad, warn = nodecheck.problems(job.nodes, slots, job.env, on, rule)
    for w in warn:
        job.log("node check", level="warning", reason=w)
    if bad:
        details = "\n".join(why for _, why in bad[1:])
        raise PeerUnavailableError(bad[0][1], details=details, phase="node check", host=bad[0][0])
    if job.nodes and on:
        job.log("node check ok", workers=len(job.nodes), checks=sorted(on))


def data_rounds(probe: Mapping[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """The data check in rounds: every worker's first data NIC, then its second (where
    it has one), …: in each, a worker has one NIC and probes the others'."""
    most = max((len(nics) for nics in probe.values()), default=0)
    return [{h: nics[i] for h, nics in probe.items() if i < len(nics)} for i in range(most)]


def remote_check(p: Plan, config: Config, env: Mapping[str, str]) -> RemoteCheck:
    """What preflight checks on each worker; the program is resolved here (the launcher's
    filesystem), with the PATH the ranks will get."""
    program = program_of(p.argv, p.program_index)
    path = ranks_path(env, p.forwarded, p.prefix)
    expected = None
    if program:
        expected = (
            program
            if program.startswith("/")
            else resolve(program, path if path is not None else env.get("PATH"))
        )
    auto_none = not config.ex.keyed and config.source("exchange").kind == "default"
    hint = (
        (
            f"no exchange is set up ({config.exchange_reason}); run `mpi-bootstrap worker` "
            "in the worker pods with the same settings as the launcher: mount the MPIJob's "
            "Secret at MPI_BOOTSTRAP_SSH_AUTH_DIR (secret), or set MPI_BOOTSTRAP_TOKEN_FILE "
            "(net) or MPI_BOOTSTRAP_EXCHANGE_DIR (dir) in every pod"
        )
        if auto_none
        else ""
    )
    return RemoteCheck(
        mpi=p.mpi,
        prefix=p.prefix,
        want_ld=env.get("LD_LIBRARY_PATH") if config.ex.keyed else None,
        program=program,
        ranks_path=path,
        expected=expected,
        node=config.sysfs if nccl_job(config, env) else None,
        refused_patience=NO_EXCHANGE_PATIENCE if auto_none else None,
        refused_hint=hint,
    )
