"""The resident PID 1: the supervisor that stays for the whole job, started by the
hand-off as `python -I -S` (proc/handoff.py). Standard library only, lazy imports
included — `make lint` enforces it (import-linter), and tests/test_pid1_conformance.py
checks what a real run loaded."""
