"""The `mpi-bootstrap` command: terminating signals are blocked before anything else.

A PID 1 drops a signal it has no handler for, so a SIGTERM in the agent's first moments
would be lost and the pod would sit out its whole grace period. Blocked, it waits: the
kernel never discards a blocked signal, and cli.run lets it in once its handler exists,
after the slow imports (the configuration, the role's modules). Only the interpreter's own
start-up remains unprotected (measured by `make bench`: docs/benchmarks.md).
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
