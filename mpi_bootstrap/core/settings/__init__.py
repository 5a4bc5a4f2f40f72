"""The settings table: every flag and variable the agent reads, its parser and default.

One row per setting (`SETTINGS`: job.py's rows, then agent.py's; base.py has the row's
type and the choices); the command line (core/cmdline.py) and `--help`
(core/helptext.py) are generated from it, and `core.config` reads a run's values through
it. Pure: nothing here reads the system.
"""

from __future__ import annotations

from mpi_bootstrap.core.exchanges import SECRET_SSHD_PORT
from mpi_bootstrap.core.settings import agent, job
from mpi_bootstrap.core.settings.base import (
    DATA_IFACE_CANDIDATES,
    LOG_FORMATS,
    LOG_LEVELS,
    MPI_CHOICES,
    REWRITE_MODES,
    ROLES,
    Setting,
    Source,
)

__all__ = [
    "DATA_IFACE_CANDIDATES",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MPI_CHOICES",
    "REWRITE_MODES",
    "ROLES",
    "SECRET_SSHD_PORT",
    "SETTINGS",
    "Setting",
    "Source",
    "setting",
]

# One row per setting, in the order config reads (and reports) them.
SETTINGS: tuple[Setting, ...] = (*job.ROWS, *agent.ROWS)

_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    return _BY_NAME[name]
