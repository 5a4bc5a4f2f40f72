"""System effects before the hand-off: files written atomically, DNS lookups, network
interfaces, the process environment, the fan-out threads, logging."""
