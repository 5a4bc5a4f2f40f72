"""MPI detection and the mpirun argv, per launch runtime: pure, facts in, argv out.

    detect.py    which MPI (from `mpirun --version`) and its runtime
    command.py   the user's own `mpirun …` in wrap mode
    env.py       which variables reach every rank
    builder.py   what every builder shares; the user wins over each agent default
    openmpi.py   Open MPI 4 (ORTE) and 5 (PRRTE), their differences a table
    hydra.py     MPICH and Intel MPI
    gating.py    whether the launch gate can hold every rank of this launch, and how

Builders return an argv list, never a shell string (Horovod #948). `make lint` forbids
this package any module that performs I/O: facts such as the install prefix come in.
"""

from __future__ import annotations

from mpi_bootstrap.launcher.mpi import hydra, openmpi
from mpi_bootstrap.launcher.mpi.builder import LaunchFacts, LaunchSpec
from mpi_bootstrap.launcher.mpi.command import HOSTFILE_OPTIONS, scan_user_command
from mpi_bootstrap.launcher.mpi.detect import (
    HYDRA,
    INTEL,
    MPICH,
    OPENMPI,
    ORTE,
    PRRTE,
    MPIInfo,
    identify,
    is_launcher,
    parse_version,
)
from mpi_bootstrap.launcher.mpi.env import forwarded_names
from mpi_bootstrap.launcher.mpi.hydra import ENV_END

__all__ = [
    "ENV_END", "HOSTFILE_OPTIONS", "HYDRA", "INTEL", "MPICH", "OPENMPI", "ORTE", "PRRTE",
    "LaunchFacts", "LaunchSpec", "MPIInfo", "build", "forwarded_names", "identify",
    "is_launcher", "parse_version", "scan_user_command",
]


def build(facts: LaunchFacts) -> LaunchSpec:
    """The mpirun argv, environment additions and files for `facts.mpi`."""
    if facts.mpi.runtime == HYDRA:
        return hydra.build(facts)
    return openmpi.build(facts)
