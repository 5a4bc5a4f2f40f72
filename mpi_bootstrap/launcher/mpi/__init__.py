"""MPI detection and the mpirun argv: pure, facts in, argv out. What differs between
runtimes is data, one descriptor each (core/runtimes/); here is how it is read.

    detect.py    which runtime (from `mpirun --version`), or a ConfigError
    command.py   the user's own `mpirun …` in wrap mode
    launch.py    the facts in, the spec out
    resolve.py   the runtime's rows read once, in order, into the spec
    userwins.py  the user wins over each agent default
    agents.py    how mpirun reaches the workers: the launch gate or the agent's ssh
    gating.py    whether the launch gate can hold every rank of this launch, and how
    env.py       which variables reach every rank, and how mpirun is told

Argv lists, never a shell string (Horovod #948). `make lint` forbids this package any
module that performs I/O: facts such as the install prefix come in.
"""

from __future__ import annotations

from mpi_bootstrap.core.runtimes import INTEL, MPICH, ORTE, PRRTE, RUNTIMES
from mpi_bootstrap.launcher.mpi import resolve
from mpi_bootstrap.launcher.mpi.command import HOSTFILE_OPTIONS, scan_user_command
from mpi_bootstrap.launcher.mpi.detect import MPIInfo, identify, is_launcher, overridden
from mpi_bootstrap.launcher.mpi.env import ENV_END, forwarded_names
from mpi_bootstrap.launcher.mpi.launch import LaunchFacts, LaunchSpec

__all__ = [
    "ENV_END",
    "HOSTFILE_OPTIONS",
    "INTEL",
    "MPICH",
    "ORTE",
    "PRRTE",
    "RUNTIMES",
    "LaunchFacts",
    "LaunchSpec",
    "MPIInfo",
    "build",
    "forwarded_names",
    "identify",
    "is_launcher",
    "overridden",
    "scan_user_command",
]

build = resolve.resolve  # the launch spec for `facts.mpi`'s runtime: the plan's name for it
