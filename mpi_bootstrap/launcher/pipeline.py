"""The launch, the one there is: each worker is trusted, checked and let through the gate
as soon as it is ready (its name resolved, its record in: launcher/arrivals.py), while
the others are awaited (`launch order: pipelined`), or every worker at once (`whole`).

    first worker ready → first Plan (the facts so far) → its files, mpirun started
    behind the gate → each worker as it arrives: the ssh config and known_hosts
    rewritten with it, NCCL's selection on it, its preflight session (claim, daemon,
    library path, program; its data check's session kept) → passed: its gate opens
    → every worker in: the Plan of every fact, which must launch the same mpirun → the
    data network across them → `.all`: the ranks start → the resident PID 1.

No rank starts before every check passed; when mpirun starts (the first worker's facts,
or every worker's) and what a later worker may not change: docs/architecture.md,
"Workers as they come".
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable
from typing import NoReturn

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import checks, dataplan, execute, gather
from mpi_bootstrap.launcher.arrivals import Arrivals, Event
from mpi_bootstrap.launcher.hosts import host_entries
from mpi_bootstrap.launcher.model import Gathered, Plan
from mpi_bootstrap.launcher.plan import build_plan, changes, data_plan
from mpi_bootstrap.launcher.session import Session, failure, release, wait_sshd
from mpi_bootstrap.launcher.sshplan import ssh_setup
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import files, parallel


def launch(config: Config, arrivals: Arrivals, log: Log) -> NoReturn:
    """The launch of `arrivals`' workers, as they come or (`Arrivals.whole`) all at once,
    ending in the hand-over (or, with no gate, mpirun started or exec'd after the checks)."""
    try:
        ready = _first(arrivals)
        first = build_plan(config, arrivals.facts())
        execute.write_files(first, config, log)
        env = first.environment(arrivals.base.environ)
        # This launch's key (core/liveness.py): preflight claims every worker with it.
        key = secrets.token_hex(32) if first.preflight and config.ex.keyed else None
        job = checks.Job(first, config, env, log, key)
        gated = execute.Gated.of(job, may=first.gate is not None or not arrivals.at_once)
        marks = gated.marks
        each = Each(job, arrivals, marks.open if marks and first.gate == gate.EACH else None)
        start = Start(job, gated, arrivals, _after_every_worker(each, first, arrivals))
        with execute.ending(job, gated):
            if first.preflight:
                each.run(ready, start)
            elif first.ssh_targets:
                wait_sshd(first.ssh_targets, first.deadline, log)
            if not arrivals.at_once:  # (all at once, the first Plan had every fact)
                job = _final(start.job, arrivals.facts(), each.passed, started=start.done)
            if not start.done and job.p != start.job.p:  # mpirun starts from this Plan
                execute.write_files(job.p, config, log)
            if job.p.gate is not None and not start.done:
                gated.start(job)  # beside the data network's check
            checks.across(job)
            watched = None if config.exec else execute.armed(job)
            if marks is not None and job.p.gate is not None:
                marks.open(gate.ALL)
    finally:
        arrivals.stop.set()
    if gated.started is None:  # no gate: every check passed first
        execute.ungated(job, watched)
    execute.hand_over(job, gated.started, watched)


NAMES, WORKERS = "every name resolved", "every worker in"


class Start:
    """When mpirun starts: at once (the first worker's facts); once every name resolved
    (the Plan of every answer: which hosts are this pod's); or once every worker is in
    (the Plan of every fact, after their checks). `wait`: (why, until which) it waits."""

    def __init__(
        self,
        job: checks.Job,
        gated: execute.Gated,
        arrivals: Arrivals,
        wait: tuple[str, str] | None,
    ) -> None:
        self.job, self.gated, self.arrivals = job, gated, arrivals
        self.until = wait[1] if wait else None
        if wait is None:
            gated.start(job)
        else:
            job.log("mpirun waits", reason=wait[0], until=wait[1])

    @property
    def done(self) -> bool:
        return self.gated.started is not None

    def poll(self) -> None:
        """After each turn of the workers' loop: mpirun started if every name resolved
        and that was all it waited for, planned from every answer."""
        if self.done or self.until != NAMES or not self.arrivals.dns_done:
            return
        job, facts = self.job, self.arrivals.facts()
        plan = build_plan(job.config, facts)
        env = plan.environment(facts.environ)
        if plan.gate is None or (
            checks.remote_check(plan, job.config, env)
            != checks.remote_check(job.p, job.config, job.env)
        ):
            self.until = WORKERS  # the gate is off now, or the checks differ: after them
            job.log("mpirun waits", reason="planned from every answer", until=WORKERS)
            return
        if plan != job.p:
            execute.write_files(plan, job.config, job.log)
        self.job = dataclasses.replace(job, p=plan, env=env)
        self.gated.start(self.job)


def _after_every_worker(each: Each, first: Plan, arrivals: Arrivals) -> tuple[str, str] | None:
    """Why mpirun must wait, if it must, and until when: NCCL_IB_HCA names the RDMA
    devices behind every worker's data NIC (dataplan.py), which may differ from worker
    to worker (SR-IOV functions); the gate is off (every check before mpirun); or every
    gate waits for every check (hydra: a proxy starts its ranks as it connects) while a
    name is not resolved yet: mpirun, resolving it as this pod's before the agent does,
    would start that host's ranks without ssh. (Where gates open one by one, the one
    that waits for every check is a worker's whose name resolved: sshplan.py
    `_holder`.) Every worker in already (`Arrivals.whole`): nothing to wait for."""
    if first.gate is None:
        return (
            "the launch gate is off (see --explain's `launch gate`): every check passes "
            "before mpirun starts",
            WORKERS,
        )
    if arrivals.complete():
        return None
    if any(where != "launcher" for where, _ in each.data.rdma):
        return (
            "the first worker's record lists RDMA devices behind its data NIC: NCCL_IB_HCA "
            "names every worker's, so mpirun starts once every worker is in",
            WORKERS,
        )
    answers = arrivals.answers
    unresolved = [h for h in first.remote if not ((a := answers.get(h)) and a.ok)]
    if first.gate == gate.EVERY and unresolved:
        return (
            f"{some(unresolved)} not resolved yet: every gate waits for every check, and a "
            "name mpirun finds to be this pod would start its ranks here without ssh, so "
            "mpirun starts once every name resolved",
            NAMES,
        )
    return None


def _first(arrivals: Arrivals) -> list[str]:
    """Until a worker is ready (or the wait fails): the workers ready by then (all of
    them, none awaited, where every worker came first)."""
    if arrivals.at_once:
        return list(arrivals.workers)
    while True:
        ready = [new for event in arrivals.wait() for new in arrivals.handle(event)]
        if ready:
            return ready
        _overdue(arrivals, arrivals.base.deadline)


# Past the deadline, each part says what it missed (the DNS wait its unresolved names,
# the records and sessions theirs); only if none has by then is this said.
OVERDUE_S = 5.0


def _overdue(arrivals: Arrivals, deadline: float) -> None:
    if time.monotonic() < deadline + OVERDUE_S:
        return
    late = [w.new for w in arrivals.workers.values() if not w.ready]
    raise PeerUnavailableError(
        f"not ready by the deadline: {some(late) if late else 'the DNS wait'}",
        phase="records",
        host=late[0] if late else None,
    )


class Each:
    """Every worker through its own checks as it arrives; a failure raised at once."""

    def __init__(
        self, job: checks.Job, arrivals: Arrivals, passed: Callable[[str], None] | None
    ) -> None:
        self.job, self.arrivals, self.passed = job, arrivals, passed
        p, config = job.p, job.config
        check = checks.remote_check(p, config, job.env)  # each worker claimed for this launch
        self.check = dataclasses.replace(check, claim=job.session, bound=config.liveness_seconds)
        self.data = data_plan(config, arrivals.facts())  # its rule and the launcher's NICs
        self.sessions: dict[str, Session] = {}
        self.targets: dict[str, tuple[str, int]] = {}
        self.done: set[str] = set()
        self.pool: parallel.Workers[str, None] = parallel.Workers(
            self._one, parallel.SSH_AT_ONCE, "preflight"
        )
        self.started = time.monotonic()
        self.said = arrivals.at_once  # the `records` line (gather.py's, when all at once)

    def run(self, ready: list[str], start: Start) -> None:
        """Until every worker passed; what preflight leaves goes into the job. Once mpirun
        runs (`start`, polled after each turn), a name its Plan took for a worker's that
        resolves to this pod is seen to at once (`_local`)."""
        try:
            while ready or not (self.arrivals.complete() and self.done >= set(self.sessions)):
                if ready:
                    self._trust()
                    self._start(ready)
                    self._records()
                _overdue(self.arrivals, self.job.p.deadline)
                ready = []
                for event in self.arrivals.wait():
                    if event[0] == "checked":
                        self._checked(event)
                    else:
                        ready += self.arrivals.handle(event)
                start.poll()
                if start.done:
                    _local(start.job.p, self.arrivals.local, self.passed)
        except BaseException:
            release(self.sessions.values())
            raise
        n = len(self.sessions)
        self.job.log("preflight ok", workers=n, elapsed_s=round(time.monotonic() - self.started, 3))
        self.job.opened.update({h: s.kept for h, s in self.sessions.items() if s.kept})
        self.job.claims.update({h: s.claimed for h, s in self.sessions.items() if s.claimed})
        self.job.nodes.update({h: s.report for h, s in self.sessions.items() if s.report})

    def _records(self) -> None:
        """Said once, when every worker's record is in (as the launch of every worker
        first says it)."""
        workers = self.arrivals.workers.values()
        if self.arrivals.records and not self.said and all(w.record for w in workers):
            self.said, n = True, len(workers)
            self.job.log("records", exchange=self.job.config.exchange, found=n, remote=n)

    def _trust(self) -> None:
        """The ssh config and known_hosts, rewritten with every worker in so far (ssh
        reads them at its start: a worker's own ssh comes after this)."""
        config, facts = self.job.config, self.arrivals.facts()
        entries = host_entries(config, facts.hostfile, facts.answers)
        ssh = ssh_setup(config, facts, entries, self.job.p.control_dir)
        for f in ssh.files:
            files.atomic_write(f.path, f.text, f.mode)
        self.targets.update(ssh.targets)

    def _start(self, hosts: list[str]) -> None:
        """NCCL's selection on each worker (from its record): one that finds no NIC fails
        the launch, every such one of `hosts` named; then their preflight sessions."""
        config, ws, data = self.job.config, self.arrivals.workers, self.data
        rule, own, iface = data.rule, data.own, config.control_iface
        nics = {h: dataplan.worker(h, rule, ws[h].record, own, iface)[:2] for h in hosts}
        missing = [m for _, m in nics.values() if m is not None]
        if missing and config.data_check:
            raise PeerUnavailableError(
                f"data network: {some(missing)}",
                details="\n".join(missing) if len(missing) > 1 else "",
                phase="data check",
                host=next(h for h, (_, m) in nics.items() if m is not None),
            )
        for host, (found, _) in nics.items():
            self.job.log("worker in", host=host)  # resolved, its record in: trusted now
            then = (
                datacheck.session_command(found[0], config.sysfs, self.job.p.deadline)
                if found and config.data_check
                else None
            )
            self.sessions[host] = Session(
                host,
                list(self.job.p.ssh_command),
                dataclasses.replace(self.check, then=then) if then else self.check,
                self.job.env,
                self.job.log,
                expect_sshd=host in self.targets,
            )
            self.pool.submit(host)

    def _one(self, host: str) -> None:
        """In a pool thread: the worker's session until done; the outcome as an event."""
        try:
            why = self.sessions[host].until_done(
                self.job.p.deadline, self.targets.get(host), self.passed
            )
            self.arrivals.events.put(("checked", host, why))
        except BaseException as exc:
            self.arrivals.events.put(("error", exc, None))

    def _checked(self, event: Event) -> None:
        """A worker's preflight ended: passed, or raised as preflight says its failures."""
        _, host, why = event
        if why is None:
            self.done.add(host)
            self.job.log("worker passed", host=host)  # its gate is open
            return
        exc = failure(self.sessions[host], why)
        raise exc if isinstance(exc, NotSetUpError) else checks.with_doctor(exc, self.job.config)


def _local(first: Plan, local: list[str], passed: Callable[[str], None] | None) -> None:
    """Once mpirun runs, names the first Plan took for workers' that resolved to this pod:
    mpirun runs their ranks here without ssh. Where gates open one by one (ORTE, PRRTE:
    no rank before every daemon reported), the gate that waits for every check is a
    resolved worker's (sshplan.py `_holder`), so nothing starts early: the name's own
    mark is opened (a gate mpirun may still run for it, having resolved it before DNS
    had it, connects to no worker and no rank starts) and the launch goes on. Anywhere
    else (mpirun waits for every worker where a name is unresolved: only a changed DNS
    answer gets here), the launch fails, no rank started."""
    late = sorted(set(first.remote) & set(local))
    if not late:
        return
    if first.gate == gate.EACH and passed is not None:
        for host in late:
            passed(host)
        return
    raise PeerUnavailableError(
        f"pipelined launch: {some(late)} resolves to this pod's own address, so mpirun "
        "runs its ranks here without ssh, but it was planned as a worker; name it by "
        "this pod's hostname, or set MPI_BOOTSTRAP_PIPELINE=off",
        phase="preflight",
        host=late[0],
    )


def _final(
    job: checks.Job, facts: Gathered, passed: Callable[[str], None] | None, *, started: bool
) -> checks.Job:
    """The job with the Plan of every fact. Once mpirun runs, that Plan must launch the
    same mpirun; before, it replaces the first (whose answers were not all in: a name of
    this pod's turns the gate off) wherever the checks the workers passed stay the same."""
    first, config = job.p, job.config
    remote = tuple(new for _, new, _ in gather.remote_hosts(config, facts))
    final = build_plan(config, dataclasses.replace(facts, remote=remote))
    if not started:
        env = final.environment(facts.environ)
        if checks.remote_check(final, config, env) != checks.remote_check(first, config, job.env):
            raise _changed(["program or library path the workers were checked for"], [])
        return dataclasses.replace(job, p=final, env=env)
    _local(first, sorted(set(first.remote) - set(remote)), passed)
    if changed := changes(first, final):
        raise _changed(
            changed, [f"{k}={v}" for k, v in final.env_set.items() if first.env_set.get(k) != v]
        )
    return dataclasses.replace(job, p=final)


def _changed(what: list[str], diff: list[str]) -> PeerUnavailableError:
    return PeerUnavailableError(
        f"pipelined launch: the later workers' records change mpirun's "
        f"{' and '.join(what)} ({some(diff) if diff else 'see --explain'}) from what "
        "the first worker's facts planned: workers of one job should be alike (one pod "
        "template), or set MPI_BOOTSTRAP_PIPELINE=off",
        phase="preflight",
    )
