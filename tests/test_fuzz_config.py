"""Fuzz target: the configuration (core/config.py, core/settings/). Any environment and
argv give a well-typed frozen Config or a ConfigError (64). The rule every fuzz target
follows, and the shared strategies: tests/support/strategies.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
from collections.abc import Callable, Mapping

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import names
from mpi_bootstrap.core import settings as cfg
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError, ExitStatus
from mpi_bootstrap.core.exchanges import EXCHANGES
from tests.support.machine import FILE_TOKEN, HOST, TOKEN_FILES
from tests.support.strategies import fuzz, outcome, tainted

pytestmark = pytest.mark.timeout(120)


ENV_NAMES = sorted(
    {e for s in cfg.SETTINGS for e in s.envs} | {"MPI_BOOTSTRAP_ROLE", "K_MPI_JOB_ROLE", "HOME"}
)
FLAGS = sorted(s.flag for s in cfg.SETTINGS if s.flag)
PLAUSIBLE = [
    "",
    "0",
    "1",
    "-1",
    "65535",
    "65536",
    "2.5",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "-0",
    "1_000",
    " 7 ",
    "٣",
    "9" * 5000,
    "true",
    "False",
    " yes ",
    "off",
    "maybe",
    "auto",
    "none",
    "fqdn",
    "ip",
    "secret",
    "dir",
    "net",
    "IP",
    "openmpi5",
    "json",
    "debug",
    "/tmp/x",
    "/etc/mpi/hostfile",
    "/tmp/mpi-hostfile",
    "cluster.local",
    "Cluster.Local.",
    "-bad.",
    "eth0",
    "eth0\n",
    "net1",
    "a" * 16,
    "root",
    "Root",
    "NCCL_*,FOO BAR",
    "1NCCL",
    "*",
    "launcher",
    " Worker ",
    "probe",
    "doctor",
    "\udcff",
    "tok-\udcff-0123456789abcdef",
]
env_text = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=30
)
env_values = st.one_of(st.sampled_from(PLAUSIBLE), env_text, tainted(st.sampled_from(PLAUSIBLE)))
GOOD_EXTRA = {
    "MPI_BOOTSTRAP_ROLE": [*cfg.ROLES, " Worker "],
    "K_MPI_JOB_ROLE": list(cfg.ROLES),
    "HOME": ["/root", "/tmp/home", ""],
    "MPI_BOOTSTRAP_TOKEN": ["s3cret-token-0123456789", "x" * 64],
    "MPI_BOOTSTRAP_TOKEN_FILE": [*TOKEN_FILES, "/run/secrets/job/missing"],
}


def _accepts(setting: cfg.Setting, value: str) -> bool:
    try:
        setting.parse(value)
    except ValueError:
        return False
    return True


# Per variable, the PLAUSIBLE values its setting accepts: only a bias towards valid
# configurations, so deep paths are reached; the oracle is EXPECTED below.
GOOD: dict[str, st.SearchStrategy[str]] = {
    **{
        env: st.sampled_from([v for v in PLAUSIBLE if _accepts(s, v)])
        for s in cfg.SETTINGS
        for env in s.envs
    },
    **{env: st.sampled_from(values) for env, values in GOOD_EXTRA.items()},
}
GOOD_FLAG = {s.flag: GOOD[s.envs[0]] for s in cfg.SETTINGS if s.flag}


@st.composite
def environs(draw: st.DrawFn) -> dict[str, str]:
    chosen = draw(st.lists(st.sampled_from(ENV_NAMES), unique=True, max_size=6))
    return {env: draw(GOOD[env] if draw(st.integers(0, 4)) else env_values) for env in chosen}


argv_tokens = st.one_of(
    st.sampled_from(
        [
            *FLAGS,
            *cfg.ROLES,
            "--explain",
            "--json",
            "--",
            "-",
            "--exp",
            "--host",
            "--help",
            "-h",
            "--np=0",
            "--hostfile=/x",
            "--exec",
        ]
    ),
    st.sampled_from(PLAUSIBLE),
    st.text(max_size=12),
)


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    """Either any tokens, or the usual shape: options, a role, maybe `--`, a program."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.lists(argv_tokens, max_size=10))
    out: list[str] = []
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=3)):
        value = draw(GOOD_FLAG[flag] if draw(st.integers(0, 4)) else env_values)
        out += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    out += draw(st.sampled_from([[], [], ["--explain"], ["--explain", "--json"], ["--json"]]))
    out.append(draw(st.sampled_from(cfg.ROLES)))
    if draw(st.booleans()):
        out.append("--")
    return out + draw(st.lists(argv_tokens, min_size=1, max_size=3))


def _is_plain_path(v: object) -> bool:
    """Directories whose paths end up in ssh and sshd configs: plain and absolute."""
    return type(v) is str and names.is_plain_path(v)


def _is_path(v: object) -> bool:
    return type(v) is str and v != "" and "\0" not in v


def _finite(low: float, *, strict: bool = False) -> Callable[[object], bool]:
    return lambda v: type(v) is float and math.isfinite(v) and (v > low if strict else v >= low)


def _int_in(low: int, high: float) -> Callable[[object], bool]:
    return lambda v: type(v) is int and low <= v <= high


def _one_of(choices: tuple[str, ...]) -> Callable[[object], bool]:
    return lambda v: v in choices


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or check(v)


def _iface(v: object) -> bool:
    return type(v) is str and re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", v) is not None


def _token(v: object) -> bool:
    # netx.derive_key encodes the token: a lone surrogate (a non-UTF-8 byte in the Secret,
    # surrogate-escaped by os.environ) would crash the exchange, not fail config.
    return (
        type(v) is str
        and len(v) >= 16
        and v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == v
    )


# What each setting holds after Config.from_env, whatever the input (README "Settings").
EXPECTED: dict[str, Callable[[object], bool]] = {
    "hostfile": _is_path,
    "output_hostfile": _is_path,
    "dns_wait_seconds": _finite(0),
    "dns_wait_interval": _finite(0, strict=True),
    "dns_concurrency": _int_in(1, math.inf),
    "rewrite": _one_of(cfg.REWRITE_MODES),
    "cluster_domain": lambda v: (
        type(v) is str and names.is_dns_name(v) and v == v.lower() and not v.endswith(".")
    ),
    "control_iface": _iface,
    "data_iface": _optional(_iface),
    "mpi": _one_of(cfg.MPI_CHOICES),
    "mpirun": _optional(_is_path),
    "forward_env": lambda v: (
        type(v) is tuple
        and all(type(p) is str and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", p) for p in v)
    ),
    "np": _optional(_int_in(1, math.inf)),
    "startup_timeout": _finite(0),
    "ssh_connect_timeout": _int_in(1, math.inf),
    "exec": lambda v: type(v) is bool,
    "grace_seconds": _finite(0),
    "signal_group": lambda v: type(v) is bool,
    # 0 (off) or a bound of at least 3 s: pings go once a second (core/liveness.py)
    "liveness_seconds": lambda v: _finite(0)(v) and (v == 0 or v >= 3),
    "launcher_grace_seconds": _finite(0),
    "exit_on_launcher_loss": lambda v: type(v) is bool,
    "exchange": _one_of(tuple(EXCHANGES)),
    "exchange_dir": _optional(_is_plain_path),
    "exchange_port": _int_in(0, 65535),
    "token_file": _optional(_is_path),
    "token": _optional(_token),
    "ssh_auth_dir": _is_path,
    "sshd_port": _int_in(0, 65535),
    "sshd": _is_path,
    "ssh_server": lambda v: v in ("auto", "openssh", "agent"),
    "ssh_user": _optional(lambda v: type(v) is str and names.is_user_name(v)),
    "preflight": lambda v: type(v) is bool,
    "ssh_reuse": lambda v: type(v) is bool,
    "pipeline": lambda v: type(v) is bool,
    "ssh_kex": _optional(lambda v: type(v) is str and names.is_kex_list(v)),
    "data_check": lambda v: type(v) is bool,
    "node_checks": lambda v: set(v) <= {"shm", "nccl", "gpus", "rdma", "imex"},
    "sysfs": _is_path,
    "state_dir": _is_plain_path,
    "termination_log": lambda v: (
        type(v) is str and (v == "" or v.startswith("/")) and "\0" not in v
    ),
    "log_format": _one_of(cfg.LOG_FORMATS),
    "log_level": _one_of(cfg.LOG_LEVELS),
}
TOKEN_PROBLEMS = (
    "MPI_BOOTSTRAP_TOKEN: must be at least 16 characters (value not shown)",
    "MPI_BOOTSTRAP_TOKEN: is not UTF-8 text (value not shown)",
)
# A token file's problems name the variable (or the flag) and the path, and say why.
TOKEN_FILE_PROBLEM = re.compile(
    r"(MPI_BOOTSTRAP_TOKEN_FILE|--token-file): (must not be empty|contains a NUL byte|"
    r"cannot read .+: .+|.+: must be at least 16 "
    r"characters \(value not shown\)|.+: is not UTF-8 text \(value not shown\)|set this or "
    r"MPI_BOOTSTRAP_TOKEN, not both .+)",
    re.DOTALL,
)


def check_token(config: Config) -> None:
    """The file's token is read by the launcher and the worker only; the environment form
    and a file others may read are warned about."""
    if config.token_file:
        uses = config.role in ("launcher", "worker")
        assert config.token == (FILE_TOKEN if uses else None)
        open_file = uses and TOKEN_FILES[config.token_file].mode & 0o044
        assert bool(config.token_warnings) == bool(open_file), config.token_warnings
    elif config.token is not None:
        assert any("MPI_BOOTSTRAP_TOKEN is in the" in w for w in config.token_warnings)
    else:
        assert config.token_warnings == ()
    if config.exchange == "net" and config.role in ("launcher", "worker"):
        assert config.token is not None


def _asks_for_help(argv: list[str]) -> bool:
    """argparse's own -h/--help (or an abbreviation) prints help and exits 0."""
    return any(
        t.startswith("-h") or (t.startswith("--he") and "--help".startswith(t.split("=", 1)[0]))
        for t in argv
    )


def check_config(environ: Mapping[str, str], argv: list[str]) -> None:
    token = environ.get("MPI_BOOTSTRAP_TOKEN")
    # Only a token no other input contains can be looked for in the output.
    secret = (
        token
        if token
        and len(token) >= 16
        and not any(token in v for k, v in environ.items() if k != "MPI_BOOTSTRAP_TOKEN")
        and not any(token in a for a in argv)
        else None
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            config = Config.from_env(environ, argv, host=HOST)
    except ConfigError as exc:
        outcome("ConfigError")
        assert exc.status == ExitStatus.CONFIG == 64
        assert exc.problems and all(type(p) is str for p in exc.problems)
        for p in exc.problems:
            if p.startswith("MPI_BOOTSTRAP_TOKEN:"):
                assert p in TOKEN_PROBLEMS, p
            if p.startswith(("MPI_BOOTSTRAP_TOKEN_FILE:", "--token-file:")):
                assert TOKEN_FILE_PROBLEM.fullmatch(p), p
        said = f"{exc.message}\n{exc.details}\n{exc.problems}"
        assert FILE_TOKEN not in said
        if secret:
            assert secret not in said
        return
    except SystemExit as exc:
        outcome("--help")
        assert exc.code == 0 and _asks_for_help(argv), argv
        return
    outcome("Config")
    assert config.role in cfg.ROLES
    assert type(config.program) is tuple and all(type(a) is str for a in config.program)
    assert type(config.explain) is bool and type(config.json) is bool
    for name, check in EXPECTED.items():
        assert check(getattr(config, name)), (name, getattr(config, name))
    assert all(src.kind in ("default", "env", "flag") for src in config.sources.values())
    assert set(EXPECTED) <= set(config.sources)
    assert all(type(n) is str for n in config.notes)
    check_token(config)
    for value in (secret, FILE_TOKEN):
        if value:
            assert value not in repr(config) and value not in str(config.notes)
            assert value not in str(config.token_warnings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.role = "worker"  # type: ignore[misc]


class TestConfigFuzz:
    """Any environment and argv give a well-typed frozen Config or a ConfigError (64)."""

    def test_every_setting_has_an_expectation(self) -> None:
        """Every setting but the legacy REWRITE_MPI_HOSTFILE_FQDN has an oracle in EXPECTED."""
        assert set(EXPECTED) == {s.name for s in cfg.SETTINGS} - {"rewrite_fqdn_legacy"}

    @fuzz(1200)
    @given(environs(), argvs())
    # `$` matched before a trailing newline: this was control_iface == "eth0\n".
    @example({"MPI_BOOTSTRAP_CONTROL_IFACE": "eth0\n"}, ["worker"])
    # One recursive call per role word: this was a RecursionError.
    @example({}, ["worker"] * 1200)
    # The token was in repr(config) (a dataclass field without repr=False).
    @example({"MPI_BOOTSTRAP_TOKEN": "s3cret-token-0123456789"}, ["worker"])
    # A non-UTF-8 byte in the token's Secret: this crashed netx.derive_key, not config.
    @example({"MPI_BOOTSTRAP_TOKEN": "s3cret-token-0123456789\udcff"}, ["worker"])
    @example({"MPI_BOOTSTRAP_TOKEN": "short"}, ["--np", "0", "launcher"])
    # The token file: read by the roles that use it, and only by them.
    @example({"MPI_BOOTSTRAP_TOKEN_FILE": "/run/secrets/job/token"}, ["worker"])
    @example({"MPI_BOOTSTRAP_TOKEN_FILE": "/run/secrets/job/open"}, ["launcher", "x"])
    @example({"MPI_BOOTSTRAP_TOKEN_FILE": "/run/secrets/job/missing"}, ["probe"])
    @example({"MPI_BOOTSTRAP_TOKEN_FILE": "/run/secrets/job/binary"}, ["worker"])
    @example({}, ["--token-file", "/run/secrets/job/short", "launcher", "x"])
    @example({}, ["launcher", "--help"])
    def test_from_env(self, environ: dict[str, str], argv: list[str]) -> None:
        """Any environment and argv give a well-typed, frozen Config, a ConfigError (64) naming its
        problems, or --help's exit 0; the token never shows in either."""
        check_config(environ, argv)
