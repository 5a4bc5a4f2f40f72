"""Small value types shared by the planner, the MPI builders and the renderers."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Decision:
    """One choice the agent made, shown by `--explain`: what, which value, why."""

    setting: str
    value: str
    source: str  # "default", "env NAME", "flag --x", "user flag …", "detected", …
    reason: str


@dataclasses.dataclass(frozen=True)
class PlannedFile:
    """A file the executor will write (atomically) before starting mpirun."""

    path: str
    text: str
    mode: int
    purpose: str
    shown: bool = False  # may --explain print the text? Never for key material.
