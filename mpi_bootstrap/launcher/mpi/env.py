"""Which variables reach every rank: the forwarding policy, by name, never by value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mpi_bootstrap.core.model import Decision
from mpi_bootstrap.core.names import is_env_name

# Always forwarded when set; prefixes are forwarded by name (`-x NAME`, value-less).
FORWARD_NAMES = ("LD_LIBRARY_PATH", "PATH")
FORWARD_PREFIXES = ("NCCL_", "UCX_", "FI_", "MPIR_CVAR_", "OMPI_MCA_coll_")
# Never forwarded, whatever the user asks: shell functions and OLDPWD break remote shells
# (Horovod's denylist); the agent's own settings may hold secrets (MPI_BOOTSTRAP_TOKEN).
DENY_PREFIXES = ("BASH_FUNC_", "MPI_BOOTSTRAP_")
DENY_NAMES = frozenset({"OLDPWD"})


def forwarded_names(environ: Mapping[str, str], extra: Sequence[str]) -> tuple[
        list[str], list[Decision]]:
    """Names of variables to forward to every rank (values come from mpirun's env)."""
    decisions: list[Decision] = []
    patterns = [(p[:-1], True) for p in extra if p.endswith("*")]
    exact = {p for p in extra if not p.endswith("*")}
    names: list[str] = []
    for name in sorted(environ):
        wanted = (
            name in FORWARD_NAMES
            or name.startswith(FORWARD_PREFIXES)
            or name in exact
            or any(name.startswith(prefix) for prefix, _ in patterns)
        )
        if not wanted:
            continue
        if name in DENY_NAMES or name.startswith(DENY_PREFIXES) or not is_env_name(name):
            if name in exact or any(name.startswith(p) for p, _ in patterns):
                decisions.append(Decision(f"forward {name}", "no", "agent policy",
                                          "never forwarded (shell state or agent secret)"))
            continue
        names.append(name)
    for name in sorted(exact - set(environ)):
        decisions.append(Decision(f"forward {name}", "no", "MPI_BOOTSTRAP_FORWARD_ENV",
                                  "asked for but not set in the environment"))
    return names, decisions
