"""Carry a Plan out: write its files, then check the workers (their sshd, preflight, the
data network between them) and run mpirun, supervised by the resident PID 1 (or exec'd).

With the launch gate (core/gate.py) mpirun starts first and the checks run beside it:
each worker that passes is let through the gate, and mpirun is handed to the resident
once every check has passed; a failed check ends mpirun, whose ranks have not started.
Without it (`--exec`, no preflight, the user's own ssh agent), the checks come first.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

from mpi_bootstrap.core import gate
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError, some
from mpi_bootstrap.core.liveness import Claimed
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.spec import Marker, Peer, Spec
from mpi_bootstrap.core.spec import Monitor as MonitorSpec
from mpi_bootstrap.launcher import preflight
from mpi_bootstrap.launcher.model import Plan
from mpi_bootstrap.proc import children, handoff
from mpi_bootstrap.proc.spawn import resolve
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import files, netif
from mpi_bootstrap.system.gate import Marks


def execute(p: Plan, config: Config, environ: Mapping[str, str], log: Log) -> NoReturn:
    """Write the plan's files, then become mpirun (--exec) or its supervisor.

    Neither returns on success: the process image is replaced, and the supervisor
    exits with mpirun's code.
    """
    files.state_dir(config.state_dir)
    for f in p.files:
        files.atomic_write(f.path, f.text, f.mode)
        log("wrote", level="debug", path=f.path, purpose=f.purpose)
    env = p.environment(environ)
    if p.control_dir is not None:
        files.state_dir(p.control_dir, "the ssh ControlPath directory")
    if p.ssh_targets and not p.preflight:
        preflight.wait_sshd(p.ssh_targets, p.deadline, log)
    # This launch's session (core/liveness.py): preflight claims every worker with it.
    session = secrets.token_hex(32) if p.preflight and config.exchange != "none" else None
    spec = Spec(argv=tuple(p.argv), env=dict(env), role=config.role,
                grace=config.grace_seconds, group=config.signal_group,
                log_level=config.log_level, log_format=config.log_format, explain=True,
                done=Marker(p.done_file, p.done_text) if p.done_file else None,
                termination=config.termination())
    if p.gate is not None:
        started, claims = gated(p, config, env, log, session)
        # mpirun's late gates still read the marks: the resident removes them at the end.
        handoff.adopt(started, dataclasses.replace(
            spec, gate_dir=os.path.join(config.state_dir, gate.DIR),
            monitor=monitor(p, config, session, claims, log)))
    claims = checks(p, config, env, log, session=session)
    if config.exec:
        log("mpirun exec", argv=list(p.argv), forwarded=list(p.forwarded))
        handoff.exec_replace(p.argv, env)
    log("mpirun start", argv=list(p.argv), forwarded=list(p.forwarded))
    handoff.start_and_handoff(dataclasses.replace(
        spec, monitor=monitor(p, config, session, claims, log)))


def gated(p: Plan, config: Config, env: Mapping[str, str], log: Log, session: str | None
          ) -> tuple[handoff.Started, Mapping[str, Claimed]]:
    """mpirun started now, in a process group of its own (so that ending it ends its
    gates and ssh clients too), the checks beside it; mpirun once they all passed. A
    failed check ends mpirun's group, then raises as without the gate."""
    marks = Marks(config.state_dir, p.remote)
    started = handoff.start(p.argv, env, group=True)
    log("mpirun start", argv=list(p.argv), forwarded=list(p.forwarded), gate=p.gate)
    t0 = time.monotonic()
    try:
        claims = checks(p, config, env, log, session=session,
                        passed=marks.open if p.gate == gate.EACH else None)
        marks.open(gate.ALL)
    except BaseException as exc:
        # Exited by itself already (a bad option, say): then it is not the gate that
        # ended it, and what it did is its own to say (its output), not the agent's.
        before = children.exited(started.pid)
        marks.fail()  # the gates that wait exit without connecting: mpirun gives up
        ended = before if before is not None else \
            children.end(started.pid, config.grace_seconds, patience=GIVE_UP_S)
        marks.remove()
        failed = f"a check failed ({type(exc).__name__})"
        log("mpirun ended", level="warning", pid=started.pid, code=ended,
            reason=f"{failed}: no rank has started (the gate held every one)"
            if before is None else f"{failed}; mpirun had exited by itself before, "
            f"with code {before} (its own output says why)")
        raise
    log("checks passed", workers=len(p.remote), elapsed_s=round(time.monotonic() - t0, 3))
    return started, claims


def checks(p: Plan, config: Config, env: Mapping[str, str], log: Log, *,
           session: str | None, passed: Callable[[str], None] | None = None
           ) -> Mapping[str, Claimed]:
    """Preflight on every worker (claiming it for `session`), then the data check between
    them (each on when the plan says so); `passed(host)` as each worker's preflight
    passes. A worker where NCCL_SOCKET_IFNAME selects no interface fails first, before
    any ssh. The workers' answers to the claim, by host."""
    if p.data_missing:
        problems = list(p.data_missing.values())
        raise PeerUnavailableError(f"data network: {some(problems)}",
                                   details="\n".join(problems) if len(problems) > 1 else "",
                                   phase="data check", host=next(iter(p.data_missing)))
    result = preflight.Passed({}, {})
    rounds = data_rounds(p.data_check)
    if p.preflight:
        check = dataclasses.replace(remote_check(p, config, env), claim=session)
        # Each worker's preflight session goes on to run its first data NIC's check.
        then = {h: datacheck.session_command(sys.executable, nic, config.sysfs, p.deadline)
                for h, nic in (rounds[0] if rounds else {}).items()}
        try:
            result = preflight.run(p.remote, p.ssh_command, check, env=env,
                                   deadline=p.deadline, log=log,
                                   targets=p.ssh_targets or None, passed=passed, then=then)
        except NotSetUpError:
            raise  # said all there is to say; DNS and the Service are beside the point
        except PeerUnavailableError as exc:
            from mpi_bootstrap.doctor import diagnose

            found = diagnose.run(config, deadline_s=5.0, data=False)
            problems = [f.line() for f in found if not f.ok]
            exc.details = "\n".join(filter(None, [
                exc.details, "--- doctor", *(problems or ["(no other problem found)"])]))
            raise
    opened = result.opened
    for nics in rounds:  # a second data NIC's sessions are new ones (rare: several NICs)
        datacheck.run(list(nics), p.ssh_command, nics, python=sys.executable,
                      sysfs=config.sysfs, env=env, deadline=p.deadline, log=log,
                      opened=opened, reaper=not config.exec, published=p.published_data,
                      value=p.data_value)
        opened = {}
    return result.claims


def data_rounds(probe: Mapping[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """The data check in rounds: every worker's first data NIC, then its second (where
    it has one), …: in each, a worker has one NIC and probes the others'."""
    most = max((len(nics) for nics in probe.values()), default=0)
    return [{h: nics[i] for h, nics in probe.items() if i < len(nics)} for i in range(most)]


def monitor(p: Plan, config: Config, session: str | None, claims: Mapping[str, Claimed],
            log: Log) -> MonitorSpec | None:
    """What the resident PID 1 watches while ranks run: every worker that answered the
    claim (core/liveness.py); None when liveness is off or nobody answered."""
    if session is None or not claims or config.liveness_seconds <= 0:
        if session is not None and config.liveness_seconds > 0:
            log("no liveness", level="warning", reason="no worker answered the claim")
        return None
    known = {h.rewritten_to: h.address for h in p.hosts}
    known.update({host: addr for host, (addr, _) in p.ssh_targets.items()})

    def address(host: str, said: str) -> str:
        """The worker's, or (its watch listens on every address) the one ssh reached."""
        return known.get(host) or said if said in ("0.0.0.0", "::") else said  # noqa: S104

    peers = tuple(Peer(host, address(host, c.address), c.port, c.boot, c.sshd_port)
                  for host, c in claims.items())
    ipv6 = ":" in peers[0].address
    own = [a for a in netif.addresses(config.control_iface, link_local=False)
           if (":" in a) == ipv6]
    bind = own[0] if own else ("::" if ipv6 else "0.0.0.0")  # noqa: S104 - no control iface
    return MonitorSpec(session, config.liveness_seconds, bind, peers)


# How long mpirun may take to give up by itself once the gates have refused it (its
# launch failed), before it is sent SIGTERM: Open MPI 5 (PRRTE) sent SIGTERM during its
# launch says "Abort is in progress" and waits on, leaving its session directory behind
# when it is then killed (tests/test_gate.py).
GIVE_UP_S = 5.0


# With no exchange, a refused connection on every try for this long is a setup mistake
# (nothing set the workers' sshd up), not a worker still starting: said within seconds.
NO_EXCHANGE_PATIENCE = 5.0


def remote_check(p: Plan, config: Config, env: Mapping[str, str]) -> preflight.RemoteCheck:
    """What preflight checks on each worker; the program is resolved here (the launcher's
    filesystem), with the PATH the ranks will get."""
    program = preflight.program_of(p.argv, p.program_index)
    path = preflight.ranks_path(env, p.forwarded, p.prefix)
    expected = None
    if program:
        expected = program if program.startswith("/") else \
            resolve(program, path if path is not None else env.get("PATH"))
    auto_none = config.exchange == "none" and config.source("exchange").kind == "default"
    hint = (f"no exchange is set up ({config.exchange_reason}); run `mpi-bootstrap worker` "
            "in the worker pods with the same settings as the launcher: mount the MPIJob's "
            "Secret at MPI_BOOTSTRAP_SSH_AUTH_DIR (secret), or set MPI_BOOTSTRAP_TOKEN_FILE "
            "(net) or MPI_BOOTSTRAP_EXCHANGE_DIR (dir) in every pod") if auto_none else ""
    return preflight.RemoteCheck(
        mpi=p.mpi, prefix=p.prefix,
        want_ld=env.get("LD_LIBRARY_PATH") if config.exchange != "none" else None,
        program=program, ranks_path=path, expected=expected,
        refused_patience=NO_EXCHANGE_PATIENCE if auto_none else None, refused_hint=hint)
