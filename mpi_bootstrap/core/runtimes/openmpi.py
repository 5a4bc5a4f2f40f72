"""Open MPI's two runtimes: ORTE (4.x) and PRRTE (5.x).

Open MPI 5 moved launch parameters to PRRTE: they go through --prtemca and PRTE_MCA_*;
the 4.x names (OMPI_MCA_orte_*, plm_rsh_*) are silently ignored there (mpi-operator #731,
#842; trainer #4028). MPI-layer parameters (btl, pml, coll) are --mca in both.
"""

from __future__ import annotations

import dataclasses
import re
import types

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.runtimes.schema import (
    Absent,
    Default,
    EachName,
    Facts,
    Gate,
    Hostfile,
    LaunchLayer,
    Note,
    Param,
    Ranks,
    Row,
    RshAgent,
    Runtime,
)

VERSION = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+\.\d+(?:\.\d+)?\S*)")

# mpirun's options that take values (wrap mode must know where the program starts, so
# that a `--mca` among the program's own arguments is not mistaken for one).
OPTIONS = types.MappingProxyType(
    {
        **dict.fromkeys(["mca", "gmca", "prtemca", "pmixmca", "omca", "am", "tune"], 2),
        **dict.fromkeys(
            [
                "np",
                "n",
                "c",
                "H",
                "host",
                "hostfile",
                "machinefile",
                "default-hostfile",
                "x",
                "bind-to",
                "map-by",
                "rank-by",
                "prefix",
                "wdir",
                "wd",
                "path",
                "timeout",
                "output-filename",
                "output",
                "npernode",
                "N",
                "npersocket",
                "ppr",
                "cpus-per-proc",
                "cpus-per-rank",
                "launch-agent",
                "report-uri",
                "app",
                "rankfile",
                "cpu-set",
                "preload-files",
                "s",
                "stdin",
                "xterm",
                "personality",
                "runtime-options",
                "hnp",
                "set-cwd-to-session-dir",
                "mapby",
                "rankby",
                "bindto",
                "display",
                "dvm",
                "pmixam",
                "forward-signals",
                "report-pid",
                "add-hostfile",
                "add-host",
                "max-vm-size",
            ],
            1,
        ),
    }
)

NO_TREE_SPAWN = (
    "mpirun reaches every worker itself: only the launcher needs ssh "
    "credentials, and tree spawn hangs past ~64 hosts (ompi #4465)"
)
KEEP_FQDN = "keep FQDNs: Open MPI cuts names at the first dot (ompi #2015)"
ON_NODE_BTLS = frozenset({"self", "vader", "sm", "smcuda"})


def major_at_least(version: str, major: int) -> bool:
    first = version.split(".", 1)[0]
    return first.isdigit() and int(first) >= major


def has_network_btl(value: str) -> bool:
    """Does a BTL list reach other hosts (anything but self and shared memory)?"""
    if value.strip().startswith("^"):
        return "tcp" not in value.strip()[1:].split(",")
    return bool({b.strip() for b in value.split(",")} - ON_NODE_BTLS)


def as_root(f: Facts) -> bool:
    return f.is_root


def system_prefix(f: Facts) -> bool:
    return f.mpi.prefix in ("/usr", "/")


def startup_timeout(f: Facts) -> bool:
    return f.startup_timeout > 0


def mca(name: str, value: str, reason: str, *aliases: str) -> Default:
    """An MPI-layer parameter: --mca and OMPI_MCA_* in both runtimes."""
    names = (name, *aliases)
    return Default(
        f"--mca {name}",
        ("--mca", name, value),
        reason,
        mca=names,
        env=tuple(f"OMPI_MCA_{n}" for n in names),
    )


def plm(layer: LaunchLayer) -> Default:
    """The plm, added only over an image's single-node setting (OMPI_MCA_plm=isolated:
    "All nodes which are allocated for this job are already filled") in a multi-host job."""
    return Default(
        f"{layer.flag} plm",
        (layer.flag, "plm", layer.plm),
        f"daemons start on the other hosts over {layer.plm}",
        mca=("plm",),
        env=(f"{layer.env_prefix}plm",),
        works=layer.reaches,
        why="that launcher cannot start daemons on other hosts",
        only_to_override=True,
    )


# Who runs, from where: root, and the install prefix.
START: tuple[Row, ...] = (
    Default(
        "--allow-run-as-root",
        ("--allow-run-as-root",),
        "running as root (the container default)",
        flags=("allow-run-as-root",),
        env=("OMPI_ALLOW_RUN_AS_ROOT",),
        when=as_root,
    ),
    # mpirun started by its absolute path acts as if given --prefix of its install
    # directory (mpirun(1)): Ubuntu's 4.1.6 then put /usr/bin first in every rank's
    # PATH, and a bare `python3` left the image's venv.
    Default(
        "--noprefix",
        ("--noprefix",),
        "mpirun is in {prefix}/bin, already on every PATH; started by its absolute "
        "path, Open MPI would act as if given --prefix {prefix} and put {prefix}/bin "
        "first in the ranks' PATH (and {prefix}/lib in LD_LIBRARY_PATH): the ranks "
        "keep the forwarded PATH",
        flags=("prefix", "noprefix"),
        when=system_prefix,
    ),
    Default(
        "--prefix",
        ("--prefix", "{prefix}"),
        "remote daemons find orted/prted and libraries without PATH setup (mpi-operator #488)",
        flags=("prefix", "noprefix"),
        when=lambda f: not system_prefix(f),
    ),
)
RANKS = Ranks("-np", ("np", "n", "c"))
HOST_FLAGS = ("hostfile", "machinefile", "default-hostfile")
# Where ranks go, and which network carries MPI traffic.
PLACEMENT: tuple[Row, ...] = (
    Default(
        "--bind-to",
        ("--bind-to", "none"),
        "containers share cores with their limits; let the OS place ranks",
        flags=("bind-to", "bind-to-core", "bind-to-socket", "bindto"),
        mca=("hwloc_base_binding_policy", "hwloc_default_binding_policy"),
        env=("OMPI_MCA_hwloc_base_binding_policy", "PRTE_MCA_hwloc_default_binding_policy"),
    ),
    Default(
        "--map-by",
        ("--map-by", "slot"),
        "fill each host's slots in hostfile order",
        flags=(
            "map-by",
            "mapby",
            "npernode",
            "N",
            "ppr",
            "bynode",
            "byslot",
            "npersocket",
            "rankfile",
        ),
        mca=("rmaps_base_mapping_policy", "rmaps_default_mapping_policy"),
        env=("OMPI_MCA_rmaps_base_mapping_policy", "PRTE_MCA_rmaps_default_mapping_policy"),
    ),
    dataclasses.replace(
        mca("btl", "self,tcp", "TCP between hosts, no vendor transports to probe"),
        works=has_network_btl,
        why="only on-node transports: ranks on different hosts could not reach each other",
    ),
    mca(
        "btl_tcp_if_include",
        "{control_iface}",
        "MPI traffic on the control (pod) network",
        "btl_tcp_if_exclude",
    ),
)
PML = mca("pml", "ob1", "the portable point-to-point layer that uses the btl above")
COLLECTIVES = (
    mca("coll_ucc_enable", "0", "UCC collectives need a transport the pod may lack"),
    mca("coll_hcoll_enable", "0", "HCOLL needs Mellanox SHARP/UCX the pod may lack"),
)
OOB = "daemon wire-up on the pod network"
HOST_LISTS = ("H", "host", "rankfile", "app", "add-host", "add-hostfile")

# ORTE's virtual machine, pinned where the user did not set it (an MCA parameter file
# may: the command line wins over it): a daemon on every host of the hostfile before any
# rank starts, which mode EACH needs (`ompi_info --level 9`: orte_no_vm, synonym
# state_novm_select; orte_max_vm_size, whose 0 is no limit).
WHY_VM = (
    "the launch gate: a daemon on every host of the hostfile (ORTE's virtual "
    "machine, whatever an MCA parameter file says), so the last worker's holds "
    "every rank back"
)
NO_VM = Default(
    "--mca orte_no_vm",
    ("--mca", "orte_no_vm", "0"),
    WHY_VM,
    flags=("novm",),
    mca=("orte_no_vm", "state_novm_select"),
    env=("OMPI_MCA_orte_no_vm", "OMPI_MCA_state_novm_select"),
)
MAX_VM = Default(
    "--mca orte_max_vm_size",
    ("--mca", "orte_max_vm_size", "0"),
    WHY_VM,
    flags=("max-vm-size",),
    mca=("orte_max_vm_size",),
    env=("OMPI_MCA_orte_max_vm_size",),
)
# ORTE takes a hostfile name for its own node where it equals its hostname, or (unless
# told not to resolve) where DNS answers it with an address this pod holds: a second
# answer, stale or hostile, would then start that worker's ranks here without ssh,
# unchecked (SECURITY.md 32). The agent resolved and checked every worker, and names
# this pod's own entry by its hostname (launcher/model.py `own_named`). PRRTE needs no
# pin: it took no such answer for its own (tests/test_pipeline.py
# test_a_second_answer_naming_this_pod).
NO_RESOLVE = Default(
    "--mca if_base_do_not_resolve",
    ("--mca", "if_base_do_not_resolve", "1"),
    "the launch gate: ORTE tells this pod from the workers by name alone, never by a "
    "DNS answer the agent did not check (SECURITY.md 32)",
    mca=("if_base_do_not_resolve",),
    env=("OMPI_MCA_if_base_do_not_resolve",),
    works=lambda v: v.strip().lower() in ("1", "true", "yes", "on"),
    why="ORTE would take a worker whose name DNS answers with this pod's address for this "
    "pod, and start its ranks without ssh or a check",
)
ORTE_HOST_LIST_MCA = ("orte_default_dash_host", "orte_rankfile", "rmaps_rank_file_path")

ORTE_LAYER = LaunchLayer("--mca", "OMPI_MCA_", "rsh", ("rsh", "ssh"))
ORTE = Runtime(
    name="orte",
    vendor="openmpi",
    version=VERSION,
    choices=("openmpi", "openmpi4"),
    versions=lambda v: not major_at_least(v, 5),
    daemons=("orted",),
    hostfile_form=hf.OPENMPI,
    options=OPTIONS,
    rows=(
        *START,
        plm(ORTE_LAYER),
        RANKS,
        Hostfile("--hostfile", HOST_FLAGS, ("H", "host"), ("OMPI_MCA_orte_default_hostfile",)),
        *PLACEMENT,
        ORTE_LAYER.param(
            Param("oob_tcp_if_include", ("oob_tcp_if_exclude",)), "{control_iface}", OOB
        ),
        PML,
        mca(
            "routed",
            "direct",
            "every daemon talks to mpirun directly: no tree of "
            "daemon-to-daemon connections to fail",
        ),
        RshAgent(ORTE_LAYER, Param("plm_rsh_agent", ("orte_rsh_agent",))),
        ORTE_LAYER.param(Param("orte_keep_fqdn_hostnames"), "1", KEEP_FQDN),
        ORTE_LAYER.param(Param("plm_rsh_no_tree_spawn"), "1", NO_TREE_SPAWN),
        *COLLECTIVES,
        dataclasses.replace(
            mca(
                "orte_startup_timeout",
                "{startup_timeout:g}",
                "abort instead of hanging when a daemon never reports back",
            ),
            when=startup_timeout,
        ),
    ),
    gate=Gate(
        host_lists=Default(
            "",
            (),
            "",
            flags=HOST_LISTS,
            mca=ORTE_HOST_LIST_MCA,
            env=tuple(f"OMPI_MCA_{n}" for n in ORTE_HOST_LIST_MCA),
        ),
        each=True,
        label="ORTE",
        why="ORTE starts a daemon on every host of the hostfile, and no rank before every "
        "daemon has reported",
        fewer=(NO_VM, MAX_VM),
        pins=(NO_VM, MAX_VM, NO_RESOLVE),
        resolves=NO_RESOLVE,
    ),
    forward=EachName("-x"),
)

PRRTE_LAYER = LaunchLayer("--prtemca", "PRTE_MCA_", "ssh", ("ssh",))
PRRTE = Runtime(
    name="prrte",
    vendor="openmpi",
    version=VERSION,
    choices=("openmpi", "openmpi5"),
    versions=lambda v: major_at_least(v, 5),
    daemons=("prted",),
    hostfile_form=hf.OPENMPI,
    options=OPTIONS,
    rows=(
        *START,
        plm(PRRTE_LAYER),
        Note("OMPI_MCA_plm", "ignored by Open MPI 5 (PRRTE reads PRTE_MCA_plm); left as it is"),
        RANKS,
        Hostfile("--hostfile", HOST_FLAGS, ("H", "host"), ("PRTE_MCA_prte_default_hostfile",)),
        *PLACEMENT,
        PRRTE_LAYER.param(
            Param(
                "oob_tcp_if_include",
                ("prte_if_include", "oob_tcp_if_exclude", "prte_if_exclude"),
                legacy="oob_tcp_if_include",
            ),
            "{control_iface}",
            OOB,
        ),
        PML,
        Absent("--mca routed", "Open MPI 5 (PRRTE) has no routed framework"),
        RshAgent(PRRTE_LAYER, Param("plm_ssh_agent", ("plm_rsh_agent",), legacy="plm_rsh_agent")),
        PRRTE_LAYER.param(
            Param("prte_keep_fqdn_hostnames", legacy="orte_keep_fqdn_hostnames"), "1", KEEP_FQDN
        ),
        PRRTE_LAYER.param(
            Param("plm_ssh_no_tree_spawn", ("plm_rsh_no_tree_spawn",)), "1", NO_TREE_SPAWN
        ),
        *COLLECTIVES,
        Absent("abort timeout", "PRRTE has no startup timeout parameter"),
    ),
    gate=Gate(
        host_lists=Default("", (), "", flags=HOST_LISTS),
        each=True,
        label="PRRTE",
        why="PRRTE starts a daemon on every host of the hostfile, and no rank before every "
        "daemon has reported",
        # Open MPI 5.0.11's prterun still started a daemon on every host with
        # `--max-vm-size 1` (plm_base_verbose); its help says fewer: taken at its word.
        # PRRTE has no --novm.
        fewer=(Default("", (), "", flags=("max-vm-size",)),),
    ),
    forward=EachName("-x"),
)
