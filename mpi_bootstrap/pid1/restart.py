"""When a service child (the worker's sshd) dies unexpectedly: restart it after a
backoff, or give up. Pure: the supervisor asks, with the times of the deaths so far."""

from __future__ import annotations

import dataclasses

# The worker's sshd: at most LIMIT restarts in any WINDOW seconds.
LIMIT, WINDOW = 5, 60.0


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Restart after a backoff doubling from `delay` up to `max_delay`, at most `limit`
    restarts in any `window` seconds; one death more gives up (the agent exits 69, so
    that Kubernetes restarts the pod)."""

    limit: int = LIMIT
    window: float = WINDOW
    delay: float = 0.2
    max_delay: float = 5.0

    def after_death(self, deaths: tuple[float, ...], now: float
                    ) -> tuple[tuple[float, ...], float | None]:
        """(the deaths still in the window, this one included; the delay before the
        restart, or None: give up)."""
        recent = (*(t for t in deaths if now - t < self.window), now)
        if len(recent) > self.limit:
            return recent, None
        return recent, min(self.max_delay, self.delay * 2 ** (len(recent) - 1))
