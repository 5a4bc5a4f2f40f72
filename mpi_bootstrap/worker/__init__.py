"""The worker role: keys, a private sshd, the record, then the hand-off to the resident
PID 1; and `mpi-bootstrap probe`, its readinessProbe."""
