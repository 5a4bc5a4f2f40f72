"""The agent's secrets, and the environment of what it starts (system/environ.py scrubs
them from the agent's own process)."""

from __future__ import annotations

from collections.abc import Mapping

SECRET_VARIABLES = frozenset({"MPI_BOOTSTRAP_TOKEN"})


def public(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the agent's secrets: what a child or an exec may get."""
    return {k: v for k, v in environ.items() if k not in SECRET_VARIABLES}
