"""What every row of the settings table is made of: the Setting and Source types, and
the choices the rows offer. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mpi_bootstrap.core import runtimes

ROLES = ("launcher", "worker", "probe", "doctor")
# Names a secondary "fast" NIC gets: Multus/SR-IOV attaches `net1`, DraNet `dranet0`.
DATA_IFACE_CANDIDATES = ("net1", "dranet0")
REWRITE_MODES = ("none", "fqdn", "ip")
MPI_CHOICES = ("auto", *runtimes.CHOICES)  # auto, openmpi, openmpi4, openmpi5, mpich, intel
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its flag, the variables that may set it (first wins), its default."""

    name: str
    flag: str | None
    envs: tuple[str, ...]
    default: Any
    parse: Callable[[str], Any]
    help: str
    default_text: str = ""  # the default in words, where it is worked out at run time


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a setting's value came from: `default`, `env NAME` or `flag --x`."""

    kind: str  # "default" | "env" | "flag"
    name: str = ""

    def __str__(self) -> str:
        return self.kind if self.kind == "default" else f"{self.kind} {self.name}"
