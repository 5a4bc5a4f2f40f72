"""Processes: with pid1/, the only code that starts a process or waits for one.

    signals     which signals PID 1 handles and forwards; what a child starts with
    spawn       posix_spawn with default dispositions; exit codes; 126/127
    children    before the hand-off: children registered, stopped if the agent gives up
    handoff     --exec, or the exec into the resident supervisor (pid1/)

Standard library only (pid1/ imports signals and spawn).
"""
