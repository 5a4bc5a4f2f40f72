"""The machine the unit tests plan for: CI's (root, no key mounted in ~/.ssh, the token
files below), and the MPIs it is said to have (each as `launcher/mpi` would detect it)."""

import errno
import os

from mpi_bootstrap.core.config import Machine
from mpi_bootstrap.core.tokens import TokenFile
from mpi_bootstrap.launcher import mpi

# The token a Secret volume holds here (and a newline, as `echo` writes it): a value that
# appears in no other input, so that it can be looked for in every output.
FILE_TOKEN = "file-token-0123456789abcdef"  # noqa: S105 - a test job's, not a secret
TOKEN_FILES = {
    "/run/secrets/job/token": TokenFile(f"{FILE_TOKEN}\n".encode(), 0o400, 0, 0),
    "/run/secrets/job/open": TokenFile(FILE_TOKEN.encode(), 0o644, 0, 0),
    "/run/secrets/job/short": TokenFile(b"short\n", 0o400, 0, 0),
    "/run/secrets/job/binary": TokenFile(b"\xff" * 20, 0o400, 0, 0),
}


def read_token_file(path: str) -> TokenFile:
    if path not in TOKEN_FILES:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return TOKEN_FILES[path]


HOST = Machine(euid=0, exists=lambda _path: False, read_token_file=read_token_file)

MPIS = {
    "openmpi4": mpi.MPIInfo(
        mpi.ORTE,
        "4.1.4",
        "/opt/ompi4/bin/mpirun",
        "mpirun (Open MPI) 4.1.4",
        "detected",
        "/opt/ompi4",
    ),
    "openmpi5": mpi.MPIInfo(
        mpi.PRRTE,
        "5.0.11",
        "/opt/ompi5/bin/mpirun",
        "mpirun (Open MPI) 5.0.11",
        "detected",
        "/opt/ompi5",
    ),
    "mpich": mpi.MPIInfo(
        mpi.MPICH,
        "5.0.2",
        "/opt/mpich/bin/mpirun",
        "HYDRA build details:",
        "detected",
        "/opt/mpich",
    ),
    "intel": mpi.MPIInfo(
        mpi.INTEL,
        "2021.18.1",
        "/opt/intel/bin/mpirun",
        "Intel(R) MPI Library for Linux* OS, Version 2021.18.1",
        "detected",
        "/opt/intel",
    ),
}
