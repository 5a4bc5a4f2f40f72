"""hydra, MPICH's process manager, and Intel MPI's (built from it): one runtime each.
MPI traffic stays on the control network: Intel MPI over libfabric's tcp provider, MPICH
over OFI's tcp provider where built with it, else UCX with TCP only. Why not MPICH's UCX
netmod: docs/configuration.md, "Found while testing against the real MPIs".
"""

from __future__ import annotations

import dataclasses
import re
import types

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.runtimes.schema import (
    Default,
    EnvDefault,
    Facts,
    Gate,
    Hostfile,
    LaunchExec,
    NameList,
    Ranks,
    Refuse,
    Row,
    Runtime,
)

OPTIONS = types.MappingProxyType(
    {
        **dict.fromkeys(["genv", "env"], 2),
        **dict.fromkeys(
            [
                "n",
                "np",
                "f",
                "hostfile",
                "machinefile",
                "machine",
                "host",
                "hosts",
                "ppn",
                "perhost",
                "rr",
                "genvlist",
                "envlist",
                "launcher",
                "launcher-exec",
                "bootstrap",
                "bootstrap-exec",
                "iface",
                "wdir",
                "configfile",
                "rmk",
                "demux",
                "binding",
                "bind-to",
                "map-by",
                "topolib",
                "profile",
                "errfile-pattern",
                "outfile-pattern",
                "prepend-pattern",
                "gpus-per-proc",
                "gdb",
                "ilp64",
                "tune",
                "umask",
                "nameserver",
                "localhost",
                "usize",
                "hosts-group",
                "ranks-per-proc",
                "membind",
                "gtool",
                "tmpdir",
                "hostlist",
                "machines",
                "machinelist",
            ],
            1,
        ),
    }
)

HYDRA_PMI, HYDRA_BSTRAP = "hydra_pmi_proxy", "hydra_bstrap_proxy"
LAUNCHERS = ("launcher", "bootstrap")  # the user's options that choose the launcher
# User options that name the hosts themselves (a hostfile of the user's is not one: the
# agent reads it as the input hostfile, checks its hosts and rewrites it).
HOST_LISTS = (
    "host",
    "hosts",
    "hostlist",
    "machine",
    "machines",
    "machinelist",
    "hosts-group",
    "configfile",
    "rmk",
    "localhost",
)
GATE = Gate(
    host_lists=Default("", (), "", flags=HOST_LISTS),
    each=False,
    why="a hydra proxy starts its ranks as soon as it connects, and no host of the "
    "hostfile is this pod",
    local="{local} in the hostfile is this pod: hydra forks that host's proxy without the "
    "launcher-exec, and its ranks start at once",
    literal=True,
)
ENV_MODES = ("genvlist", "genvall", "genvnone")  # the user's choice of how env travels
NETMOD = "MPIR_CVAR_CH4_NETMOD"


def _netmod(f: Facts) -> str:
    return f.environ.get(NETMOD, "").strip().lower()


def ofi(f: Facts) -> bool:
    """MPICH carries MPI traffic over OFI: chosen, or built with it and nothing chosen."""
    return _netmod(f) == "ofi" or (not _netmod(f) and "ofi" in f.mpi.devices)


def multi_node_provider(value: str) -> bool:
    """FI_PROVIDER=shm reaches no other host (which provider is right depends on the
    fabric, so the agent does not pick one over the image's choice)."""
    providers = {p.strip().lower() for p in value.split(",") if p.strip()}
    return not providers or not providers <= {"shm"}


def _launch(
    option: str, env: str, hosts_env: str, iface_env: str, hostfile: str = "-f"
) -> tuple[Row, ...]:
    """Ranks, hosts and proxies: the same options for MPICH's hydra and Intel's, read
    from variables of their own; `hostfile`, the option that honours `host:N`."""
    return (
        Ranks("-n", ("n", "np")),
        Hostfile(hostfile, ("f", "hostfile", "machinefile"), ("host", "hosts"), (hosts_env,)),
        Default(
            option,
            (option, "ssh"),
            "start proxies over ssh",
            flags=LAUNCHERS,
            env=(env,),
            works=lambda v: v.strip().lower() in ("ssh", "rsh"),
            why="that launcher does not reach other hosts (with `fork`, MPICH ran "
            'every rank on the launcher, and the job "succeeded")',
        ),
        LaunchExec(f"{option}-exec", f"{env}_EXEC", ("launcher-exec", "bootstrap-exec"), LAUNCHERS),
        Default(
            "-iface",
            ("-iface", "{control_iface}"),
            "proxies and ranks wire up on the pod network",
            flags=("iface",),
            env=(iface_env,),
        ),
    )


TCP_IFACE = EnvDefault(
    "FI_TCP_IFACE",
    "{control_iface}",
    "libfabric's tcp provider carries MPI traffic on the control network",
)
SHM = Refuse(
    "FI_PROVIDER",
    multi_node_provider,
    "libfabric's shm provider reaches no other host (Intel MPI's ranks died with "
    "SIGSEGV in libfabric when tried across pods); unset FI_PROVIDER, or set it to "
    "your fabric's provider (tcp, verbs, efa)",
)

MPICH = Runtime(
    name="hydra",
    vendor="mpich",
    version=re.compile(r"HYDRA build details:.*?Version:\s+(\S+)", re.S),
    choices=("mpich",),
    daemons=(HYDRA_PMI,),
    hostfile_form=hf.HYDRA,
    options=OPTIONS,
    rows=(
        *_launch("-launcher", "HYDRA_LAUNCHER", "HYDRA_HOST_FILE", "HYDRA_IFACE"),
        EnvDefault(
            NETMOD,
            "ofi",
            "MPICH's UCX netmod hung in MPI_Dist_graph_create across "
            "pods (mpi4py's topology tests); OFI passed them",
            when=lambda f: not _netmod(f) and "ofi" in f.mpi.devices,
        ),
        EnvDefault(
            "FI_PROVIDER",
            "tcp",
            "libfabric's tcp provider reaches every pod; set "
            "FI_PROVIDER for your fabric's (verbs, efa)",
            when=ofi,
        ),
        dataclasses.replace(TCP_IFACE, when=ofi),
        EnvDefault(
            "UCX_NET_DEVICES",
            "{control_iface}",
            "MPICH's UCX netmod carries MPI traffic on the control network",
            when=lambda f: not ofi(f),
        ),
        EnvDefault(
            "UCX_TLS",
            "tcp,self",
            "UCX would try shared memory between pods on one "
            "node (it sees one host) and MPI_Init times out; pods share no memory",
            when=lambda f: not ofi(f),
        ),
        dataclasses.replace(SHM, when=ofi),
    ),
    gate=GATE,
    # MPICH 5.0.2's hydra never delivers the *last* variable of mpirun's environment
    # through -genvlist, even when listed (found by tests/test_realmpi.py; Intel's hydra
    # is fine): mpirun's environment ends with a variable nobody forwards.
    forward=NameList(
        "-genvlist",
        ENV_MODES,
        last="MPICH hydra drops the last environment variable from -genvlist; "
        "this one is last and not forwarded",
    ),
)

INTEL = Runtime(
    name="hydra",
    vendor="intel",
    version=re.compile(r"Intel\(R\) MPI Library.*?Version\s+(\S+?),*(?:\s|$)"),
    detected_first=True,  # its hydra is MPICH's: output naming both is Intel MPI's
    choices=("intel",),
    daemons=(HYDRA_BSTRAP, HYDRA_PMI),
    hostfile_form=hf.HYDRA,
    options=OPTIONS,
    rows=(
        # -machinefile, not -f: Intel MPI 2021.18 reads only the names of `-f`'s `host:N`
        # and fills the first host's cores (`-n 2` over two `host:1` lines ran both ranks
        # on the first host: tests/test_operators.py test_trainjob[intel-as-node]; MPI
        # Operator's I_MPI_PERHOST hid it).
        *_launch(
            "-bootstrap",
            "I_MPI_HYDRA_BOOTSTRAP",
            "I_MPI_HYDRA_HOST_FILE",
            "I_MPI_HYDRA_IFACE",
            hostfile="-machinefile",
        ),
        TCP_IFACE,
        SHM,
        EnvDefault(
            "I_MPI_HYDRA_BRANCH_COUNT",
            "-1",
            "every proxy started from the launcher, through its gate and pinned keys: past "
            "127 hosts Intel MPI starts proxies from proxies, and a worker has no key to "
            "another",
        ),
    ),
    gate=GATE,
    forward=NameList("-genvlist", ENV_MODES, mode_env="I_MPI_HYDRA_ENV"),
)
