"""Which variables reach every rank: the forwarding policy (by name; `*` holds back what
looks like a credential by its name or its value, and what is named is forwarded with a
warning where its value looks like one: core/env.py), and how each runtime's mpirun is
told (its `forward`: core/runtimes/schema.py). No value is ever in an argv or a log."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core.env import (
    CARRIED,
    FORWARD_NAMES,
    FORWARD_PREFIXES,
    looks_secret,
    secret_value,
)
from mpi_bootstrap.core.model import Decision
from mpi_bootstrap.core.names import is_env_name
from mpi_bootstrap.core.runtimes.schema import EachName, Forward
from mpi_bootstrap.core.settings import SETTINGS
from mpi_bootstrap.launcher.mpi.userwins import Context, Part, decision, join

# Always forwarded when set (core/env.py CARRIED), by name (`-x NAME`, value-less).
DEFAULT = ", ".join(c.pattern for c in CARRIED if c.ranks)
# Never forwarded, whatever the user asks: shell functions and OLDPWD break remote shells
# (Horovod's denylist); the agent's own settings may hold secrets (MPI_BOOTSTRAP_TOKEN).
DENY_PREFIXES = ("BASH_FUNC_", "MPI_BOOTSTRAP_")
DENY_NAMES = frozenset({"OLDPWD"})
# What `*` (the launcher's environment) leaves out: the pod's own identity, its operator's
# and its MPI's per-pod or launcher-side variables, Kubernetes' service links, device
# lists, what the agent set for itself; and what looks secret (said: named, it goes).
POD_OWN = re.compile(
    r"HOSTNAME|HOME|USER|LOGNAME|SHELL|PWD|SHLVL|TERM|_|LD_PRELOAD|JOB_(COMPLETION_)?INDEX"
    r"|(KUBERNETES|JOBSET|REPLICATED_JOB|VC|K_MPI|OMPI|PRTE|PMIX|I_MPI|HYDRA|NSS_WRAPPER)_.*"
    r"|.*_(VISIBLE_DEVICES|SERVICE_HOST|SERVICE_PORT.*|PORT_\d+_.*)"
)
AGENT_ENVS = frozenset(e for s in SETTINGS for e in s.envs)  # MPI_HOSTFILE, …


def forwarded_names(
    environ: Mapping[str, str], extra: Sequence[str]
) -> tuple[list[str], list[Decision]]:
    """Names of variables to forward to every rank (values come from mpirun's env)."""
    decisions: list[Decision] = []
    patterns = [(p[:-1], True) for p in extra if p.endswith("*") and p != "*"]
    exact = {p for p in extra if not p.endswith("*")}
    names: list[str] = []
    for name in sorted(environ):
        asked = name in exact or any(name.startswith(prefix) for prefix, _ in patterns)
        link = environ[name].startswith(("tcp://", "udp://", "sctp://"))  # a service's
        mine = "*" in extra and not (POD_OWN.fullmatch(name) or link or name in AGENT_ENVS)
        value = secret_value(environ[name])
        if mine and not asked and (looks_secret(name) or value):
            what = f"its value looks like {value}" if value else "its name looks secret"
            reason = f"{what}: name it in MPI_BOOTSTRAP_FORWARD_ENV to forward it"
            decisions.append(Decision(f"forward {name}", "no", "agent policy", reason))
            continue
        if not (name in FORWARD_NAMES or name.startswith(FORWARD_PREFIXES) or asked or mine):
            continue
        if name in DENY_NAMES or name.startswith(DENY_PREFIXES) or not is_env_name(name):
            if name in exact or any(name.startswith(p) for p, _ in patterns):
                why = "never forwarded (shell state or agent secret)"
                decisions.append(Decision(f"forward {name}", "no", "agent policy", why))
            continue
        if value:  # named, or one of the table's: forwarded, said
            why = (
                f"forwarded, but its value looks like {value}: the MPI's launch message "
                "carries it unencrypted on the pod network (SECURITY.md); mount it as a "
                "Secret in every pod instead"
            )
            decisions.append(Decision(f"forward {name}", "yes (warning)", "agent policy", why))
        names.append(name)
    for name in sorted(exact - set(environ)):
        why = "asked for but not set in the environment"
        decisions.append(Decision(f"forward {name}", "no", "MPI_BOOTSTRAP_FORWARD_ENV", why))
    return names, decisions


ENV_END = "MPI_BOOTSTRAP_ENV_END"  # sentinel that ends mpirun's environment (MPICH)


def forward(how: Forward, c: Context, env_set: Mapping[str, str]) -> tuple[Part, list[str]]:
    """The forwarded names as the runtime's mpirun takes them, and the names it gets."""
    names, decisions = forwarded_names({**c.facts.environ, **env_set}, c.facts.forward_patterns)
    if "*" in c.facts.forward_patterns:
        why = "all but the pod's own, its MPI's and the agent's (docs/configuration.md)"
        decisions.insert(
            0, Decision("forward", "the launcher's environment", c.facts.forward_source, why)
        )
    said = Part(decisions=tuple(decisions))
    if isinstance(how, EachName):
        user = (
            {v.split("=", 1)[0] for v in c.user.values(how.flag.lstrip("-"))} if c.user else set()
        )
        parts = [
            decision(f"{how.flag} {n}", "(user's)", f"user flag {how.flag} {n}", "user wins")
            if n in user
            else Part((how.flag, n))
            for n in names
        ]
        return join(said, *parts), [n for n in names if n not in user]
    spelled = c.user.has(*how.modes) if c.user else None
    if spelled or (how.mode_env and how.mode_env in c.facts.environ):
        return join(
            said,
            decision(
                how.flag,
                "(user's)",
                f"user flag {spelled}" if spelled else f"env {how.mode_env}",
                "user wins: hydra accepts one environment setting; the agent's list is not added",
            ),
        ), []
    if not names:
        return said, names
    listed = join(
        said,
        Part((how.flag, ",".join(names))),
        decision(
            how.flag,
            f"{len(names)} names",
            "agent default",
            f"forward {DEFAULT} and MPI_BOOTSTRAP_FORWARD_ENV by name",
        ),
    )
    if how.last:
        listed = join(
            listed,
            Part(env=((ENV_END, "1"),)),
            decision(f"env {ENV_END}", "1", "agent default", how.last),
        )
    return listed, names
