"""The data check's program, as it runs on a worker: probe.py (a session: its data NIC,
its port, its probes) and port.py (the port's server), forked by the worker's PID 1
(pid1/dataserve.py). Standard library only."""
