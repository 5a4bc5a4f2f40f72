"""mpi-bootstrap: the PID 1 agent that makes mpirun work the first time on Kubernetes."""

__version__ = "0.1.0"
