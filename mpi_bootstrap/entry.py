"""The `mpi-bootstrap` command: terminating signals are blocked before anything else (a
PID 1 drops a signal it has no handler for; cli.run lets them in once their handlers
exist, after the slow imports): docs/pid1.md, "Signals".
"""

from __future__ import annotations

import signal


def main() -> int:
    signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    )
    from mpi_bootstrap.proc import signals

    signals.remember_inherited()  # before the agent ignores anything itself
    from mpi_bootstrap.cli import main as cli_main

    return cli_main()
