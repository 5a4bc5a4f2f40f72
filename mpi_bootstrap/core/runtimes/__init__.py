"""The MPI runtimes the agent launches, one descriptor each (schema.py): Open MPI 4 (ORTE)
and 5 (PRRTE) in openmpi.py, MPICH's and Intel MPI's hydra in hydra.py.

A descriptor is all the agent knows of a runtime: launcher/mpi/detect.py picks one from
`mpirun --version` (or MPI_BOOTSTRAP_MPI), or fails naming what it saw, and everything
after asks the descriptor's fields — launcher/mpi/resolve.py reads its rows into the
mpirun argv, preflight looks for its daemons, the plan writes its hostfile form. Only
detection and these modules tell runtimes apart by name (tests/test_owners.py). Data,
in core: the settings table and the resident PID 1's failure explainer read them too.

A fifth runtime is one more `Runtime` in RUNTIMES (tests/test_plan.py, class
TestAFifthRuntime, plans one defined in the test alone).
"""

from __future__ import annotations

from mpi_bootstrap.core.runtimes.hydra import INTEL, MPICH
from mpi_bootstrap.core.runtimes.openmpi import ORTE, PRRTE
from mpi_bootstrap.core.runtimes.schema import Runtime

RUNTIMES: tuple[Runtime, ...] = (ORTE, PRRTE, MPICH, INTEL)
# MPI_BOOTSTRAP_MPI's values besides `auto`, in the order --help lists them.
CHOICES = tuple(dict.fromkeys(c for r in RUNTIMES for c in r.choices))
# Every program mpirun may start on a worker over ssh: the doctor looks for all of them,
# and the failure explainer reads them in ssh's and the shell's words.
DAEMONS = tuple(dict.fromkeys(d for r in RUNTIMES for d in r.daemons))

__all__ = ["CHOICES", "DAEMONS", "INTEL", "MPICH", "ORTE", "PRRTE", "RUNTIMES", "Runtime"]
