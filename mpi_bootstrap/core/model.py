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


@dataclasses.dataclass(frozen=True)
class ClientKey:
    path: str  # where ssh will read it
    public: str
    file: PlannedFile | None  # a copy the executor writes (secret, dir), else None
    job: str | None = None  # dir: the job key's fingerprint, which `job-done` names


# Error kinds. "Not yet" kinds are expected while pods start; the others mean the
# resolver itself is broken and waiting is unlikely to help.
NOT_FOUND = "not found"
TEMPORARY = "temporary failure"
NO_NAMESERVER = "no nameserver"
SERVER_FAILURE = "server failure"
OTHER = "error"
TRANSIENT_KINDS = frozenset({NOT_FOUND, TEMPORARY})


@dataclasses.dataclass(frozen=True)
class Answer:
    """One lookup's outcome: addresses, or the kind of error and the resolver's words."""

    name: str
    addresses: tuple[str, ...] = ()
    error_kind: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.addresses)

    @property
    def transient(self) -> bool:
        return self.error_kind in TRANSIENT_KINDS
