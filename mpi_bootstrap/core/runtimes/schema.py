"""What a runtime descriptor is made of: the `Runtime` and the kinds of row its launch is
written in. Data only: launcher/mpi/resolve.py reads the rows, in order, against the
launch's facts; nothing here looks at a runtime's name.

A row's `when` is a predicate over the facts (`Facts` below): the row applies only where
it holds. A `Default`'s `args` and `reason` and an `EnvDefault`'s `value` may name a fact
in braces, filled in when the row is read: `{prefix}` (mpirun's install prefix),
`{control_iface}`, `{startup_timeout}` (seconds, a float: `{startup_timeout:g}`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Protocol


class Install(Protocol):
    """What a condition may ask of the MPI found (launcher/mpi/detect.py MPIInfo)."""

    @property
    def prefix(self) -> str: ...  # mpirun's install prefix: `/usr`, `/opt/ompi`
    @property
    def devices(self) -> tuple[str, ...]: ...  # MPICH's ch4 netmods ("ucx", "ofi")


class Facts(Protocol):
    """What a condition may ask of the launch (launcher/mpi/launch.py LaunchFacts)."""

    @property
    def mpi(self) -> Install: ...
    @property
    def environ(self) -> Mapping[str, str]: ...
    @property
    def is_root(self) -> bool: ...
    @property
    def multi_host(self) -> bool: ...  # some rank runs on another host (over ssh)
    @property
    def startup_timeout(self) -> float: ...


When = Callable[[Facts], bool]


@dataclasses.dataclass(frozen=True)
class Default:
    """One agent default and everything by which a user may have overridden it: the same
    option in their own mpirun command (wrap mode), or the MPI's own variable. The user
    wins, and the plan says so (DeepSpeed #4460), except where a value cannot work for a
    multi-host job (`works`): the agent overrides it and says why."""

    setting: str
    args: tuple[str, ...]
    reason: str
    flags: tuple[str, ...] = ()  # user option names that override it
    mca: tuple[str, ...] = ()  # MCA parameter names (any alias) that override it
    env: tuple[str, ...] = ()  # variables that override it
    ignored_env: tuple[str, ...] = ()  # variables users set that this MPI ignores
    # Values of `env` that make a multi-host launch impossible — single-node settings
    # images carry (CUDA/PyTorch images set OMPI_MCA_plm=isolated): for a job with
    # remote hosts the agent overrides them, and says so (docs/configuration.md "Settings the image
    # brings"). None: every value is the user's.
    works: Callable[[str], bool] | None = None
    why: str = ""  # why such a value cannot work
    only_to_override: bool = False  # add nothing unless a value must be overridden
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class Note:
    """A variable this runtime ignores, said in the plan where it is set (and left)."""

    var: str
    reason: str
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class Absent:
    """A default other runtimes have that this one has none of: the plan says why."""

    setting: str
    reason: str
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class Ranks:
    """How many ranks: the configured count, else the hostfile's slots."""

    flag: str
    flags: tuple[str, ...]  # the user's options that say it
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class Hostfile:
    """mpirun pointed at the rewritten hostfile, however the user named a hostfile."""

    flag: str
    flags: tuple[str, ...]  # the user's options that name a hostfile (redirected)
    host_flags: tuple[str, ...]  # the user's options that name hosts (the user wins)
    env: tuple[str, ...]  # variables naming a default hostfile (pointed at the rewrite)
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class EnvDefault:
    """A variable the agent adds to mpirun's environment unless the user set it."""

    var: str
    value: str
    reason: str
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class Refuse:
    """A value of `var` no multi-host job can work with, that the agent cannot choose
    for the user: the launch stops (64) and says `why`."""

    var: str
    works: Callable[[str], bool]  # given the value ("" where unset)
    why: str
    when: When | None = None


def selects(value: str, component: str) -> bool:
    """Does an MCA component list (`rsh`, `rsh,slurm`, `^slurm`) allow `component`?"""
    names = value.strip().lstrip("^").split(",")
    return component not in names if value.strip().startswith("^") else component in names


@dataclasses.dataclass(frozen=True)
class Param:
    """A launch-layer parameter: its name, other names that set it, and the Open MPI 4
    name users still set that this runtime ignores."""

    name: str
    aliases: tuple[str, ...] = ()
    legacy: str = ""


@dataclasses.dataclass(frozen=True)
class LaunchLayer:
    """How Open MPI's launch layer takes parameters (ORTE: --mca and OMPI_MCA_*; PRRTE:
    --prtemca and PRTE_MCA_*), and its remote launcher (the plm)."""

    flag: str
    env_prefix: str
    plm: str  # the component that starts daemons on other hosts
    plm_accepts: tuple[str, ...]  # plm values that still reach other hosts

    def param(self, p: Param, value: str, reason: str) -> Default:
        names = (p.name, *p.aliases)
        return Default(
            f"{self.flag} {p.name}",
            (self.flag, p.name, value),
            reason,
            mca=names,
            env=tuple(f"{self.env_prefix}{n}" for n in names),
            ignored_env=(f"OMPI_MCA_{p.legacy}",) if p.legacy else (),
        )

    def reaches(self, plm: str) -> bool:
        """Does a plm setting still start daemons on other hosts?"""
        return any(selects(plm, c) for c in self.plm_accepts)


@dataclasses.dataclass(frozen=True)
class RshAgent:
    """Open MPI's ssh to the workers: the rsh agent parameter, set to the launch gate
    where it can hold every rank back (Gate), else to the agent's ssh command."""

    layer: LaunchLayer
    agent: Param
    when: When | None = None


@dataclasses.dataclass(frozen=True)
class LaunchExec:
    """hydra's ssh to the workers: one path (so the options live in a script), the launch
    gate where it can hold every rank back (Gate), else the agent's ssh wrapper."""

    option: str  # -launcher-exec
    env: str  # the variable that sets it
    flags: tuple[str, ...]  # the user's options that set it
    launchers: tuple[str, ...]  # the user's options that choose the launcher itself
    when: When | None = None


Row = Default | Note | Absent | Ranks | Hostfile | EnvDefault | Refuse | RshAgent | LaunchExec


@dataclasses.dataclass(frozen=True)
class EachName:
    """Forward each variable with its own option (`-x NAME`), except those the user's
    own command names."""

    flag: str


@dataclasses.dataclass(frozen=True)
class NameList:
    """Forward the variables as one list (`-genvlist A,B`), unless the user chose how
    the environment travels (`modes`, or the variable `mode_env`)."""

    flag: str
    modes: tuple[str, ...]
    mode_env: str = ""
    # Why mpirun's environment must end with a variable nobody forwards (the plan's
    # words; launcher/mpi/env.py ENV_END), or "": it need not.
    last: str = ""


Forward = EachName | NameList


@dataclasses.dataclass(frozen=True)
class Gate:
    """Where mpirun's ssh can hold every rank of a launch back (core/gate.py): read by
    launcher/mpi/gating.py, which says why the gate is off elsewhere."""

    host_lists: Default  # the user's own host lists: mpirun may start ranks elsewhere
    # True: a daemon starts on every host of the hostfile, and no rank before all have
    # reported (gate.EACH); False: a remote process starts its ranks as soon as it
    # connects, so every worker's ssh waits for every check (gate.EVERY).
    each: bool
    why: str  # why that mode, in the plan's words
    local: str = ""  # not each: why a host of this pod's (`{local}`) turns the gate off
    label: str = ""  # each: the runtime's name in the plan's words
    fewer: tuple[Default, ...] = ()  # each: settings under which daemons start on some hosts
    pins: tuple[Default, ...] = ()  # pinned (those of `fewer` where the user set none)
    # What stops mpirun taking a worker's name for this pod by a DNS answer; a flag of
    # the user's for it turns the gate off.
    resolves: Default | None = None
    # True: mpirun resolves every name itself to tell this pod's hosts, and nothing turns
    # that off (hydra): it reads the IPv4 addresses the agent resolved and checked.
    literal: bool = False


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Runtime:
    """One MPI runtime: how it is recognised and chosen, what it starts on the workers,
    and what the agent adds to its mpirun, in order (`rows`)."""

    name: str  # as the plan names it: orte | prrte | hydra
    vendor: str  # openmpi | mpich | intel
    version: re.Pattern[str]  # finds the version (group 1) in `mpirun --version`
    choices: tuple[str, ...]  # MPI_BOOTSTRAP_MPI values that choose it
    daemons: tuple[str, ...]  # what mpirun starts on every worker over ssh
    hostfile_form: str  # core/hostfile.py's form it reads
    options: Mapping[str, int]  # its mpirun's options that take values, and how many
    rows: tuple[Row, ...]
    gate: Gate
    forward: Forward
    versions: Callable[[str], bool] = lambda _version: True  # the vendor's it launches
    detected_first: bool = False  # its pattern is looked for before the others'

    def __repr__(self) -> str:
        return f"Runtime({self.vendor}/{self.name})"
