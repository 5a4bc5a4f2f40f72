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

    def after_death(
        self, deaths: tuple[float, ...], now: float
    ) -> tuple[tuple[float, ...], float | None]:
        """(the deaths still in the window, this one included; the delay before the
        restart, or None: give up)."""
        recent = (*(t for t in deaths if now - t < self.window), now)
        if len(recent) > self.limit:
            return recent, None
        return recent, min(self.max_delay, self.delay * 2 ** (len(recent) - 1))


class Restarts:
    """A service's deaths and when it starts again: the supervisor's "keep the service
    alive" step, its own small state."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.deaths: tuple[float, ...] = ()
        self.at: float | None = None  # when it starts again (the step's timer)
        self.given_up = False

    def died(self, now: float) -> float | None:
        """It died: the delay before it starts again, or None (given up)."""
        self.deaths, delay = self.policy.after_death(self.deaths, now)
        self.at = None if delay is None else now + delay
        self.given_up = delay is None
        return delay

    def due(self, now: float) -> bool:
        """Whether it is time to start it again (once)."""
        if self.at is None or now < self.at:
            return False
        self.at = None
        return True
