"""The data check's program, as it runs on a worker: probe.py (a session: its data NIC,
its port, its probes) and port.py (the port's server). The worker's PID 1 forks it
(pid1/dataserve.py), or a worker's Python runs it from its text, sent over the session
(ssh/datacheck.py). Standard library only: it stands alone."""
