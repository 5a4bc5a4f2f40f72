"""Which MPI this is (from the real `mpirun --version`), and the mpirun argv for each.

One builder per launch runtime: ORTE (Open MPI 4), PRRTE (Open MPI 5), hydra (MPICH and
Intel MPI). Builders are pure: facts in, argv list + decisions out — never a shell string
(Horovod #948). Every agent default can be overridden by the user, either with the same
flag in their own mpirun command (wrap mode) or with the MPI's own environment variable;
the user wins and the plan records why (DeepSpeed #4460).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence

from mpi_bootstrap.errors import ConfigError
from mpi_bootstrap.model import Decision, PlannedFile
from mpi_bootstrap.names import is_env_name

OPENMPI, MPICH, INTEL = "openmpi", "mpich", "intel"
ORTE, PRRTE, HYDRA = "orte", "prrte", "hydra"

# argv[0] basenames that make the user's command a launcher we wrap (wrap mode).
LAUNCHER_NAMES = frozenset({
    "mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prterun", "mpirun.openmpi",
    "mpiexec.openmpi", "mpirun.mpich", "mpiexec.mpich",
})

_OMPI_RE = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+\.\d+(?:\.\d+)?\S*)")
_HYDRA_RE = re.compile(r"HYDRA build details:.*?Version:\s+(\S+)", re.S)
_INTEL_RE = re.compile(r"Intel\(R\) MPI Library.*?Version\s+(\S+)")
_DEVICE_RE = re.compile(r"--with-device=ch\d:([\w,]+)")

# Always forwarded when set; prefixes are forwarded by name (`-x NAME`, value-less).
FORWARD_NAMES = ("LD_LIBRARY_PATH", "PATH")
FORWARD_PREFIXES = ("NCCL_", "UCX_", "FI_", "MPIR_CVAR_", "OMPI_MCA_coll_")
# Never forwarded, whatever the user asks: shell functions and OLDPWD break remote shells
# (Horovod's denylist); the agent's own settings may hold secrets (MPI_BOOTSTRAP_TOKEN).
DENY_PREFIXES = ("BASH_FUNC_", "MPI_BOOTSTRAP_")
DENY_NAMES = frozenset({"OLDPWD"})
NO_TREE_SPAWN = ("mpirun reaches every worker itself: only the launcher needs ssh "
                 "credentials, and tree spawn hangs past ~64 hosts (ompi #4465)")
ENV_END = "MPI_BOOTSTRAP_ENV_END"  # sentinel that ends mpirun's environment (MPICH)


@dataclasses.dataclass(frozen=True)
class MPIInfo:
    vendor: str  # openmpi | mpich | intel
    version: str  # "4.1.4", "2021.18.1", or "unknown"
    runtime: str  # orte | prrte | hydra
    mpirun: str  # the path that was asked
    version_line: str  # the first line that identified it
    source: str  # "detected" or "env MPI_BOOTSTRAP_MPI"
    devices: tuple[str, ...] = ()  # MPICH: the ch4 netmods it was built with ("ucx", "ofi")


def parse_version(text: str) -> tuple[str, str] | None:
    """(vendor, version) from `mpirun --version` output, or None if unknown."""
    if m := _INTEL_RE.search(text):
        return INTEL, m.group(1).rstrip(",")
    if m := _OMPI_RE.search(text):
        return OPENMPI, m.group(1)
    if m := _HYDRA_RE.search(text):
        return MPICH, m.group(1)
    return None


def _runtime(vendor: str, version: str) -> str:
    if vendor == OPENMPI:
        major = version.split(".", 1)[0]
        return PRRTE if major.isdigit() and int(major) >= 5 else ORTE
    return HYDRA


def identify(text: str, mpirun: str, choice: str, choice_source: str) -> MPIInfo:
    """Decide the MPI from the version output and the MPI_BOOTSTRAP_MPI setting."""
    found = parse_version(text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if choice == "auto":
        if found is None:
            raise ConfigError([
                f"cannot tell which MPI {mpirun} is from `mpirun --version` "
                f"(said {first[:120]!r}); set MPI_BOOTSTRAP_MPI to openmpi4, openmpi5, "
                "mpich or intel"])
        vendor, version = found
        return MPIInfo(vendor, version, _runtime(vendor, version), mpirun, first, "detected",
                       _devices(text))
    vendor = OPENMPI if choice.startswith(OPENMPI) else choice
    version = found[1] if found and found[0] == vendor else "unknown"
    if choice == "openmpi4":
        runtime = ORTE
    elif choice == "openmpi5":
        runtime = PRRTE
    elif vendor == OPENMPI:
        if version == "unknown":
            raise ConfigError([
                f"{choice_source}: 'openmpi' but {mpirun} --version does not say which "
                "major version; use openmpi4 or openmpi5"])
        runtime = _runtime(vendor, version)
    else:
        runtime = HYDRA
    return MPIInfo(vendor, version, runtime, mpirun, first, choice_source, _devices(text))


def _devices(text: str) -> tuple[str, ...]:
    """MPICH's netmods, from `Configure options: --with-device=ch4:ucx,ofi`."""
    m = _DEVICE_RE.search(text)
    return tuple(m.group(1).split(",")) if m else ()


def is_launcher(program: Sequence[str]) -> bool:
    return bool(program) and os.path.basename(program[0]) in LAUNCHER_NAMES


# ---------------------------------------------------------------- the user's own command

# Options of each runtime that take arguments (wrap mode must know where the program
# starts, so that a `--mca` inside the user's program arguments is not mistaken for one).
_OMPI_ARITY = {
    **dict.fromkeys(["mca", "gmca", "prtemca", "pmixmca", "omca", "am", "tune"], 2),
    **dict.fromkeys([
        "np", "n", "c", "H", "host", "hostfile", "machinefile", "default-hostfile", "x",
        "bind-to", "map-by", "rank-by", "prefix", "wdir", "wd", "path", "timeout",
        "output-filename", "output", "npernode", "N", "npersocket", "ppr", "cpus-per-proc",
        "cpus-per-rank", "launch-agent", "report-uri", "app", "rankfile", "cpu-set",
        "preload-files", "s", "stdin", "xterm", "personality", "runtime-options", "hnp",
        "set-cwd-to-session-dir", "mapby", "rankby", "bindto", "display", "dvm", "pmixam",
        "forward-signals", "report-pid", "add-hostfile", "add-host",
    ], 1),
}
_HYDRA_ARITY = {
    **dict.fromkeys(["genv", "env"], 2),
    **dict.fromkeys([
        "n", "np", "f", "hostfile", "machinefile", "machine", "host", "hosts", "ppn",
        "perhost", "rr", "genvlist", "envlist", "launcher", "launcher-exec", "bootstrap",
        "bootstrap-exec", "iface", "wdir", "configfile", "rmk", "demux", "binding",
        "bind-to", "map-by", "topolib", "profile", "errfile-pattern", "outfile-pattern",
        "prepend-pattern", "gpus-per-proc", "gdb", "ilp64", "tune", "umask", "nameserver",
        "localhost", "usize", "hosts-group", "ranks-per-proc", "membind", "gtool", "tmpdir",
    ], 1),
}


# Options that name a hostfile in the user's own command (Open MPI and hydra spellings).
HOSTFILE_OPTIONS = ("hostfile", "machinefile", "default-hostfile", "f")


@dataclasses.dataclass(frozen=True)
class UserCommand:
    """The user's own `mpirun …` in wrap mode: its options and where the program starts."""

    argv: tuple[str, ...]
    options: tuple[tuple[str, int, tuple[str, ...]], ...]  # (name, argv index, values)
    program_index: int

    def has(self, *names: str) -> str | None:
        """The user's spelling of the first of `names` given, or None."""
        for name, index, _ in self.options:
            if name in names:
                return self.argv[index].split("=", 1)[0]
        return None

    def mca_names(self) -> set[str]:
        return {values[0] for name, _, values in self.options
                if name in ("mca", "gmca", "prtemca", "pmixmca", "omca") and values}

    def values(self, name: str) -> list[str]:
        return [v[0] for n, _, v in self.options if n == name and v]


def scan_user_command(argv: Sequence[str], runtime: str) -> UserCommand:
    arity = _HYDRA_ARITY if runtime == HYDRA else _OMPI_ARITY
    options: list[tuple[str, int, tuple[str, ...]]] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or tok == "-":
            break
        name, eq, inline = tok.lstrip("-").partition("=")
        n = arity.get(name, 0)
        if eq:
            values: tuple[str, ...] = (inline, *argv[i + 1:i + n])
            options.append((name, i, values))
            i += max(1, n)
            continue
        options.append((name, i, tuple(argv[i + 1:i + 1 + n])))
        i += 1 + n
    return UserCommand(argv=tuple(argv), options=tuple(options), program_index=i)


# ---------------------------------------------------------------- environment forwarding

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


# ---------------------------------------------------------------- builders

@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """What a builder needs; gathered by the launcher, so builders stay pure."""

    mpi: MPIInfo
    program: tuple[str, ...]
    hostfile: str  # the rewritten hostfile mpirun will read
    input_hostfile: str
    total_slots: int
    np: int | None
    np_source: str
    control_iface: str
    data_iface: str | None
    environ: Mapping[str, str]
    is_root: bool
    ssh_command: tuple[str, ...]
    ssh_wrapper: str  # path of the hydra launcher-exec wrapper
    forward_patterns: tuple[str, ...]
    startup_timeout: float
    multi_host: bool = True  # some rank runs on another host (over ssh)


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env_set: Mapping[str, str]  # variables the agent adds to mpirun's environment
    forwarded: tuple[str, ...]
    files: tuple[PlannedFile, ...]
    decisions: tuple[Decision, ...]
    wrap: bool
    program_index: int  # where the user's program starts in argv


@dataclasses.dataclass(frozen=True)
class _Default:
    """One agent default and everything by which a user may have overridden it."""

    setting: str
    args: tuple[str, ...]
    reason: str
    flags: tuple[str, ...] = ()  # user option names that override it
    mca: tuple[str, ...] = ()  # MCA parameter names (any alias) that override it
    env: tuple[str, ...] = ()  # variables that override it
    ignored_env: tuple[str, ...] = ()  # variables users set that this MPI ignores
    # Values of `env` that make a multi-host launch impossible — single-node settings
    # images carry (CUDA/PyTorch images set OMPI_MCA_plm=isolated): for a job with
    # remote hosts the agent overrides them, and says so (README "Settings the image
    # brings"). None: every value is the user's.
    works: Callable[[str], bool] | None = None
    why: str = ""  # why such a value cannot work
    only_to_override: bool = False  # add nothing unless a value must be overridden


class _Builder:
    def __init__(self, facts: LaunchFacts) -> None:
        self.f = facts
        self.wrap = is_launcher(facts.program)
        self.user = scan_user_command(facts.program, facts.mpi.runtime) if self.wrap else None
        self.user_mca = self.user.mca_names() if self.user else set()
        self.args: list[str] = []
        self.env_set: dict[str, str] = {}
        self.decisions: list[Decision] = []
        self.files: list[PlannedFile] = []

    def decide(self, setting: str, value: str, source: str, reason: str) -> None:
        self.decisions.append(Decision(setting, value, source, reason))

    def add(self, d: _Default) -> bool:
        """Add `d` unless the user set it; record the decision either way."""
        value = d.args[-1] if len(d.args) > 1 else "on"
        if self.user and (spelled := self.user.has(*d.flags)):
            self.decide(d.setting, "(user's)", f"user flag {spelled}",
                        f"user wins: agent default {value!r} not added")
            return False
        for name in d.mca:
            if name in self.user_mca:
                self.decide(d.setting, "(user's)", f"user flag --mca {name}",
                            f"user wins: agent default {value!r} not added")
                return False
        for var in d.env:
            if var not in self.f.environ:
                continue
            theirs = self.f.environ[var]
            if d.works is None or d.works(theirs) or not self.f.multi_host:
                self.decide(d.setting, "(user's)", f"env {var}",
                            f"user wins: agent default {value!r} not added")
                return False
            self.args.extend(d.args)
            self.decide(d.setting, value, f"env {var}",
                        f"overrides {var}={theirs!r} (from the image's environment?): "
                        f"{d.why}; a flag in the command itself would win")
            return True
        if d.only_to_override:
            return False
        reason = d.reason
        ignored = [v for v in d.ignored_env if v in self.f.environ]
        if ignored:
            reason += f"; {', '.join(ignored)} is set but ignored by {self.f.mpi.vendor} " \
                      f"{self.f.mpi.version} (mpi-operator #731)"
        self.args.extend(d.args)
        self.decide(d.setting, value, "agent default", reason)
        return True

    # -- shared pieces

    def np_default(self, flag: str, flags: tuple[str, ...]) -> _Default:
        count = self.f.np if self.f.np is not None else self.f.total_slots
        why = (f"from {self.f.np_source}" if self.f.np is not None
               else f"sum of slots in the hostfile ({self.f.total_slots})")
        return _Default("ranks", (flag, str(count)), why, flags=flags)

    def hostfile(self, flag: str, flags: tuple[str, ...], host_flags: tuple[str, ...],
                 env_vars: tuple[str, ...]) -> None:
        """Point mpirun at the rewritten hostfile, however the user named a hostfile."""
        user = self.user
        if user is not None and (spelled := user.has(*host_flags)):
            self.decide("hostfile", "(not passed)", f"user flag {spelled}",
                        "user wins: the user's host list chooses the hosts")
            return
        if user is not None and user.has(*flags):
            self.decide("hostfile", self.f.hostfile, "user flag",
                        "the user's hostfile argument now names the rewritten copy")
        else:
            self.args.extend([flag, self.f.hostfile])
            self.decide("hostfile", self.f.hostfile, "agent default",
                        f"rewritten copy of {self.f.input_hostfile}")
        for var in env_vars:
            if var in self.f.environ:
                self.env_set[var] = self.f.hostfile
                self.decide(f"env {var}", self.f.hostfile, f"env {var}",
                            "pointed at the rewritten hostfile: a default hostfile with the "
                            "old names would conflict with it")

    def user_tail(self) -> list[str]:
        """The user's command after argv[0], with hostfile arguments redirected."""
        if self.user is None:
            return list(self.f.program)
        argv = list(self.f.program[1:])
        for name, index, values in self.user.options:
            if name in HOSTFILE_OPTIONS and values:
                tok = argv[index - 1]
                if "=" in tok:
                    argv[index - 1] = tok.split("=", 1)[0] + "=" + self.f.hostfile
                else:
                    argv[index] = self.f.hostfile
        return argv

    def nccl_iface(self) -> None:
        if "NCCL_SOCKET_IFNAME" in self.f.environ:
            self.decide("NCCL_SOCKET_IFNAME", "(user's)", "env NCCL_SOCKET_IFNAME",
                        "user wins")
        elif self.f.data_iface:
            self.env_set["NCCL_SOCKET_IFNAME"] = self.f.data_iface
            self.decide("NCCL_SOCKET_IFNAME", self.f.data_iface, "agent default",
                        "NCCL data on the data interface; control stays on "
                        f"{self.f.control_iface}")
        else:
            self.decide("NCCL_SOCKET_IFNAME", "(unset)", "agent default",
                        "no data interface (net1, dranet0) found; NCCL picks its own")

    def forward(self) -> list[str]:
        env = {**self.f.environ, **self.env_set}
        names, decisions = forwarded_names(env, self.f.forward_patterns)
        self.decisions.extend(decisions)
        return names

    def spec(self, forwarded: Sequence[str]) -> LaunchSpec:
        launcher = self.f.program[0] if self.wrap else self.f.mpi.mpirun
        argv = (launcher, *self.args, *self.user_tail())
        start = 1 + len(self.args) + (self.user.program_index - 1 if self.user else 0)
        return LaunchSpec(argv=tuple(argv), env_set=dict(self.env_set),
                          forwarded=tuple(forwarded), files=tuple(self.files),
                          decisions=tuple(self.decisions), wrap=self.wrap,
                          program_index=start)


def _openmpi(facts: LaunchFacts) -> LaunchSpec:
    b = _Builder(facts)
    five = facts.mpi.runtime == PRRTE
    ctl = facts.control_iface
    # Open MPI 5 moved launch parameters to PRRTE: they go through --prtemca and
    # PRTE_MCA_*; the 4.x names (OMPI_MCA_orte_*, plm_rsh_*) are silently ignored
    # (mpi-operator #731, #842; trainer #4028).
    def launch_param(name: str, value: str, reason: str, *, aliases: tuple[str, ...] = (),
                     legacy: str = "") -> _Default:
        names = (name, *aliases)
        if five:
            return _Default(f"--prtemca {name}", ("--prtemca", name, value), reason,
                            mca=names, env=tuple(f"PRTE_MCA_{n}" for n in names),
                            ignored_env=(f"OMPI_MCA_{legacy}",) if legacy else ())
        return _Default(f"--mca {name}", ("--mca", name, value), reason, mca=names,
                        env=tuple(f"OMPI_MCA_{n}" for n in names))

    def mca(name: str, value: str, reason: str, *, aliases: tuple[str, ...] = ()) -> _Default:
        names = (name, *aliases)
        return _Default(f"--mca {name}", ("--mca", name, value), reason, mca=names,
                        env=tuple(f"OMPI_MCA_{n}" for n in names))

    if facts.is_root:
        b.add(_Default("--allow-run-as-root", ("--allow-run-as-root",),
                       "running as root (the container default)",
                       flags=("allow-run-as-root",),
                       env=("OMPI_ALLOW_RUN_AS_ROOT",)))
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(facts.mpi.mpirun)))
    if prefix in ("/usr", "/"):
        # mpirun started by its absolute path acts as if given --prefix of its install
        # directory (mpirun(1)): Ubuntu's 4.1.6 then put /usr/bin first in every rank's
        # PATH, and a bare `python3` left the image's venv.
        b.add(_Default("--noprefix", ("--noprefix",),
                       f"mpirun is in {prefix}/bin, already on every PATH; started by its "
                       f"absolute path, Open MPI would act as if given --prefix {prefix} and "
                       f"put {prefix}/bin first in the ranks' PATH (and {prefix}/lib in "
                       "LD_LIBRARY_PATH): the ranks keep the forwarded PATH",
                       flags=("prefix", "noprefix")))
    else:
        b.add(_Default("--prefix", ("--prefix", prefix),
                       "remote daemons find orted/prted and libraries without PATH setup "
                       "(mpi-operator #488)", flags=("prefix", "noprefix")))
    # The launcher that starts the remote daemons: rsh/ssh (the agent's ssh config). An
    # image's single-node setting (OMPI_MCA_plm=isolated: "All nodes which are allocated
    # for this job are already filled") is overridden for a multi-host job.
    plm = "ssh" if five else "rsh"
    b.add(_Default(f"{'--prtemca' if five else '--mca'} plm", ("--prtemca" if five else "--mca",
                                                              "plm", plm),
                   f"daemons start on the other hosts over {plm}", mca=("plm",),
                   env=("PRTE_MCA_plm",) if five else ("OMPI_MCA_plm",),
                   works=lambda v: _selects(v, plm) or (not five and _selects(v, "ssh")),
                   why="that launcher cannot start daemons on other hosts",
                   only_to_override=True))
    if five and "OMPI_MCA_plm" in facts.environ:
        b.decide("env OMPI_MCA_plm", facts.environ["OMPI_MCA_plm"], "env OMPI_MCA_plm",
                 "ignored by Open MPI 5 (PRRTE reads PRTE_MCA_plm); left as it is")
    b.add(b.np_default("-np", ("np", "n", "c")))
    b.hostfile("--hostfile", ("hostfile", "machinefile", "default-hostfile"),
               ("H", "host"),
               ("PRTE_MCA_prte_default_hostfile",) if five
               else ("OMPI_MCA_orte_default_hostfile",))
    b.add(_Default("--bind-to", ("--bind-to", "none"),
                   "containers share cores with their limits; let the OS place ranks",
                   flags=("bind-to", "bind-to-core", "bind-to-socket", "bindto"),
                   mca=("hwloc_base_binding_policy", "hwloc_default_binding_policy"),
                   env=("OMPI_MCA_hwloc_base_binding_policy",
                        "PRTE_MCA_hwloc_default_binding_policy")))
    b.add(_Default("--map-by", ("--map-by", "slot"),
                   "fill each host's slots in hostfile order",
                   flags=("map-by", "mapby", "npernode", "N", "ppr", "bynode", "byslot",
                          "npersocket", "rankfile"),
                   mca=("rmaps_base_mapping_policy", "rmaps_default_mapping_policy"),
                   env=("OMPI_MCA_rmaps_base_mapping_policy",
                        "PRTE_MCA_rmaps_default_mapping_policy")))
    btl = mca("btl", "self,tcp", "TCP between hosts, no vendor transports to probe")
    b.add(dataclasses.replace(
        btl, works=_has_network_btl,
        why="only on-node transports: ranks on different hosts could not reach each other"))
    b.add(mca("btl_tcp_if_include", ctl, "MPI traffic on the control (pod) network",
              aliases=("btl_tcp_if_exclude",)))
    if five:
        b.add(launch_param("oob_tcp_if_include", ctl, "daemon wire-up on the pod network",
                           aliases=("prte_if_include", "oob_tcp_if_exclude",
                                    "prte_if_exclude"), legacy="oob_tcp_if_include"))
    else:
        b.add(mca("oob_tcp_if_include", ctl, "daemon wire-up on the pod network",
                  aliases=("oob_tcp_if_exclude",)))
    b.add(mca("pml", "ob1", "the portable point-to-point layer that uses the btl above"))
    if five:
        b.decide("--mca routed", "(not added)", "agent default",
                 "Open MPI 5 (PRRTE) has no routed framework")
    else:
        b.add(mca("routed", "direct", "every daemon talks to mpirun directly: no tree of "
                  "daemon-to-daemon connections to fail"))
    agent = " ".join(facts.ssh_command)
    if five:
        b.add(launch_param("plm_ssh_agent", agent, "the agent's ssh settings",
                           aliases=("plm_rsh_agent",), legacy="plm_rsh_agent"))
        b.add(launch_param("prte_keep_fqdn_hostnames", "1",
                           "keep FQDNs: Open MPI cuts names at the first dot (ompi #2015)",
                           legacy="orte_keep_fqdn_hostnames"))
    else:
        b.add(mca("plm_rsh_agent", agent, "the agent's ssh settings",
                  aliases=("orte_rsh_agent",)))
        b.add(mca("orte_keep_fqdn_hostnames", "1",
                  "keep FQDNs: Open MPI cuts names at the first dot (ompi #2015)"))
    if five:
        b.add(launch_param("plm_ssh_no_tree_spawn", "1", NO_TREE_SPAWN,
                           aliases=("plm_rsh_no_tree_spawn",)))
    else:
        b.add(mca("plm_rsh_no_tree_spawn", "1", NO_TREE_SPAWN))
    b.add(mca("coll_ucc_enable", "0", "UCC collectives need a transport the pod may lack"))
    b.add(mca("coll_hcoll_enable", "0", "HCOLL needs Mellanox SHARP/UCX the pod may lack"))
    if five:
        b.decide("abort timeout", "(not added)", "agent default",
                 "PRRTE has no startup timeout parameter")
    elif facts.startup_timeout > 0:
        b.add(mca("orte_startup_timeout", f"{facts.startup_timeout:g}",
                  "abort instead of hanging when a daemon never reports back"))
    b.nccl_iface()
    names = b.forward()
    user_x = set(b.user.values("x")) if b.user else set()
    user_x = {v.split("=", 1)[0] for v in user_x}
    kept: list[str] = []
    for name in names:
        if name in user_x:
            b.decide(f"-x {name}", "(user's)", f"user flag -x {name}", "user wins")
            continue
        b.args.extend(["-x", name])
        kept.append(name)
    return b.spec(kept)


def transport_settings(facts: LaunchFacts) -> list[tuple[str, str, str]]:
    """hydra MPIs' traffic: (variable, value, why) for the agent's defaults.

    MPI traffic stays on the control network. Intel MPI: libfabric's tcp provider.
    MPICH built with both netmods: OFI with the tcp provider. Its UCX netmod hung in
    MPI_Dist_graph_create across pods (mpi4py's topology tests; tests/support/
    distgraph.c), and takes pods on one node for one host (same boot id) and tries
    shared memory between them, which separate pods cannot share: MPI_Init then failed
    with "Endpoint timeout" in half the runs. With UCX (chosen, or the only netmod):
    TCP only, on the control interface.
    """
    ctl = facts.control_iface
    tcp = ("FI_PROVIDER", "tcp", "libfabric's tcp provider reaches every pod; set "
           "FI_PROVIDER for your fabric's (verbs, efa)")
    iface = ("FI_TCP_IFACE", ctl, "libfabric's tcp provider carries MPI traffic on the "
             "control network")
    if facts.mpi.vendor == INTEL:
        return [iface]
    netmod = facts.environ.get("MPIR_CVAR_CH4_NETMOD", "").strip().lower()
    if netmod == "ofi" or (not netmod and "ofi" in facts.mpi.devices):
        chosen = [] if netmod else [
            ("MPIR_CVAR_CH4_NETMOD", "ofi", "MPICH's UCX netmod hung in MPI_Dist_graph_create "
             "across pods (mpi4py's topology tests); OFI passed them")]
        return [*chosen, tcp, iface]
    return [("UCX_NET_DEVICES", ctl, "MPICH's UCX netmod carries MPI traffic on the control "
             "network"),
            ("UCX_TLS", "tcp,self", "UCX would try shared memory between pods on one node "
             "(it sees one host) and MPI_Init times out; pods share no memory")]


def single_node_provider(facts: LaunchFacts) -> None:
    """FI_PROVIDER=shm reaches no other host: for a multi-host job, stop (64) and say
    what to do — which provider is right depends on the fabric, so the agent does not
    pick one over the image's choice."""
    value = facts.environ.get("FI_PROVIDER", "")
    providers = {p.strip().lower() for p in value.split(",") if p.strip()}
    netmod = facts.environ.get("MPIR_CVAR_CH4_NETMOD", "").strip().lower()
    uses_ofi = facts.mpi.vendor == INTEL or netmod == "ofi" or (
        not netmod and "ofi" in facts.mpi.devices)
    if facts.multi_host and uses_ofi and providers and providers <= {"shm"}:
        raise ConfigError([
            f"FI_PROVIDER={value!r} (from the image's environment?): libfabric's shm "
            "provider reaches no other host (Intel MPI's ranks died with SIGSEGV in "
            "libfabric when tried across pods); unset FI_PROVIDER, or set it to your "
            "fabric's provider (tcp, verbs, efa)"])


def _selects(value: str, component: str) -> bool:
    """Does an MCA component list (`rsh`, `rsh,slurm`, `^slurm`) allow `component`?"""
    names = value.strip().lstrip("^").split(",")
    return component not in names if value.strip().startswith("^") else component in names


ON_NODE_BTLS = frozenset({"self", "vader", "sm", "smcuda"})


def _has_network_btl(value: str) -> bool:
    """Does a BTL list reach other hosts (anything but self and shared memory)?"""
    if value.strip().startswith("^"):
        return "tcp" not in value.strip()[1:].split(",")
    return bool({b.strip() for b in value.split(",")} - ON_NODE_BTLS)


def _hydra(facts: LaunchFacts) -> LaunchSpec:
    b = _Builder(facts)
    intel = facts.mpi.vendor == INTEL
    ctl = facts.control_iface
    b.add(b.np_default("-n", ("n", "np")))
    b.hostfile("-f", ("f", "hostfile", "machinefile"), ("host", "hosts"),
               ("I_MPI_HYDRA_HOST_FILE",) if intel else ("HYDRA_HOST_FILE",))
    launch, launch_exec = ("-bootstrap", "-bootstrap-exec") if intel else (
        "-launcher", "-launcher-exec")
    env_prefix = "I_MPI_HYDRA_" if intel else "HYDRA_"
    boot_env = "BOOTSTRAP" if intel else "LAUNCHER"
    b.add(_Default(launch, (launch, "ssh"), "start proxies over ssh",
                   flags=("launcher", "bootstrap"), env=(f"{env_prefix}{boot_env}",),
                   works=lambda v: v.strip().lower() in ("ssh", "rsh"),
                   why="that launcher does not reach other hosts (with `fork`, MPICH ran "
                       "every rank on the launcher, and the job \"succeeded\")"))
    # hydra takes one path for the ssh program, so the options live in a wrapper script.
    if b.add(_Default(launch_exec, (launch_exec, facts.ssh_wrapper),
                      "hydra takes a single path: this wrapper adds the agent's ssh options",
                      flags=("launcher-exec", "bootstrap-exec"),
                      env=(f"{env_prefix}{boot_env}_EXEC",))):
        script = (
            "#!/bin/sh\n"
            "# Written by mpi-bootstrap: hydra's launcher-exec takes one path, so the ssh\n"
            "# options the agent needs live here.\n"
            f"exec {shlex.join(facts.ssh_command)} \"$@\"\n"
        )
        b.files.append(PlannedFile(facts.ssh_wrapper, script, 0o755, "ssh wrapper for hydra",
                                   shown=True))
    b.add(_Default("-iface", ("-iface", ctl), "proxies and ranks wire up on the pod network",
                   flags=("iface",), env=(f"{env_prefix}IFACE",)))
    for var, value, why in transport_settings(facts):
        if var in facts.environ:
            b.decide(var, "(user's)", f"env {var}", "user wins")
        else:
            b.env_set[var] = value
            b.decide(var, value, "agent default", why)
    single_node_provider(facts)
    b.nccl_iface()
    names = b.forward()
    spelled = b.user.has("genvlist", "genvall", "genvnone") if b.user else None
    env_override = "I_MPI_HYDRA_ENV" if intel and "I_MPI_HYDRA_ENV" in facts.environ else None
    if spelled or env_override:
        src = f"user flag {spelled}" if spelled else f"env {env_override}"
        b.decide("-genvlist", "(user's)", src,
                 "user wins: hydra accepts one environment setting; the agent's list "
                 "is not added")
        return b.spec([])
    if names:
        b.args.extend(["-genvlist", ",".join(names)])
        b.decide("-genvlist", f"{len(names)} names", "agent default",
                 "forward NCCL_*, UCX_*, LD_LIBRARY_PATH, PATH and FORWARD_ENV by name")
        if not intel:
            # MPICH 5.0.2's hydra never delivers the *last* variable of mpirun's
            # environment through -genvlist, even when listed (found by
            # tests/test_realmpi.py; Intel's hydra is fine). End the environment with a
            # variable nobody forwards, so that every listed one arrives.
            b.env_set[ENV_END] = "1"
            b.decide(f"env {ENV_END}", "1", "agent default",
                     "MPICH hydra drops the last environment variable from -genvlist; "
                     "this one is last and not forwarded")
    return b.spec(names)


def build(facts: LaunchFacts) -> LaunchSpec:
    """The mpirun argv, environment additions and files for `facts.mpi`."""
    if facts.mpi.runtime == HYDRA:
        return _hydra(facts)
    return _openmpi(facts)
