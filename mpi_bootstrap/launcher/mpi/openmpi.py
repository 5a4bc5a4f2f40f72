"""The mpirun argv for Open MPI: ORTE (4.x) and PRRTE (5.x), their differences a table.

Open MPI 5 moved launch parameters to PRRTE: they go through --prtemca and PRTE_MCA_*;
the 4.x names (OMPI_MCA_orte_*, plm_rsh_*) are silently ignored there (mpi-operator #731,
#842; trainer #4028). MPI-layer parameters (btl, pml, coll) are --mca in both.
"""

from __future__ import annotations

import dataclasses

from mpi_bootstrap.launcher.mpi import gating
from mpi_bootstrap.launcher.mpi.builder import OWN_AGENT, Builder, Default, LaunchFacts, LaunchSpec
from mpi_bootstrap.launcher.mpi.detect import PRRTE

NO_TREE_SPAWN = ("mpirun reaches every worker itself: only the launcher needs ssh "
                 "credentials, and tree spawn hangs past ~64 hosts (ompi #4465)")
KEEP_FQDN = "keep FQDNs: Open MPI cuts names at the first dot (ompi #2015)"
# Runs the launch gate: the agent's first word must exist on every worker too.
GATE_SHELL = "/bin/sh"
ON_NODE_BTLS = frozenset({"self", "vader", "sm", "smcuda"})


@dataclasses.dataclass(frozen=True)
class Param:
    """A launch-layer parameter: its name, other names that set it, and the Open MPI 4
    name users still set that this runtime ignores."""

    name: str
    aliases: tuple[str, ...] = ()
    legacy: str = ""


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Everything that differs between ORTE and PRRTE, one row each."""

    flag: str  # how launch parameters are given: --mca | --prtemca
    env_prefix: str  # and read from the environment: OMPI_MCA_ | PRTE_MCA_
    plm: str  # the remote launcher component
    plm_accepts: tuple[str, ...]  # plm values that still reach other hosts
    default_hostfile_env: str
    oob: Param
    ssh_agent: Param
    keep_fqdn: Param
    no_tree_spawn: Param
    routed: bool  # has the routed framework
    startup_timeout: str  # parameter that aborts a hung start-up ("" = none)

    def param(self, p: Param, value: str, reason: str) -> Default:
        names = (p.name, *p.aliases)
        return Default(f"{self.flag} {p.name}", (self.flag, p.name, value), reason, mca=names,
                       env=tuple(f"{self.env_prefix}{n}" for n in names),
                       ignored_env=(f"OMPI_MCA_{p.legacy}",) if p.legacy else ())


ORTE_ROW = Runtime(
    flag="--mca", env_prefix="OMPI_MCA_", plm="rsh", plm_accepts=("rsh", "ssh"),
    default_hostfile_env="OMPI_MCA_orte_default_hostfile",
    oob=Param("oob_tcp_if_include", ("oob_tcp_if_exclude",)),
    ssh_agent=Param("plm_rsh_agent", ("orte_rsh_agent",)),
    keep_fqdn=Param("orte_keep_fqdn_hostnames"),
    no_tree_spawn=Param("plm_rsh_no_tree_spawn"),
    routed=True, startup_timeout="orte_startup_timeout")
PRRTE_ROW = Runtime(
    flag="--prtemca", env_prefix="PRTE_MCA_", plm="ssh", plm_accepts=("ssh",),
    default_hostfile_env="PRTE_MCA_prte_default_hostfile",
    oob=Param("oob_tcp_if_include",
              ("prte_if_include", "oob_tcp_if_exclude", "prte_if_exclude"),
              legacy="oob_tcp_if_include"),
    ssh_agent=Param("plm_ssh_agent", ("plm_rsh_agent",), legacy="plm_rsh_agent"),
    keep_fqdn=Param("prte_keep_fqdn_hostnames", legacy="orte_keep_fqdn_hostnames"),
    no_tree_spawn=Param("plm_ssh_no_tree_spawn", ("plm_rsh_no_tree_spawn",)),
    routed=False, startup_timeout="")


def mca(name: str, value: str, reason: str, *, aliases: tuple[str, ...] = ()) -> Default:
    """An MPI-layer parameter: --mca and OMPI_MCA_* in both runtimes."""
    names = (name, *aliases)
    return Default(f"--mca {name}", ("--mca", name, value), reason, mca=names,
                   env=tuple(f"OMPI_MCA_{n}" for n in names))


def selects(value: str, component: str) -> bool:
    """Does an MCA component list (`rsh`, `rsh,slurm`, `^slurm`) allow `component`?"""
    names = value.strip().lstrip("^").split(",")
    return component not in names if value.strip().startswith("^") else component in names


def has_network_btl(value: str) -> bool:
    """Does a BTL list reach other hosts (anything but self and shared memory)?"""
    if value.strip().startswith("^"):
        return "tcp" not in value.strip()[1:].split(",")
    return bool({b.strip() for b in value.split(",")} - ON_NODE_BTLS)


def _start(b: Builder, rt: Runtime) -> None:
    """Who runs, from where, started how: root, prefix, remote launcher, ranks, hosts."""
    f = b.f
    if f.is_root:
        b.add(Default("--allow-run-as-root", ("--allow-run-as-root",),
                      "running as root (the container default)",
                      flags=("allow-run-as-root",), env=("OMPI_ALLOW_RUN_AS_ROOT",)))
    prefix = f.mpi.prefix
    if prefix in ("/usr", "/"):
        # mpirun started by its absolute path acts as if given --prefix of its install
        # directory (mpirun(1)): Ubuntu's 4.1.6 then put /usr/bin first in every rank's
        # PATH, and a bare `python3` left the image's venv.
        b.add(Default("--noprefix", ("--noprefix",),
                      f"mpirun is in {prefix}/bin, already on every PATH; started by its "
                      f"absolute path, Open MPI would act as if given --prefix {prefix} and "
                      f"put {prefix}/bin first in the ranks' PATH (and {prefix}/lib in "
                      "LD_LIBRARY_PATH): the ranks keep the forwarded PATH",
                      flags=("prefix", "noprefix")))
    else:
        b.add(Default("--prefix", ("--prefix", prefix),
                      "remote daemons find orted/prted and libraries without PATH setup "
                      "(mpi-operator #488)", flags=("prefix", "noprefix")))
    # An image's single-node setting (OMPI_MCA_plm=isolated: "All nodes which are
    # allocated for this job are already filled") is overridden for a multi-host job.
    b.add(Default(f"{rt.flag} plm", (rt.flag, "plm", rt.plm),
                  f"daemons start on the other hosts over {rt.plm}", mca=("plm",),
                  env=(f"{rt.env_prefix}plm",),
                  works=lambda v: any(selects(v, c) for c in rt.plm_accepts),
                  why="that launcher cannot start daemons on other hosts",
                  only_to_override=True))
    if rt is PRRTE_ROW and "OMPI_MCA_plm" in f.environ:
        b.decide("env OMPI_MCA_plm", f.environ["OMPI_MCA_plm"], "env OMPI_MCA_plm",
                 "ignored by Open MPI 5 (PRRTE reads PRTE_MCA_plm); left as it is")
    b.add(b.np_default("-np", ("np", "n", "c")))
    b.hostfile("--hostfile", ("hostfile", "machinefile", "default-hostfile"), ("H", "host"),
               (rt.default_hostfile_env,))


def _placement_and_transport(b: Builder, rt: Runtime) -> None:
    """Where ranks go and which network carries MPI traffic and daemon wire-up."""
    ctl = b.f.control_iface
    b.add(Default("--bind-to", ("--bind-to", "none"),
                  "containers share cores with their limits; let the OS place ranks",
                  flags=("bind-to", "bind-to-core", "bind-to-socket", "bindto"),
                  mca=("hwloc_base_binding_policy", "hwloc_default_binding_policy"),
                  env=("OMPI_MCA_hwloc_base_binding_policy",
                       "PRTE_MCA_hwloc_default_binding_policy")))
    b.add(Default("--map-by", ("--map-by", "slot"),
                  "fill each host's slots in hostfile order",
                  flags=("map-by", "mapby", "npernode", "N", "ppr", "bynode", "byslot",
                         "npersocket", "rankfile"),
                  mca=("rmaps_base_mapping_policy", "rmaps_default_mapping_policy"),
                  env=("OMPI_MCA_rmaps_base_mapping_policy",
                       "PRTE_MCA_rmaps_default_mapping_policy")))
    b.add(dataclasses.replace(
        mca("btl", "self,tcp", "TCP between hosts, no vendor transports to probe"),
        works=has_network_btl,
        why="only on-node transports: ranks on different hosts could not reach each other"))
    b.add(mca("btl_tcp_if_include", ctl, "MPI traffic on the control (pod) network",
              aliases=("btl_tcp_if_exclude",)))
    b.add(rt.param(rt.oob, ctl, "daemon wire-up on the pod network"))
    b.add(mca("pml", "ob1", "the portable point-to-point layer that uses the btl above"))
    if rt.routed:
        b.add(mca("routed", "direct", "every daemon talks to mpirun directly: no tree of "
                  "daemon-to-daemon connections to fail"))
    else:
        b.decide("--mca routed", "(not added)", "agent default",
                 "Open MPI 5 (PRRTE) has no routed framework")


def _daemons(b: Builder, rt: Runtime) -> None:
    """How daemons are started and what optional components are kept out."""
    if b.f.ssh_gate:
        # Through /bin/sh: every daemon is given mpirun's MCA parameters and looks the
        # agent's first word up on its own host, where the gate (the launcher's file) is
        # not: orted then failed, and mpirun waited for it (seen in containers).
        agent = rt.param(rt.ssh_agent, f"{GATE_SHELL} {b.f.ssh_gate}",
                         "the launch gate: ssh to a worker once its checks passed "
                         "(core/gate.py), run by a shell every worker has")
        mode, b.gate_why = (None, OWN_AGENT) if b.theirs(agent) else \
            gating.openmpi(b, orte=rt is ORTE_ROW, plm=_user_plm(b, rt), pins=_plm_pin(b, rt))
        if mode is not None:
            b.add(agent)
            b.gate = mode
    if b.gate is None:
        b.add(rt.param(rt.ssh_agent, " ".join(b.f.ssh_command), "the agent's ssh settings"))
    b.add(rt.param(rt.keep_fqdn, "1", KEEP_FQDN))
    b.add(rt.param(rt.no_tree_spawn, "1", NO_TREE_SPAWN))
    b.add(mca("coll_ucc_enable", "0", "UCC collectives need a transport the pod may lack"))
    b.add(mca("coll_hcoll_enable", "0", "HCOLL needs Mellanox SHARP/UCX the pod may lack"))
    if not rt.startup_timeout:
        b.decide("abort timeout", "(not added)", "agent default",
                 "PRRTE has no startup timeout parameter")
    elif b.f.startup_timeout > 0:
        b.add(mca(rt.startup_timeout, f"{b.f.startup_timeout:g}",
                  "abort instead of hanging when a daemon never reports back"))


def _user_plm(b: Builder, rt: Runtime) -> str | None:
    """The plm the user chose (a flag, or a variable the agent does not override)."""
    flag = b.user.mca_value("plm") if b.user else None
    value = flag if flag is not None else b.f.environ.get(f"{rt.env_prefix}plm")
    if flag is None and value is not None and \
            not any(selects(value, c) for c in rt.plm_accepts):
        return None  # overridden by the agent's own (_start)
    return value


def _plm_pin(b: Builder, rt: Runtime) -> tuple[Default, ...]:
    """The agent's plm, where nothing of the user's or the image's environment names one
    (_start added it where a variable names one that cannot work): an MCA parameter file
    may (`plm = isolated` runs a local host's ranks with no daemon to wait for)."""
    if "plm" in b.user_mca or f"{rt.env_prefix}plm" in b.f.environ:
        return ()
    return (Default(f"{rt.flag} plm", (rt.flag, "plm", rt.plm),
                    f"the launch gate: daemons start over {rt.plm} only, whatever an MCA "
                    "parameter file says", mca=("plm",)),)


def _forward(b: Builder) -> list[str]:
    """`-x NAME` per forwarded variable, except those the user's own -x names."""
    names = b.forward()
    user_x = {v.split("=", 1)[0] for v in b.user.values("x")} if b.user else set()
    kept: list[str] = []
    for name in names:
        if name in user_x:
            b.decide(f"-x {name}", "(user's)", f"user flag -x {name}", "user wins")
            continue
        b.args.extend(["-x", name])
        kept.append(name)
    return kept


def build(facts: LaunchFacts) -> LaunchSpec:
    b = Builder(facts)
    rt = PRRTE_ROW if facts.mpi.runtime == PRRTE else ORTE_ROW
    _start(b, rt)
    _placement_and_transport(b, rt)
    _daemons(b, rt)
    b.nccl_iface()
    return b.spec(_forward(b))
