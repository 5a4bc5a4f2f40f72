"""Command line: the one place that maps every failure to an exit status."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from mpi_bootstrap.core.config import Config, role_of
from mpi_bootstrap.core.errors import (
    BootstrapError,
    ConfigError,
    ExitStatus,
    printable,
    signal_exit_status,
)
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.termination import DEFAULT_PATH
from mpi_bootstrap.proc import children, subreaper

TERMINATION_VAR = "MPI_BOOTSTRAP_TERMINATION_LOG"


def _fail(message: str, details: str = "") -> None:
    """The failure for a person: one line, then its details (the DNS dump holds the
    hostfile, resolv.conf, /etc/hosts and the resolver's and nameservers' words; a
    preflight failure, ssh's last line) — escaped, whoever wrote them."""
    sys.stderr.write(f"mpi-bootstrap: {printable(message, lines=False)}\n")
    if details:
        sys.stderr.write(printable(details.rstrip("\n")) + "\n")
    sys.stderr.flush()


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run the agent with `argv` (without the program name); return the exit status."""
    if argv and argv[0] in ("-h", "--help", "--help-all", "--version"):
        return _say(argv[0])
    children.install_early_handlers()  # before any slow step
    config = _config(argv, environ)
    if isinstance(config, int):
        return config
    from mpi_bootstrap.system import log

    log.configure(config.log_format, config.log_level, role=config.role)
    logger = _Tracked(log.get())
    main_role = config.role in ("launcher", "worker") and not config.explain
    # (--exec: mpirun becomes this process and would inherit the flag; tini reaps there)
    if main_role and not config.exec and os.getpid() != 1:
        # Before the first child (mpirun starts before the hand-off): an orphan it makes
        # at once re-parents here, not to the host's init (proc/subreaper.py).
        subreaper.become()
    code, phase, error, at = 0, "", "", None
    try:
        code, phase, error, at = _role(config, environ, logger)
        return code
    finally:
        # Reached only when the agent is about to exit without a hand-off (a success
        # hands off or execs): what it started and did not hand off must not outlive it,
        # nor what re-parented to it (ssh's ControlMaster daemons).
        stopped = children.end_pending()
        if subreaper.is_set() and os.getpid() != 1:
            stopped += children.end_adopted()
        if stopped:
            logger("stopped children", count=stopped)
        if main_role and code != 0:
            where = config.termination()
            phase = phase or f"after {logger.last or 'start'}"
            _terminated(
                where.path, where.create, config.role, code, phase=phase, error=error, host=at
            )


def _say(word: str) -> int:
    """--help, --help-all, --version: said on stdout, exit 0."""
    if word == "--version":
        from mpi_bootstrap import __version__

        print(f"mpi-bootstrap {__version__}")
        return 0
    from mpi_bootstrap.core import helptext

    sys.stdout.write(helptext.full() if word == "--help-all" else helptext.short())
    return 0


def _config(argv: Sequence[str], environ: Mapping[str, str]) -> Config | int:
    """The configuration, read once; else its exit status, said (and, for a pod's main
    process, written where Kubernetes shows it)."""
    from mpi_bootstrap.system import host

    machine = host.machine()
    try:
        return Config.from_env(environ, argv, machine)
    except ConfigError as exc:
        _fail(exc.message, exc.details)
        role = role_of(argv, environ, machine)
        # A pod's main process (a launcher, a worker, or one that found no role: it says
        # so as itself). The flags could not be read: the variable's path.
        if "--explain" not in argv and role in ("launcher", "worker", ""):
            path = environ.get(TERMINATION_VAR, DEFAULT_PATH)
            _terminated(
                path if path.startswith("/") else "",
                TERMINATION_VAR in environ,
                role,
                int(exc.status),
                phase=exc.phase,
                error=exc.message,
                host=None,
            )
        return int(exc.status)
    finally:
        # The token now lives in `config` only: out of the environment (and of
        # /proc/self/environ) before anything is started or exec'd (system/environ.py).
        from mpi_bootstrap.system.environ import scrub_process

        scrub_process()


def _dispatch(config: Config, environ: Mapping[str, str], logger: Log) -> int:
    """The role's own entry point (imported lazily: `--explain` and the probe start fast)."""
    if config.role == "launcher":
        from mpi_bootstrap.launcher import main as launcher

        return launcher.main(config, environ, logger)
    if config.role == "doctor":
        from mpi_bootstrap.doctor import diagnose

        return diagnose.main(config, config.json)
    from mpi_bootstrap.worker import main as worker

    if config.role == "probe":
        return worker.probe(config)
    for note in config.notes:
        logger("note", note=note)
    return worker.start(config, environ, logger)


def _role(
    config: Config, environ: Mapping[str, str], logger: Log
) -> tuple[int, str, str, str | None]:
    """Run the role; every failure becomes its exit status (core/errors.py's table).
    Returns (status, phase, error, host at fault) for the termination message."""
    try:
        return _dispatch(config, environ, logger), "", "", None
    except BootstrapError as exc:
        logger("failed", level="error", error=exc.message, exit_code=int(exc.status))
        _fail(exc.message, exc.details)
        return int(exc.status), exc.phase, exc.message, exc.host
    except children.Interrupted as exc:
        code = signal_exit_status(exc.signum)
        logger("interrupted", level="warning", signal=str(exc), exit_code=code)
        return code, "", f"ended by {exc}", None
    except Exception as exc:
        logger(
            "internal error",
            level="error",
            error=repr(exc),
            exit_code=int(ExitStatus.INTERNAL),
            traceback=traceback.format_exc(),
        )
        _fail(
            f"internal error: {exc!r} (a bug in mpi-bootstrap; please report it with the log above)"
        )
        return int(ExitStatus.INTERNAL), "", f"internal error: {exc!r}", None


class _Tracked:
    """The Log, remembering the last event: the phase an interrupted run was in."""

    def __init__(self, log: Log) -> None:
        self.log, self.last = log, ""

    def __call__(self, event: str, /, level: str = "info", **keys: Any) -> None:
        self.last = event
        self.log(event, level, **keys)


def _terminated(
    path: str, create: bool, role: str, code: int, *, phase: str, error: str, host: str | None
) -> None:
    """The reason, where Kubernetes shows it (core/termination.py); never fails."""
    from mpi_bootstrap.core import termination
    from mpi_bootstrap.system import termlog

    termlog.write(
        path,
        termination.text(role=role, code=code, phase=phase, error=error, host=host),
        create=create,
    )


def main() -> int:
    try:
        code = run(sys.argv[1:], os.environ)
    except children.Interrupted as exc:  # before logging was set up
        code = signal_exit_status(exc.signum)
    # Threads of an interrupted fan-out (parallel.map_all) are daemons: nothing waits
    # for them, and end_pending has stopped their children.
    return code
