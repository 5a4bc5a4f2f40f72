"""Command line: the one place that maps every failure to an exit status."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError, ConfigError, ExitStatus, signal_exit_status
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.proc import children


def _fail(message: str, details: str = "") -> None:
    sys.stderr.write(f"mpi-bootstrap: {message}\n")
    if details:
        sys.stderr.write(details.rstrip("\n") + "\n")
    sys.stderr.flush()


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run the agent with `argv` (without the program name); return the exit status."""
    if argv and argv[0] in ("-h", "--help"):
        from mpi_bootstrap.core.settings import make_parser

        make_parser().print_help()
        return 0
    if argv and argv[0] == "--version":
        from mpi_bootstrap import __version__

        print(f"mpi-bootstrap {__version__}")
        return 0
    children.install_early_handlers()  # before any slow step
    try:
        from mpi_bootstrap.system import host

        config = Config.from_env(environ, argv, host.facts())
    except ConfigError as exc:
        _fail(exc.message, exc.details)
        return int(exc.status)
    finally:
        # The token now lives in `config` only: out of the environment (and of
        # /proc/self/environ) before anything is started or exec'd (system/environ.py).
        from mpi_bootstrap.system.environ import scrub_process

        scrub_process()

    from mpi_bootstrap.system import log

    log.configure(config.log_format, config.log_level, role=config.role)
    logger = log.get()
    try:
        return _role(config, environ, logger)
    finally:
        # Reached only when the agent is about to exit without a hand-off (a success
        # hands off or execs): what it started and did not hand off must not outlive it.
        stopped = children.end_pending()
        if stopped:
            logger("stopped children", count=stopped)


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


def _role(config: Config, environ: Mapping[str, str], logger: Log) -> int:
    """Run the role; every failure becomes its exit status (core/errors.py's table)."""
    try:
        return _dispatch(config, environ, logger)
    except BootstrapError as exc:
        logger("failed", level="error", error=exc.message, exit_code=int(exc.status))
        _fail(exc.message, exc.details)
        return int(exc.status)
    except children.Interrupted as exc:
        logger("interrupted", level="warning", signal=str(exc),
               exit_code=signal_exit_status(exc.signum))
        return signal_exit_status(exc.signum)
    except Exception as exc:
        logger("internal error", level="error", error=repr(exc),
               exit_code=int(ExitStatus.INTERNAL), traceback=traceback.format_exc())
        _fail(f"internal error: {exc!r} (a bug in mpi-bootstrap; please report it with the "
              "log above)")
        return int(ExitStatus.INTERNAL)


def main() -> int:
    try:
        code = run(sys.argv[1:], os.environ)
    except children.Interrupted as exc:  # before logging was set up
        code = signal_exit_status(exc.signum)
    # Threads of an interrupted fan-out (parallel.map_all) are daemons: nothing waits
    # for them, and end_pending has stopped their children.
    return code
