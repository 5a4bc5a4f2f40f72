"""The pipelined launch: each worker is trusted, checked and let through the launch gate
as soon as it is ready (its name resolved, its record in: launcher/arrivals.py), while
the others are still awaited — the Plan's `launch order: pipelined` (plan.py `_order`).

    first worker ready → first Plan (the facts so far) → its files, mpirun started
    behind the gate → each worker as it arrives: the ssh config and known_hosts
    rewritten with it, NCCL's selection on it, its preflight session (claim, daemon,
    library path, program; its data check's session kept) → passed: its gate opens
    → every worker in: the Plan of every fact, which must launch the same mpirun → the
    data network across them → `.all`: the ranks start → the resident PID 1.

After the last worker is ready only its own part is left: the others' handshakes, checks
and (where the runtime lets one through per worker: core/gate.py EACH) daemons ran while
it was awaited. No rank starts before every check passed: the gate holds them as in the
launch of every worker first (launcher/execute.py), and a failure ends mpirun the same
way. mpirun starts with the first worker's facts — or once every worker is in, where the
first worker's record lists RDMA devices behind its data NIC (NCCL_IB_HCA names every
worker's, and SR-IOV functions differ from node to node): the checks still ride the
wait. A later worker whose facts would change mpirun's command or environment all the
same (RDMA devices where the first had none) fails the launch before any rank starts.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import checks, dataplan, execute, gather, preflight
from mpi_bootstrap.launcher.arrivals import Arrivals, Event
from mpi_bootstrap.launcher.model import Gathered, Plan
from mpi_bootstrap.launcher.plan import build_plan, data_plan, host_entries
from mpi_bootstrap.launcher.session import Session
from mpi_bootstrap.launcher.sshplan import ssh_setup
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import files, parallel


def wanted(config: Config, facts: Gathered) -> bool:
    """Whether the Plan takes the workers as they come (its `launch order`)."""
    return build_plan(config, facts).pipeline


def launch(config: Config, facts: Gathered, log: Log) -> NoReturn:
    """The pipelined launch of `facts` (gather.before_dns's), ending in the hand-over."""
    arrivals = Arrivals(config, facts, log)
    arrivals.start()
    try:
        ready = _first(arrivals)
        first = build_plan(config, arrivals.facts())
        execute.write_files(first, config, log)
        env = first.environment(facts.environ)
        job = checks.Job(first, config, env, log, execute.session_key(first, config))
        gated = execute.Gated.of(job)
        each = Each(job, arrivals, gated.marks.open if first.gate == gate.EACH else None)
        later = _after_every_worker(each)
        if later is None:
            gated.start(job)
        else:
            log("mpirun waits", reason=later)
        with execute.ending(job, gated):
            each.run(ready)
            job = dataclasses.replace(job, p=_final(config, first, arrivals.facts()))
            started = gated.started or gated.start(job)
            checks.run(job, checks.ACROSS)
            gated.marks.open(gate.ALL)
    finally:
        arrivals.stop.set()
    execute.hand_over(job, started)


def _after_every_worker(each: Each) -> str | None:
    """Why mpirun must wait for every worker's record, if it must: NCCL_IB_HCA names the
    RDMA devices behind every worker's data NIC (dataplan.py), which may differ from
    worker to worker (SR-IOV functions)."""
    if any(where != "launcher" for where, _ in each.data.rdma):
        return (
            "the first worker's record lists RDMA devices behind its data NIC: NCCL_IB_HCA "
            "names every worker's, so mpirun starts once every worker is in"
        )
    return None


def _first(arrivals: Arrivals) -> list[str]:
    """Until a worker is ready (or the wait fails): the workers ready by then."""
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
        self.check = dataclasses.replace(checks.remote_check(p, config, job.env), claim=job.session)
        self.data = data_plan(config, arrivals.facts())  # its rule and the launcher's NICs
        self.sessions: dict[str, Session] = {}
        self.targets: dict[str, tuple[str, int]] = {}
        self.done: set[str] = set()
        self.pool: parallel.Workers[str, None] = parallel.Workers(
            self._one, parallel.SSH_AT_ONCE, "preflight"
        )
        self.started = time.monotonic()
        self.said = False  # the `records` line

    def run(self, ready: list[str]) -> None:
        """Until every worker passed; what preflight leaves goes into the job."""
        try:
            while ready or not (self.arrivals.complete() and self.done >= set(self.sessions)):
                if ready:
                    self._trust()
                    for host in ready:
                        self._start(host)
                    self._records()
                _overdue(self.arrivals, self.job.p.deadline)
                ready = []
                for event in self.arrivals.wait():
                    if event[0] == "checked":
                        self._checked(event)
                    else:
                        ready += self.arrivals.handle(event)
        except BaseException:
            preflight.release(self.sessions.values())
            raise
        n = len(self.sessions)
        self.job.log("preflight ok", workers=n, elapsed_s=round(time.monotonic() - self.started, 3))
        self.job.opened.update({h: s.kept for h, s in self.sessions.items() if s.kept})
        self.job.claims.update({h: s.claimed for h, s in self.sessions.items() if s.claimed})

    def _records(self) -> None:
        """Said once, when every worker's record is in (as the launch of every worker
        first says it)."""
        workers = self.arrivals.workers.values()
        if self.arrivals.records and not self.said and all(w.record for w in workers):
            self.said = True
            n = len(workers)
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

    def _start(self, host: str) -> None:
        """NCCL's selection on the worker (from its record), then its preflight."""
        self.job.log("worker in", host=host)  # resolved, its record in: trusted now
        config, rec = self.job.config, self.arrivals.workers[host].record
        nics, missing, _ = dataplan.worker(
            host, self.data.rule, rec, self.data.own, config.control_iface
        )
        if missing is not None and config.data_check:
            raise PeerUnavailableError(f"data network: {missing}", phase="data check", host=host)
        then = (
            datacheck.session_command(sys.executable, nics[0], config.sysfs, self.job.p.deadline)
            if nics and config.data_check
            else None
        )
        check = dataclasses.replace(self.check, then=then) if then else self.check
        self.sessions[host] = Session(
            host,
            list(self.job.p.ssh_command),
            check,
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
        try:
            preflight.raise_failures([host], {host: self.sessions[host]}, {host: why})
        except NotSetUpError:
            raise
        except PeerUnavailableError as exc:
            raise checks.with_doctor(exc, self.job.config) from None


def _final(config: Config, first: Plan, facts: Gathered) -> Plan:
    """The Plan of every fact: the mpirun it launches must be the one started."""
    remote = tuple(new for _, new, _ in gather.remote_hosts(config, facts))
    if remote != first.remote:
        local = sorted(set(first.remote) - set(remote))
        raise PeerUnavailableError(
            f"pipelined launch: {some(local)} resolves to this pod's own address, so mpirun "
            "runs its ranks here without ssh, but it was started taking it for a worker; "
            "name it by this pod's hostname, or set MPI_BOOTSTRAP_PIPELINE=off",
            phase="preflight",
            host=local[0] if local else None,
        )
    final = build_plan(config, dataclasses.replace(facts, remote=remote))
    changed = [
        what
        for what, a, b in (
            ("command", first.argv, final.argv),
            ("environment", first.env_set, final.env_set),
            ("forwarded variables", first.forwarded, final.forwarded),
            ("hostfile", first.hostfile_text, final.hostfile_text),
        )
        if a != b
    ]
    if changed:
        diff = [f"{k}={v}" for k, v in final.env_set.items() if first.env_set.get(k) != v]
        raise PeerUnavailableError(
            f"pipelined launch: the later workers' records change mpirun's "
            f"{' and '.join(changed)} ({some(diff) if diff else 'see --explain'}), "
            "which started with the first worker's facts: workers of one job should be "
            "alike (one pod template), or set MPI_BOOTSTRAP_PIPELINE=off",
            phase="preflight",
        )
    return final
