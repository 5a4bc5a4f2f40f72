"""Carry a Plan out: write its files, wait for the workers' sshd, preflight them, test
the data network between them, then hand mpirun to the resident supervisor (or exec
it)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import NotSetUpError, PeerUnavailableError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import preflight
from mpi_bootstrap.launcher.plan import Plan
from mpi_bootstrap.proc import handoff
from mpi_bootstrap.proc.spawn import resolve
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import files


def execute(p: Plan, config: Config, environ: Mapping[str, str], log: Log) -> int:
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
    opened = {}
    if p.preflight:
        check = remote_check(p, config, env)
        if p.data_check:  # the same session goes on to run the data check's program
            check = dataclasses.replace(check, then=datacheck.session_command(
                sys.executable, p.data_check, config.sysfs, p.deadline))
        try:
            opened = preflight.run(p.remote, p.ssh_command, check, env=env,
                                   deadline=p.deadline, log=log,
                                   targets=p.ssh_targets or None)
        except NotSetUpError:
            raise  # said all there is to say; DNS and the Service are beside the point
        except PeerUnavailableError as exc:
            from mpi_bootstrap.doctor import diagnose

            found = diagnose.run(config, deadline_s=5.0, data=False)
            problems = [f.line() for f in found if not f.ok]
            exc.details = "\n".join(filter(None, [
                exc.details, "--- doctor", *(problems or ["(no other problem found)"])]))
            raise
    if p.data_check:
        datacheck.run(p.remote, p.ssh_command, p.data_check, python=sys.executable,
                      sysfs=config.sysfs, env=env, deadline=p.deadline, log=log,
                      opened=opened, reaper=not config.exec, published=p.published_data)
    if config.exec:
        log("mpirun exec", argv=list(p.argv), forwarded=list(p.forwarded))
        handoff.exec_replace(p.argv, env)
    log("mpirun start", argv=list(p.argv), forwarded=list(p.forwarded))
    handoff.start_and_handoff(p.argv, env, grace=config.grace_seconds,
                              group=config.signal_group, role=config.role,
                              log_level=config.log_level, log_format=config.log_format,
                              done_file=p.done_file, done_text=p.done_text, explain=True)
    raise AssertionError("unreachable: handoff replaces the process")


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
            "Secret at MPI_BOOTSTRAP_SSH_AUTH_DIR (secret), or set MPI_BOOTSTRAP_TOKEN "
            "(net) or MPI_BOOTSTRAP_EXCHANGE_DIR (dir) in every pod") if auto_none else ""
    return preflight.RemoteCheck(
        mpi=p.mpi, prefix=p.prefix,
        want_ld=env.get("LD_LIBRARY_PATH") if config.exchange != "none" else None,
        program=program, ranks_path=path, expected=expected,
        refused_patience=NO_EXCHANGE_PATIENCE if auto_none else None, refused_hint=hint)
