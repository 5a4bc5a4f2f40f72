"""The MPI runtimes the agent launches, one descriptor each (schema.py): Open MPI 4 (ORTE)
and 5 (PRRTE) in openmpi.py, MPICH's and Intel MPI's hydra in hydra.py. What a descriptor
is for, and a fifth runtime: docs/architecture.md, "One descriptor per MPI runtime".
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
