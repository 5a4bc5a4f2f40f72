"""`mpi-bootstrap doctor`: why a job cannot start, host by host."""
