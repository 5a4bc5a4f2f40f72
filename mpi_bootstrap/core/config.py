"""Configuration: every setting from flag, else environment, else default — read once.

`Config.from_env(environ, argv, host)` is the only reader of the environment and the
command line. It returns a frozen object, reports every bad setting at once (naming the
flag or variable), and records where each value came from so `--explain` can show it.
What it needs to know about the machine (`Machine`) is gathered before and passed in.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mpi_bootstrap.core import nccl, operators, tokens
from mpi_bootstrap.core.cmdline import make_parser, split_role
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.exchanges import EXCHANGES, Exchange
from mpi_bootstrap.core.model import Decision
from mpi_bootstrap.core.names import is_dns_name, is_plain_path
from mpi_bootstrap.core.settings import ROLES, SETTINGS, Source

if TYPE_CHECKING:  # the hand-off's types (8 dataclasses, 4 ms): not for --explain, the doctor
    from mpi_bootstrap.core.spec import Termination


def _no_reader(path: str) -> tokens.TokenFile:
    raise OSError(f"{path}: no file reader was given")


@dataclasses.dataclass(frozen=True)
class Machine:
    """The machine, as far as the config depends on it (`system.host.machine()`)."""

    euid: int
    exists: Callable[[str], bool]  # is there a file at this path (a mounted key)?
    # The token file (MPI_BOOTSTRAP_TOKEN_FILE) as read; OSError or ValueError saying why
    # not. Called for the launcher and the worker only.
    read_token_file: Callable[[str], tokens.TokenFile] = _no_reader
    hostname: str = ""  # the pod's: its default state directory's last part
    creatable: Callable[[str], bool] = lambda path: True  # (system/host.py)


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of one run, frozen; `sources` says where each came from."""

    role: str
    program: tuple[str, ...]
    explain: bool
    json: bool
    hostfile: str
    output_hostfile: str
    dns_wait_seconds: float
    dns_wait_interval: float
    dns_concurrency: int
    rewrite: str
    cluster_domain: str
    control_iface: str
    data_iface: str | None
    mpi: str
    mpirun: str | None
    forward_env: tuple[str, ...]
    np: int | None
    exec: bool
    grace_seconds: float
    signal_group: bool
    liveness_seconds: float
    launcher_grace_seconds: float
    exit_on_launcher_loss: bool
    exchange: str
    exchange_dir: str | None
    exchange_port: int
    token_file: str | None
    token: str | None = dataclasses.field(repr=False)  # a secret: never in repr or logs
    ssh_auth_dir: str
    sshd_port: int | None
    sshd: str
    ssh_server: str  # the worker's: auto | openssh | agent (ssh/server.py)
    ssh_user: str | None
    preflight: bool
    ssh_reuse: bool
    pipeline: bool
    ssh_kex: str | None
    data_check: bool
    node_checks: tuple[str, ...]
    sysfs: str
    startup_timeout: float
    ssh_connect_timeout: int
    state_dir: str
    termination_log: str
    log_format: str
    log_level: str
    sources: Mapping[str, Source]
    notes: tuple[str, ...] = ()
    exchange_reason: str = ""  # why this exchange (`auto` says what it found)
    # Who else may read the token, in its form (core/tokens.py): logged at start, shown
    # by --explain and the doctor. Never the token itself.
    token_warnings: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str], argv: Sequence[str], host: Machine) -> Config:
        """Parse `argv` (without the program name) over `environ`; raise ConfigError."""
        return _build(environ, list(argv), host)

    def source(self, name: str) -> Source:
        return self.sources[name]

    @property
    def ex(self) -> Exchange:
        """The exchange's descriptor (core/exchanges.py): what it does is asked of it."""
        return EXCHANGES[self.exchange]

    def token_decision(self) -> Decision | None:
        """--explain's line on the token (core/tokens.py)."""
        if self.token_file:
            return tokens.decision(
                self.token_file, str(self.source("token_file")), self.token_warnings
            )
        source = self.source("token")
        return tokens.decision(
            None, str(source) if self.token is not None else "default", self.token_warnings
        )

    def termination(self) -> Termination:
        """Where the termination message goes (system/termlog.py): the path, and whether
        to create it (only a path that was set; the default only where it exists)."""
        from mpi_bootstrap.core.spec import Termination

        return Termination(self.termination_log, self.sources["termination_log"].kind != "default")


def _default_state_dir(environ: Mapping[str, str], host: Machine) -> str:
    """/run/mpi-bootstrap/HOSTNAME as root, ~/.mpi-bootstrap/HOSTNAME otherwise, else
    (a read-only root, a HOME of /) /tmp/mpi-bootstrap-UID/HOSTNAME. The hostname keeps
    pods that share /run or a home apart: two PID 1s on one control FIFO ended each
    other's sessions (tests/test_launch_order.py)."""
    home = (environ.get("HOME") or "").rstrip("/")
    base = f"{home}/.mpi-bootstrap" if home and is_plain_path(home) else ""
    last = f"/{host.hostname}" if is_dns_name(host.hostname) else ""
    first = "/run/mpi-bootstrap" if host.euid == 0 else base
    if not first or not host.creatable(first + last):
        first = f"/tmp/mpi-bootstrap-{host.euid}"  # noqa: S108 - held open if need be
    return first + last


def _auto_exchange(values: Mapping[str, Any], host: Machine) -> tuple[str, str]:
    """The exchange `auto` picks, and why (shown by --explain and logged at start)."""
    if values["exchange_dir"]:
        return "dir", "auto: MPI_BOOTSTRAP_EXCHANGE_DIR is set"
    if values["token_file"]:
        return "net", "auto: MPI_BOOTSTRAP_TOKEN_FILE is set"
    if values["token"]:
        return "net", "auto: MPI_BOOTSTRAP_TOKEN is set"
    key = os.path.join(values["ssh_auth_dir"], "id_rsa")
    if host.exists(key):
        return "secret", f"auto: a key is mounted at {key}"
    return "none", (
        f"auto: no key at {key}, no MPI_BOOTSTRAP_EXCHANGE_DIR and no "
        "MPI_BOOTSTRAP_TOKEN_FILE, so the agent sets up no ssh trust and mpirun "
        "relies on the image's own sshd and keys"
    )


@dataclasses.dataclass
class _Draft:
    """A config being built: values so far, where each came from, what is wrong."""

    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: dict[str, Source] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    token_warnings: list[str] = dataclasses.field(default_factory=list)


def _read_settings(d: _Draft, ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Each setting from its flag, else the first variable set, else its default."""
    for s in SETTINGS:
        raw: str | None = None
        src = Source("default")
        flag_value = getattr(ns, s.name, None) if s.flag else None
        if flag_value is not None:
            raw, src = flag_value, Source("flag", s.flag or "")
        else:
            for env in s.envs:
                if env in environ:
                    raw, src = environ[env], Source("env", env)
                    break
        if raw is None:
            d.values[s.name] = s.default
        else:
            try:
                d.values[s.name] = s.parse(raw)
            except ValueError as exc:
                d.problems.append(f"{src.name}: {exc}")
                d.values[s.name] = s.default
        d.sources[s.name] = src


def _legacy_rewrite(d: _Draft) -> None:
    """REWRITE_MPI_HOSTFILE_FQDN=true (the seed scripts' switch) means --rewrite fqdn,
    unless the agent's own setting says otherwise."""
    values, sources = d.values, d.sources
    if values.pop("rewrite_fqdn_legacy") and sources["rewrite"].kind == "default":
        values["rewrite"] = "fqdn"
        sources["rewrite"] = Source("env", "REWRITE_MPI_HOSTFILE_FQDN")
    elif sources["rewrite_fqdn_legacy"].kind != "default" and sources["rewrite"].kind != "default":
        d.notes.append(
            f"REWRITE_MPI_HOSTFILE_FQDN ignored: {sources['rewrite']} "
            f"sets rewrite={values['rewrite']}"
        )
    sources.pop("rewrite_fqdn_legacy")


ROLE_ENV = "MPI_BOOTSTRAP_ROLE"


def given_role(
    role_word: str | None, environ: Mapping[str, str], pod: operators.Pod
) -> tuple[str, Source] | None:
    """The role word on the command line, else MPI_BOOTSTRAP_ROLE (lowercased), else
    what the pod's operator says (core/operators.py: as its word is where that names no
    role, refused), and where it came from; None: not given."""
    if role_word is not None:
        return role_word, Source("flag", role_word)
    if environ.get(ROLE_ENV):
        return environ[ROLE_ENV].strip().lower(), Source("env", ROLE_ENV)
    return (pod.role, pod.source) if pod.role else None


def identify(environ: Mapping[str, str], host: Machine) -> operators.Pod:
    """This pod's operator (core/operators.py), by its hostname: the machine's, else
    HOSTNAME (a unit test's machine has none)."""
    return operators.identify(environ, host.hostname or environ.get("HOSTNAME", ""))


def role_of(argv: Sequence[str], environ: Mapping[str, str], host: Machine) -> str:
    """The role as Config takes it, from the raw input, for what runs where no Config
    could be made (cli.py's exit path); "" when none is given."""
    found = given_role(split_role(list(argv))[1], environ, identify(environ, host))
    return found[0] if found is not None else ""


def _role(d: _Draft, role_word: str | None, environ: Mapping[str, str], pod: operators.Pod) -> str:
    """The role `given_role` finds, checked; "" (and a problem) when none is."""
    found = given_role(role_word, environ, pod)
    if found is None:
        d.problems.append(operators.no_role_advice(pod))
        return ""
    role, source = found
    d.sources["role"] = source
    if source.kind != "flag" and role not in ROLES:
        d.problems.append(
            f"{source.name}: {role!r} is not one of {', '.join(ROLES)} (nor names one): "
            "set MPI_BOOTSTRAP_ROLE"
        )
    return role


def _token(d: _Draft, role: str, host: Machine) -> None:
    """The token: read from MPI_BOOTSTRAP_TOKEN_FILE by the roles that use it (the probe
    and the doctor never need it), or taken from the environment; and who else may read
    it in that form (core/tokens.py)."""
    values, sources = d.values, d.sources
    path, file_src, env_src = values["token_file"], sources["token_file"], sources["token"]
    if path and values["token"]:
        d.problems.append(
            f"{file_src.name}: set this or {env_src.name}, not both (in the "
            "environment, the token is in every process the container starts)"
        )
        return
    if values["token"]:
        d.token_warnings.append(tokens.ENV_EXPOSED)
    if not path or role not in ("launcher", "worker"):
        return
    try:
        found = host.read_token_file(path)
        values["token"] = tokens.from_file(found.data)
    except OSError as exc:
        d.problems.append(f"{file_src.name}: cannot read {path}: {exc.strerror or exc}")
        return
    except ValueError as exc:
        d.problems.append(f"{file_src.name}: {path}: {exc}")
        return
    who = tokens.other_readers(found, host.euid)
    if who:
        d.token_warnings.append(f"the token file {path} {who}: {tokens.file_advice()}")


def _derived(d: _Draft, role: str, environ: Mapping[str, str], host: Machine) -> str:
    """Defaults that depend on other settings or the machine; returns why this exchange."""
    values, sources = d.values, d.sources
    if values["state_dir"] is None:
        values["state_dir"] = _default_state_dir(environ, host)
    if values["ssh_auth_dir"] is None:
        values["ssh_auth_dir"] = os.path.join(environ.get("HOME") or "/root", ".ssh")
    if values["output_hostfile"] is None:
        values["output_hostfile"] = f"{values['state_dir']}/hostfile"
    exchange_reason = f"set by {sources['exchange']}"
    if values["exchange"] == "auto":
        values["exchange"], exchange_reason = _auto_exchange(values, host)
    x = EXCHANGES[values["exchange"]]
    needed = x.needs and (not x.needed_by or role in x.needed_by)
    if needed and not any(values[n] for n in x.needs):
        d.problems.append(f"MPI_BOOTSTRAP_EXCHANGE: {x.name!r} needs {x.needs_what}")
    if values["sshd_port"] is None:
        values["sshd_port"] = x.port
    elif x.port and values["sshd_port"] == 0:
        d.problems.append(
            f"{sources['sshd_port'].name}: the {x.name} exchange needs a fixed "
            "port (no exchange tells the launcher a free one)"
        )
    return exchange_reason


def _operator(d: _Draft, role: str, pod: operators.Pod) -> None:
    """A launcher's defaults from its operator's conventions (core/operators.py):
    Volcano's hostfile of its worker task; Trainer v2's launcher forwarding its own
    environment (docs/configuration.md, "Operators")."""
    values, sources = d.values, d.sources
    if role != "launcher":
        return
    if pod.worker_task and sources["hostfile"].kind == "default":
        values["hostfile"] = f"/etc/volcano/{pod.worker_task}.host"
        sources["hostfile"] = Source("env", f"VC_{pod.worker_task.upper()}_HOSTS")
    if pod.launcher_env and sources["forward_env"].kind == "default":
        values["forward_env"] = ("*",)
        why = "Kubeflow Trainer v2 (trainer.env is in the launcher only)"
        sources["forward_env"] = Source("operator", why)


def _role_checks(d: _Draft, role: str, program: list[str], ns: argparse.Namespace) -> None:
    """What each role needs from the command line."""
    values = d.values
    if ns.json and not ns.explain and role != "doctor":
        d.problems.append("--json: only valid with --explain or doctor")
    if ns.explain and role != "launcher":  # else it would run the role for real
        d.problems.append(f"--explain: only the launcher's (a {role} has no plan to show)")
    if role == "worker" and program:
        d.notes.append(f"worker command {program[0]!r} ignored: the agent runs its own sshd")
    if role == "launcher":
        if not program:
            d.problems.append(
                "launcher: no program given (mpi-bootstrap launcher -- PROGRAM ARGS…)"
            )
        if os.path.normpath(values["hostfile"]) == os.path.normpath(values["output_hostfile"]):
            d.problems.append(
                f"{d.sources['output_hostfile'].name or 'MPI_BOOTSTRAP_OUTPUT_HOSTFILE'}: "
                f"must differ from the input hostfile {values['hostfile']} "
                "(the input is never modified)"
            )


def _build(environ: Mapping[str, str], argv: list[str], host: Machine) -> Config:
    options, role_word, program = split_role(argv)
    ns = make_parser().parse_args(options)
    d = _Draft()
    _read_settings(d, ns, environ)
    _legacy_rewrite(d)
    pod = identify(environ, host)
    role = _role(d, role_word, environ, pod)
    _token(d, role, host)
    exchange_reason = _derived(d, role, environ, host)
    _operator(d, role, pod)
    _role_checks(d, role, program, ns)
    # NCCL's own variables are the user's, forwarded to the ranks: read by the chooser
    # (core/nccl.py), checked here so that a malformed one is a 64 like any setting.
    d.problems.extend(nccl.problems(environ))
    if d.problems:
        raise ConfigError(d.problems)
    return Config(
        role=role,
        program=tuple(program),
        explain=bool(ns.explain),
        json=bool(ns.json),
        sources=d.sources,
        notes=tuple(d.notes),
        exchange_reason=exchange_reason,
        token_warnings=tuple(d.token_warnings),
        **d.values,
    )
