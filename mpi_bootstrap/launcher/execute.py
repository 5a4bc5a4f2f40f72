"""Carrying a Plan out (the steps launcher/pipeline.py takes): its files, this launch's
key, mpirun started and ended, and handed to the resident PID 1 (or exec'd). With the
launch gate (core/gate.py) mpirun starts first and the checks run beside it; without it,
the checks come first: docs/architecture.md, "The launch gate".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import NoReturn

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Marker, Peer, Spec
from mpi_bootstrap.core.spec import Monitor as MonitorSpec
from mpi_bootstrap.launcher import checks
from mpi_bootstrap.launcher.model import Plan
from mpi_bootstrap.pid1.monitor import arm
from mpi_bootstrap.proc import children, handoff
from mpi_bootstrap.system import files, netif
from mpi_bootstrap.system.gate import Marks


def ungated(job: checks.Job, watched: MonitorSpec | None) -> NoReturn:
    """Every check passed, no launch gate: mpirun replaces the agent (`--exec`) or is
    started and handed to the resident PID 1 (`watched`: armed already)."""
    p = job.p
    if job.config.exec:
        job.log("mpirun exec", argv=list(p.argv), forwarded=list(p.forwarded))
        handoff.exec_replace(p.argv, job.env)
    job.log("mpirun start", argv=list(p.argv), forwarded=list(p.forwarded))
    handoff.start_and_handoff(dataclasses.replace(spec_of(job), monitor=watched))


def write_files(p: Plan, config: Config, log: Log) -> None:
    """Every file of the plan (in the state directory system/account.py made and holds)."""
    for f in p.files:
        files.atomic_write(f.path, f.text, f.mode)
        log("wrote", level="debug", path=f.path, purpose=f.purpose)
    if p.control_dir is not None:
        files.state_dir(p.control_dir, "the ssh ControlPath directory")


def spec_of(job: checks.Job) -> Spec:
    """What the resident PID 1 is handed, less what only the hand-over knows."""
    p, config = job.p, job.config
    return Spec(
        argv=tuple(p.argv),
        env=dict(job.env),
        role=config.role,
        grace=config.grace_seconds,
        group=config.signal_group,
        log_level=config.log_level,
        log_format=config.log_format,
        explain_failure=True,
        done=Marker(p.done_file, p.done_text) if p.done_file else None,
        termination=config.termination(),
    )


@dataclasses.dataclass
class Gated:
    """mpirun behind the launch gate: its gates' marks (made where a gate may be: `may`),
    and mpirun once started."""

    marks: Marks | None
    started: handoff.Started | None = None

    @classmethod
    def of(cls, job: checks.Job, may: bool) -> Gated:
        return cls(Marks(job.config.state_dir, job.p.remote) if may else None)

    def start(self, job: checks.Job) -> handoff.Started:
        """mpirun started now, in a process group of its own (so that ending it ends its
        gates and ssh clients too)."""
        p = job.p
        self.started = handoff.start(p.argv, job.env, group=True)
        job.log(
            "mpirun start",
            argv=list(p.argv),
            forwarded=list(p.forwarded),
            gate=p.gate,
            pipelined=p.pipeline,
        )
        return self.started


@contextlib.contextmanager
def ending(job: checks.Job, gated: Gated) -> Iterator[None]:
    """The checks beside a gated mpirun: a failed one (any exception) ends mpirun's
    group, then is raised as without the gate."""
    t0 = time.monotonic()
    try:
        yield
    except BaseException as exc:
        if gated.marks is None:  # no gate: mpirun was not started
            raise
        # Exited by itself already (a bad option, say): then it is not the gate that ended
        # it, and what it did is its own to say (its output), not the agent's.
        started = gated.started
        before = children.exited(started.pid) if started is not None else None
        gated.marks.fail()  # the gates that wait exit without connecting: mpirun gives up
        if started is not None:
            _end(job, started, before, exc)
        gated.marks.remove()
        raise
    job.log("checks passed", workers=len(job.p.remote), elapsed_s=round(time.monotonic() - t0, 3))


def _end(job: checks.Job, started: handoff.Started, before: int | None, exc: BaseException) -> None:
    """mpirun ended after a failed check (its gates refused; `before`: the code it had
    exited with by itself), and the log saying so."""
    ended = (
        before
        if before is not None
        else children.end(started.pid, job.config.grace_seconds, patience=GIVE_UP_S)
    )
    failed = f"a check failed ({type(exc).__name__})"
    job.log(
        "mpirun ended",
        level="warning",
        pid=started.pid,
        code=ended,
        reason=f"{failed}: no rank has started (the gate held every one)"
        if before is None
        else f"{failed}; mpirun had exited by itself before, "
        f"with code {before} (its own output says why)",
    )


def hand_over(job: checks.Job, started: handoff.Started, watched: MonitorSpec | None) -> NoReturn:
    """Every check passed: the gated mpirun to the resident PID 1, which watches the
    workers while ranks run (`watched`: armed already; mpirun's late gates still read the
    marks: the resident removes them at the end)."""
    handoff.adopt(
        started,
        dataclasses.replace(
            spec_of(job), gate_dir=os.path.join(job.config.state_dir, gate.DIR), monitor=watched
        ),
    )


def armed(job: checks.Job) -> MonitorSpec | None:
    """What the resident PID 1 watches while ranks run: every worker that answered the
    claim (core/liveness.py), each one's watch armed first, no rank started yet
    (pid1/monitor.py `arm`); None when liveness is off or nobody answered."""
    p, config, session, claims, log = job.p, job.config, job.session, job.claims, job.log
    if session is None or not claims or config.liveness_seconds <= 0:
        if session is not None and config.liveness_seconds > 0:
            log("no liveness", level="warning", reason="no worker answered the claim")
        return None
    known = {h.rewritten_to: h.address for h in p.hosts}
    known.update({host: addr for host, (addr, _) in p.ssh_targets.items()})

    def address(host: str, said: str) -> str:
        """The worker's, or (its watch listens on every address) the one ssh reached."""
        return known.get(host) or said if said in ("0.0.0.0", "::") else said  # noqa: S104

    peers = tuple(
        Peer(host, address(host, c.address), c.port, c.boot, c.sshd_port)
        for host, c in claims.items()
    )
    ipv6 = ":" in peers[0].address
    own = [a for a in netif.addresses(config.control_iface, link_local=False) if (":" in a) == ipv6]
    bind = own[0] if own else ("::" if ipv6 else "0.0.0.0")  # noqa: S104 - no control iface
    watched = MonitorSpec(session, config.liveness_seconds, bind, peers)
    arm(watched, log)
    return watched


# How long mpirun may take to give up by itself once the gates have refused it (its
# launch failed), before it is sent SIGTERM: Open MPI 5 (PRRTE) sent SIGTERM during its
# launch says "Abort is in progress" and waits on, leaving its session directory behind
# when it is then killed (tests/test_gate.py).
GIVE_UP_S = 5.0
