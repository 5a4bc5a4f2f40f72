"""Facts about this machine that the config depends on, gathered once before it is built."""

from __future__ import annotations

import os

from mpi_bootstrap.core.config import HostFacts


def facts() -> HostFacts:
    return HostFacts(euid=os.geteuid(), exists=os.path.exists)
