"""docs/configuration.md's lists, written from the code: the settings tables from the
settings table (core/settings/, grouped and worded as `--help-all` has them:
core/helptext.py), and what each MPI gets from the runtime descriptors' rows
(core/runtimes/), in the order launcher/mpi/resolve.py reads them.

Each generated part lies between `<!-- generated: NAME ... -->` and
`<!-- end generated: NAME -->`; everything else in the page is written by hand.
`make docs` rewrites the parts in place (`python -m tests.support.docgen`), and
tests/test_docs.py::TestGenerated fails when the page differs from what this writes now.

A row's condition (`when`) is a function: it is described by evaluating it over the cases
below (DIMENSIONS) and naming the cases where it holds, so no condition is described by
hand. A condition this cannot describe (it depends on two of them, or on none and never
holds) stops the generator, naming the row."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
import sys
import textwrap
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mpi_bootstrap.core import config, helptext, hostfile, settings
from mpi_bootstrap.core.env import CARRIED
from mpi_bootstrap.core.runtimes import RUNTIMES, Runtime, hydra
from mpi_bootstrap.core.runtimes import schema as rs
from mpi_bootstrap.launcher.mpi import env as forwarding

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- generated: {name} (`make docs` writes it from {source}; edit that) -->"
END = "<!-- end generated: {name} -->"


def _code(text: str) -> str:
    return f"`{text}`"


def _para(text: str) -> str:
    """A paragraph wrapped as the page's hand-written ones are, never inside `code`."""
    held = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), text)
    wrapped = textwrap.fill(held, 90, break_on_hyphens=False, break_long_words=False)
    return wrapped.replace("\0", " ")


def _cell(text: str) -> str:
    """Text for a markdown table cell: pipes escaped, one line."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- the settings


def _value(s: settings.Setting) -> str:
    """The form of a setting's value, as --help-all writes it, choices in backticks."""
    form = helptext.form(s)
    return ", ".join(_code(c) for c in form.split("|")) if "|" in form else form


def _default_value(s: settings.Setting) -> str:
    """A default value in backticks; a default worked out at run time in words."""
    words = helptext.default_of(s)
    return words if s.default in (None, ()) else _code(words)


def _role_lines() -> dict[str, str]:
    """Each role's line of `--help` (helptext.USAGE): `  worker     generate keys, …`."""
    roles: dict[str, str] = {}
    role = ""
    for line in helptext.USAGE.splitlines():
        if m := re.fullmatch(r"  (\w+) {2,}(.*)", line):
            role = m[1]
            roles[role] = m[2]
        elif role and line.startswith(" " * 13):
            roles[role] += " " + line.strip()
        else:
            role = ""
    return roles


def settings_part() -> str:
    """A table per group of --help-all, then the role."""
    head = ("flag", "variable", "value", "default", "meaning")
    parts = []
    for title, names in helptext.GROUPS:
        rows = []
        for name in names:
            s = settings.setting(name)
            envs = ", ".join(_code(e) for e in s.envs)
            rows.append(
                (_code(s.flag) if s.flag else "–", envs, _value(s), _default_value(s), s.help)
            )
        parts.append(f"**{title}**\n\n{_table(head, rows)}")
    described = _role_lines()
    roles = [(_code(role), described[role]) for role in settings.ROLES]
    parts.append(
        _para(
            f"**The role**: the word on the command line, else {_code(config.ROLE_ENV)}, "
            'else what the pod\'s operator says (see "Operators").'
        )
        + "\n\n"
        + _table(("role", "what it does"), roles)
    )
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- what each MPI gets


@dataclasses.dataclass(frozen=True)
class _Install:
    prefix: str = "/usr"
    devices: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Facts:
    """What a row's condition may ask (core/runtimes/schema.py Facts)."""

    mpi: _Install = _Install()
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)
    is_root: bool = False
    multi_host: bool = True
    startup_timeout: float = 1.0


def _flag(name: str) -> str:
    """A setting's flag, in backticks."""
    return _code(settings.setting(name).flag or "")


# The cases a condition is evaluated over: each dimension's values, in words, and what
# they change in the facts. A condition that depends on none of them holds always.
DIMENSIONS: tuple[tuple[tuple[str, Mapping[str, typing.Any]], ...], ...] = (
    (("as root", {"is_root": True}), ("not as root", {"is_root": False})),
    (
        ("mpirun in `/usr/bin`", {"prefix": "/usr"}),
        ("mpirun in another directory (`/opt/mpi/bin`)", {"prefix": "/opt/mpi"}),
    ),
    (
        ("MPICH built with OFI (and UCX), no netmod chosen", {"devices": ("ucx", "ofi")}),
        ("MPICH built with UCX only", {"devices": ("ucx",)}),
        (f"`{hydra.NETMOD}=ofi`", {"devices": ("ucx", "ofi"), "environ": {hydra.NETMOD: "ofi"}}),
        (f"`{hydra.NETMOD}=ucx`", {"devices": ("ucx", "ofi"), "environ": {hydra.NETMOD: "ucx"}}),
    ),
    (
        (f"{_flag('startup_timeout')} above 0", {"startup_timeout": 300.0}),
        (f"{_flag('startup_timeout')} 0", {"startup_timeout": 0.0}),
    ),
)


def _facts(case: Sequence[int]) -> _Facts:
    """The facts of one case: a value of each dimension."""
    merged = {k: v for i, j in enumerate(case) for k, v in DIMENSIONS[i][j][1].items()}
    install = _Install(merged.pop("prefix", "/usr"), merged.pop("devices", ()))
    return _Facts(install, **merged)


def condition(when: rs.When | None, row: str) -> str:
    """In words, where `when` holds: the cases of the one dimension it depends on."""
    if when is None:
        return ""
    cases = list(itertools.product(*(range(len(d)) for d in DIMENSIONS)))
    holds = {c: when(_facts(c)) for c in cases}
    depends = [
        i
        for i, d in enumerate(DIMENSIONS)
        if any(holds[c] != holds[(*c[:i], j, *c[i + 1 :])] for c in cases for j in range(len(d)))
    ]
    if not depends and all(holds.values()):
        return ""
    if len(depends) != 1:
        raise ValueError(
            f"{row}: its condition depends on {len(depends)} of the cases in "
            "tests/support/docgen.py DIMENSIONS; add what it asks there"
        )
    i = depends[0]
    first = cases[0]
    return ", or ".join(
        label
        for j, (label, _) in enumerate(DIMENSIONS[i])
        if holds[(*first[:i], j, *first[i + 1 :])]
    )


# The facts a row may name in braces (core/runtimes/schema.py), as the page writes them:
# a setting's by its value's form, the others by what they are.
FILLED = {"prefix": "PREFIX", "control_iface": "CONTROL_IFACE", "startup_timeout": "SECONDS"}
LEGEND = {"prefix": "the directory above mpirun's `bin`"}


class _Symbol(str):
    """A fact's name in place of its value, whatever the format spec (`{x:g}`)."""

    __slots__ = ()

    def __format__(self, spec: str) -> str:
        return str(self)


def _fill(text: str) -> str:
    return text.format_map({k: _Symbol(v) for k, v in FILLED.items()})


def _legend() -> str:
    said = []
    for fact, symbol in FILLED.items():
        if fact in LEGEND:
            said.append(f"{symbol} is {LEGEND[fact]}")
        else:
            said.append(f"{symbol} the value of {_flag(fact)}")
    return "; ".join(said)


def _argv(args: Sequence[str]) -> str:
    return _code(shlex.join(_fill(a) for a in args))


def _codes(names: Sequence[str]) -> str:
    return ", ".join(_code(n) for n in names)


def _yours(env: Sequence[str]) -> str:
    return f" Yours wins: {_codes(env)}." if env else ""


def _options(names: Sequence[str], long: str) -> list[str]:
    """The user's options as written in their mpirun command: `-H`, `--host` (Open MPI's
    long options take two dashes, hydra's one: `long`)."""
    return [("-" if len(n) == 1 else long) + n for n in names]


# What a row adds, where (besides its condition), and why.
Described = tuple[str, str, str]
ARCHITECTURE = "[the launch gate](architecture.md)"


def _default(row: rs.Default) -> Described:
    reason = _fill(row.reason)
    if row.works is None:
        return _argv(row.args), "", f"{reason}.{_yours(row.env)}"
    over = f"over a value of {_codes(row.env)} no multi-host job works with"
    if row.only_to_override:
        return _argv(row.args), f"only {over}", f"{reason}; such a value: {row.why}."
    return _argv(row.args), "", f"{reason}.{_yours(row.env)} The agent's wins {over} — {row.why}."


def _note(row: rs.Note) -> Described:
    return "nothing (`--explain` says so)", f"{_code(row.var)} is set", row.reason


def _absent(row: rs.Absent) -> Described:
    return f"no {_code(row.setting)}", "", row.reason


def _ranks(row: rs.Ranks) -> Described:
    return _code(f"{row.flag} N"), "", f"N is {_flag('np')}, else the sum of the hostfile's slots."


def _hostfile(row: rs.Hostfile) -> Described:
    long = "--" if row.flag.startswith("--") else "-"
    return (
        _code(f"{row.flag} HOSTFILE") + f"; {_codes(row.env)} pointed at it where set",
        "",
        f"HOSTFILE is the rewritten copy ({_flag('output_hostfile')}); a default hostfile with the "
        "old names would conflict with it. A hostfile your command names is pointed at it; "
        f"a host list of yours wins ({_codes(_options(row.host_flags, long))}).",
    )


def _rsh_agent(row: rs.RshAgent) -> Described:
    env = [f"{row.layer.env_prefix}{n}" for n in (row.agent.name, *row.agent.aliases)]
    return (
        _code(f"{row.layer.flag} {row.agent.name} SSH"),
        "",
        f"how mpirun reaches the workers: SSH is {ARCHITECTURE} where it can hold every "
        "rank back, else the agent's ssh command (`ssh -F CONFIG`, its config in the state "
        f"directory).{_yours(env)}",
    )


def _launch_exec(row: rs.LaunchExec) -> Described:
    return (
        _code(f"{row.option} WRAPPER"),
        "",
        f"hydra takes a single path: WRAPPER is {ARCHITECTURE} where it can hold every rank "
        "back, else a two-line script in the state directory that runs the agent's ssh."
        + _yours((row.env,)),
    )


def _env_default(row: rs.EnvDefault) -> Described:
    return (
        _code(f"{row.var}={_fill(row.value)}") + " in mpirun's environment",
        "",
        f"{_fill(row.reason)}.{_yours((row.var,))}",
    )


def _refuse(row: rs.Refuse) -> Described:
    return (
        "nothing: the launch stops (exit 64)",
        f"a value of {_code(row.var)} no multi-host job works with",
        row.why,
    )


# How each kind of row is described (tests/test_docs.py checks every kind of `Row` has one).
DESCRIBERS: Mapping[type, Callable[[typing.Any], Described]] = {
    rs.Default: _default,
    rs.Note: _note,
    rs.Absent: _absent,
    rs.Ranks: _ranks,
    rs.Hostfile: _hostfile,
    rs.EnvDefault: _env_default,
    rs.Refuse: _refuse,
    rs.RshAgent: _rsh_agent,
    rs.LaunchExec: _launch_exec,
}

# The runtimes' names in the page's words, by their most specific MPI_BOOTSTRAP_MPI value.
TITLES = {
    "openmpi4": "Open MPI 4",
    "openmpi5": "Open MPI 5",
    "mpich": "MPICH",
    "intel": "Intel MPI",
}


def _forward(how: rs.Forward) -> list[Described]:
    if isinstance(how, rs.EachName):
        return [
            (
                _code(f"{how.flag} NAME") + " for each",
                "",
                "the forwarded variables (below), by name.",
            )
        ]
    mine = [f"-{m}" for m in how.modes] + ([how.mode_env] if how.mode_env else [])
    rows = [
        (
            _code(f"{how.flag} NAME,…"),
            "",
            f"the forwarded variables (below), by name. Yours wins: {_codes(mine)}.",
        )
    ]
    if how.last:
        rows.append(
            (_code(f"{forwarding.ENV_END}=1") + " last in mpirun's environment", "", how.last)
        )
    return rows


def runtime_part(runtime: Runtime) -> str:
    key = runtime.choices[-1]
    if key not in TITLES:
        raise ValueError(f"name the runtime {key!r} in tests/support/docgen.py TITLES")
    sample = hostfile.render([hostfile.Host("HOST", 4)], runtime.hostfile_form).strip()
    intro = f"#### {TITLES[key]} ({runtime.name}, `--mpi {key}`)\n\n" + _para(
        f"mpirun starts {_codes(runtime.daemons)} on every worker over ssh; the rewritten "
        f"hostfile's lines read {_code(sample)}."
    )
    rows = []
    for n, row in enumerate(runtime.rows):
        adds, where, why = DESCRIBERS[type(row)](row)
        when = condition(row.when, f"{runtime!r}'s row {n} ({type(row).__name__})")
        rows.append((adds, "; ".join(w for w in (when, where) if w), why))
    for pin in runtime.gate.pins:
        adds, _, why = _default(pin)
        rows.append((adds, f"{ARCHITECTURE} is on", why))
    rows += _forward(runtime.forward)
    return f"{intro}\n\n{_table(('the agent adds', 'where', 'why'), rows)}"


def mpi_part() -> str:
    """Per runtime, what the agent adds to mpirun; then what every rank gets."""
    names = [c.pattern for c in CARRIED if c.ranks]
    forward_env = settings.setting("forward_env")
    never = sorted([f"{p}*" for p in forwarding.DENY_PREFIXES] + list(forwarding.DENY_NAMES))
    parts = [
        _para(
            "Per MPI, in the order the agent adds them (`--explain` shows each with its "
            "reason); an empty *where* is always. Every agent default yields to yours: the "
            "same option in your mpirun command (wrap mode, above), or a variable named. "
            f"{_legend()}."
        ),
        *(runtime_part(r) for r in RUNTIMES),
        _para(
            f"Forwarded to every rank by name when set: {', '.join(_code(n) for n in names)}, "
            f"and what {_code(forward_env.envs[0])} ({_flag('forward_env')}) names. "
            f"Never: {', '.join(_code(n) for n in never)} (shell state, and the agent's own "
            "settings, which may hold secrets)."
        ),
    ]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- the page


def nodechecks_part() -> str:
    """The node checks' table, from core/nodechecks.py's one row each."""
    from mpi_bootstrap.core import nodechecks

    rows = [(_code(c.name), c.reports, c.fails, c.fix) for c in nodechecks.CHECKS]
    head = ("check", "what the worker reports", "fails (69) when", "the fix")
    return _table(head, rows) + "\n"


PARTS: Mapping[str, tuple[str, Callable[[], str]]] = {
    "settings": ("mpi_bootstrap/core/settings/ and core/helptext.py", settings_part),
    "mpi": ("mpi_bootstrap/core/runtimes/", mpi_part),
    "nodechecks": ("mpi_bootstrap/core/nodechecks.py", nodechecks_part),
}


def _span(name: str, source: str) -> re.Pattern[str]:
    begin = re.escape(BEGIN.format(name=name, source=source))
    return re.compile(f"{begin}\n(.*?)^{re.escape(END.format(name=name))}$", re.S | re.M)


def render(text: str) -> str:
    """The page with every generated part as the code has it now."""
    for name, (source, make) in PARTS.items():
        found = list(_span(name, source).finditer(text))
        if len(found) != 1:
            raise ValueError(
                f"docs/configuration.md: {len(found)} parts marked {name!r}, not 1: the part "
                f"begins with {BEGIN.format(name=name, source=source)} and ends with "
                f"{END.format(name=name)}"
            )
        start, end = found[0].span(1)
        text = f"{text[:start]}\n{make()}\n{text[end:]}"
    return text


def main(argv: Sequence[str]) -> int:
    """Rewrite the page's generated parts (`make docs`); with --check, only say whether
    they are as the code has them."""
    old = PAGE.read_text(encoding="utf-8")
    new = render(old)
    if "--check" in argv:
        if new != old:
            print(f"{PAGE}: generated parts out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if new != old:
        PAGE.write_text(new, encoding="utf-8")
        print(f"{PAGE}: generated parts rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
