"""The agent's secrets, and the environment of what it starts (system/environ.py scrubs
them from the agent's own process); and the one table of what the job's environment
carries to the workers, from which the forwarded names (launcher/mpi/env.py), ssh's
SendEnv (ssh/sshconfig.py) and sshd's AcceptEnv (ssh/sshd.py) are derived."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Carried:
    pattern: str  # a name, or a prefix ending in `*`
    ranks: bool  # mpirun forwards it to every rank, by name (value-less: `-x NAME`)
    send: bool  # the launcher's ssh sends it to each session (preflight sees it arrive)
    accept: bool  # the worker's sshd takes it from a session's client


CARRIED = (
    Carried("LD_LIBRARY_PATH", ranks=True, send=True, accept=True),  # hydra's proxies need it
    Carried("PATH", ranks=True, send=False, accept=False),  # a session's own PATH stays
    Carried("NCCL_*", ranks=True, send=True, accept=True),
    Carried("UCX_*", ranks=True, send=True, accept=True),
    Carried("FI_*", ranks=True, send=True, accept=True),
    Carried("MPIR_CVAR_*", ranks=True, send=False, accept=False),
    Carried("OMPI_MCA_coll_*", ranks=True, send=False, accept=False),
    # The MPIs' own variables a user's ssh may send to a worker: taken, never sent.
    *(Carried(p, ranks=False, send=False, accept=True) for p in ("OMPI_*", "PRTE_*", "PMIX_*")),
    *(Carried(p, ranks=False, send=False, accept=True) for p in ("I_MPI_*", "HYDRA_*")),
)
SEND_ENV = tuple(c.pattern for c in CARRIED if c.send)
ACCEPT_ENV = tuple(c.pattern for c in CARRIED if c.accept)
FORWARD_NAMES = tuple(c.pattern for c in CARRIED if c.ranks and not c.pattern.endswith("*"))
FORWARD_PREFIXES = tuple(c.pattern[:-1] for c in CARRIED if c.ranks and c.pattern.endswith("*"))

SECRET_VARIABLES = frozenset({"MPI_BOOTSTRAP_TOKEN"})

# The one rule for a name that looks secret, in any case: a variable that `*` does not
# forward unless named (launcher/mpi/env.py), a log key whose value is hidden (core/log.py).
# Credentials' usual names (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASS, MYSQL_PWD,
# GITHUB_PAT, SENTRY_DSN, DOCKER_AUTH_CONFIG, AUTHORIZATION, *_CONNECTION_STRING); not a
# host key, a public key or the path of authorized_keys, which the agent logs.
SECRET_NAME = re.compile(
    r"token|secret|passw|credential|cookie|session_?id|connection_?string|dsn"
    r"|priv(ate)?_?key|api_?key|(?<!host)(?<!public)(?<!authorized)_key|auth(?!ori[sz]ed)"
    r"|(^|_)(pass|pwd|pat)($|_)",
    re.IGNORECASE,
)


# A value that looks like a credential whatever its name: each with what it is, said by
# --explain (docs/configuration.md, "Operators"). Found by the fifth security review of
# SECURITY.md: DATABASE_URL=postgresql://app:PASSWORD@db/prod and its kind.
SECRET_VALUES = (
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@"), "a URL with a password"),
    (
        re.compile(r"(?i)(account|shared_?access)key=|[?&;]sig=|(^|;)\s*(password|pwd)="),
        "a connection string's key or password",
    ),
    (re.compile(r"(?i)^\s*(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}\s*$"), "an HTTP authorization"),
    (re.compile(r"-----BEGIN [A-Z0-9 ]*-----"), "a PEM block"),
    (re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\."), "a JSON web token"),
    (
        re.compile(
            r"^(gh[pousr]_|github_pat_|glpat-|hf_|xox[abpr]-|sk-|AKIA|ASIA)[A-Za-z0-9_-]{12,}"
        ),
        "an API token",
    ),
)


def looks_secret(name: str) -> bool:
    """Whether a variable's or a log key's name looks like a secret's (SECRET_NAME)."""
    return name != "PWD" and SECRET_NAME.search(name) is not None


def secret_value(value: str) -> str | None:
    """What a value looks like if it looks like a credential (SECRET_VALUES), else None."""
    return next((what for pattern, what in SECRET_VALUES if pattern.search(value)), None)


def public(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the agent's secrets: what a child or an exec may get."""
    return {k: v for k, v in environ.items() if k not in SECRET_VARIABLES}
