"""Processes: this package is the only code that starts a process or waits for one.

    signals     which signals PID 1 handles and forwards; what a child starts with
    spawn       posix_spawn with default dispositions; exit codes; 126/127
    children    before the hand-off: children registered, stopped if the agent gives up
    handoff     --exec, or the exec into the resident supervisor
    output      PID 1's stderr, written by a thread from a bounded buffer
    restart     the restart policy of a service child (the worker's sshd), pure
    supervisor  the resident loop: forward, reap, restart, end leftovers
    resident    the resident process's entry point (`python -I -S`, standard library only)

Everything a resident process imports (supervisor, resident and what they import, also
lazily) is standard library or this project's stdlib-only modules: tests/test_pid1.py::
test_resident_imports_only_the_standard_library runs it and checks `sys.modules`.
"""
