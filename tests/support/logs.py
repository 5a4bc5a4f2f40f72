"""Reading the agent's log: with MPI_BOOTSTRAP_LOG_FORMAT=json (or --log-format json) every
event is one JSON object on a line of its own on stderr, with an "event" key; anything
else on stderr (mpirun's output, sshd's, a rank's) is a line that does not start with "{".
"""

from __future__ import annotations

import json
from typing import Any

Event = dict[str, Any]


def events(text: str, *, partial: bool = False) -> list[Event]:
    """Every event in `text`, in order.

    A line that starts with "{" but is not a JSON object with an "event" is a failure (the
    log is broken), unless `partial`: the text is still being written (a line may be cut
    off), or comes from a program that prints objects of its own; such lines are skipped.
    """
    out: list[Event] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            if partial:
                continue
            raise AssertionError(f"a log line that is not JSON: {line!r}") from None
        if not (isinstance(e, dict) and "event" in e):
            if partial:
                continue
            raise AssertionError(f"a JSON log line without an event: {line!r}")
        out.append(e)
    return out


def named(text: str, name: str, *, partial: bool = False, **match: object) -> list[Event]:
    """The events called `name` whose fields include `match`."""
    return [
        e
        for e in events(text, partial=partial)
        if e["event"] == name and all(e.get(k) == v for k, v in match.items())
    ]


def event(text: str, name: str, *, partial: bool = False, **match: object) -> Event | None:
    """The first event called `name` whose fields include `match`, or None."""
    found = named(text, name, partial=partial, **match)
    return found[0] if found else None


def stamp(event: Event) -> float:
    """An event's time (its ISO "timestamp", UTC), as seconds since the epoch."""
    from datetime import datetime

    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def messages(text: str) -> list[str]:
    """The other lines: what a person reads (the agent's messages, other programs' output)."""
    return [ln for ln in text.splitlines() if ln and not ln.startswith("{")]


def no_rank_started(text: str) -> bool:
    """A failed launch's log says no rank of the program can have started: mpirun either
    never started, or started beside the checks and was ended by the agent before it was
    handed over ("mpirun ended": core/gate.py lets no daemon set complete, and no hydra
    proxy connect, before every check passed). tests/test_gate.py proves the rule with a
    marker per rank on each real MPI."""
    names = [e["event"] for e in events(text, partial=True)]
    if "child adopted" in names or "mpirun exec" in names:
        return False
    return "mpirun start" not in names or "mpirun ended" in names
