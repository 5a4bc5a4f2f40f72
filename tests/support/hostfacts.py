"""The machine the unit tests plan for: CI's (root, no key mounted in ~/.ssh), and the
MPIs it is said to have (each as `launcher/mpi` would detect it)."""

from mpi_bootstrap.core.config import HostFacts
from mpi_bootstrap.launcher import mpi

HOST = HostFacts(euid=0, exists=lambda _path: False)

MPIS = {
    "openmpi4": mpi.MPIInfo(
        "openmpi",
        "4.1.4",
        "orte",
        "/opt/ompi4/bin/mpirun",
        "mpirun (Open MPI) 4.1.4",
        "detected",
        "/opt/ompi4",
    ),
    "openmpi5": mpi.MPIInfo(
        "openmpi",
        "5.0.11",
        "prrte",
        "/opt/ompi5/bin/mpirun",
        "mpirun (Open MPI) 5.0.11",
        "detected",
        "/opt/ompi5",
    ),
    "mpich": mpi.MPIInfo(
        "mpich",
        "5.0.2",
        "hydra",
        "/opt/mpich/bin/mpirun",
        "HYDRA build details:",
        "detected",
        "/opt/mpich",
    ),
    "intel": mpi.MPIInfo(
        "intel",
        "2021.18.1",
        "hydra",
        "/opt/intel/bin/mpirun",
        "Intel(R) MPI Library for Linux* OS, Version 2021.18.1",
        "detected",
        "/opt/intel",
    ),
}
