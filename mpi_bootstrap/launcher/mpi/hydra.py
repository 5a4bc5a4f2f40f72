"""The mpirun argv for hydra: MPICH and Intel MPI."""

from __future__ import annotations

import dataclasses
import shlex

from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.model import PlannedFile
from mpi_bootstrap.launcher.mpi import gating
from mpi_bootstrap.launcher.mpi.builder import OWN_AGENT, Builder, Default, LaunchFacts, LaunchSpec
from mpi_bootstrap.launcher.mpi.detect import INTEL

ENV_END = "MPI_BOOTSTRAP_ENV_END"  # sentinel that ends mpirun's environment (MPICH)


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


@dataclasses.dataclass(frozen=True)
class Hydra:
    """What differs between MPICH's hydra and Intel MPI's, one row each."""

    launch: str  # the option that picks how proxies start
    launch_exec: str  # the option that names the ssh program
    launch_env: str  # the variables that set them (…_EXEC for the program)
    env_prefix: str
    host_file_env: str


MPICH_ROW = Hydra("-launcher", "-launcher-exec", "HYDRA_LAUNCHER", "HYDRA_",
                  "HYDRA_HOST_FILE")
INTEL_ROW = Hydra("-bootstrap", "-bootstrap-exec", "I_MPI_HYDRA_BOOTSTRAP", "I_MPI_HYDRA_",
                  "I_MPI_HYDRA_HOST_FILE")


def _proxies(b: Builder, row: Hydra) -> None:
    """Proxies start over ssh, through a script that carries the agent's ssh options."""
    b.add(Default(row.launch, (row.launch, "ssh"), "start proxies over ssh",
                  flags=("launcher", "bootstrap"), env=(row.launch_env,),
                  works=lambda v: v.strip().lower() in ("ssh", "rsh"),
                  why="that launcher does not reach other hosts (with `fork`, MPICH ran "
                      "every rank on the launcher, and the job \"succeeded\")"))
    # hydra takes one path for the ssh program, so the options live in a script: the
    # launch gate where there is one (core/gate.py), else a wrapper.
    def exec_default(value: str, why: str) -> Default:
        return Default(row.launch_exec, (row.launch_exec, value),
                       f"hydra takes a single path: {why}",
                       flags=("launcher-exec", "bootstrap-exec"),
                       env=(f"{row.launch_env}_EXEC",))

    if b.f.ssh_gate:
        through = exec_default(b.f.ssh_gate, "the launch gate: ssh to a worker once every "
                               "check passed (core/gate.py)")
        mode, b.gate_why = (None, OWN_AGENT) if b.theirs(through) else \
            gating.hydra(b, ("launcher", "bootstrap"))
        if mode is not None:
            b.add(through)
            b.gate = mode
            return
    if b.add(exec_default(b.f.ssh_wrapper, "this wrapper adds the agent's ssh options")):
        script = (
            "#!/bin/sh\n"
            "# Written by mpi-bootstrap: hydra's launcher-exec takes one path, so the ssh\n"
            "# options the agent needs live here.\n"
            f"exec {shlex.join(b.f.ssh_command)} \"$@\"\n"
        )
        b.files.append(PlannedFile(b.f.ssh_wrapper, script, 0o755, "ssh wrapper for hydra",
                                   shown=True))


def build(facts: LaunchFacts) -> LaunchSpec:
    b = Builder(facts)
    intel = facts.mpi.vendor == INTEL
    row = INTEL_ROW if intel else MPICH_ROW
    b.add(b.np_default("-n", ("n", "np")))
    b.hostfile("-f", ("f", "hostfile", "machinefile"), ("host", "hosts"), (row.host_file_env,))
    _proxies(b, row)
    b.add(Default("-iface", ("-iface", facts.control_iface),
                  "proxies and ranks wire up on the pod network",
                  flags=("iface",), env=(f"{row.env_prefix}IFACE",)))
    for var, value, why in transport_settings(facts):
        if var in facts.environ:
            b.decide(var, "(user's)", f"env {var}", "user wins")
        else:
            b.env_set[var] = value
            b.decide(var, value, "agent default", why)
    single_node_provider(facts)
    b.nccl_iface()
    return _genvlist(b, intel)


def _genvlist(b: Builder, intel: bool) -> LaunchSpec:
    """Forward variables by name with -genvlist, unless the user chose hydra's env mode."""
    names = b.forward()
    spelled = b.user.has("genvlist", "genvall", "genvnone") if b.user else None
    env_override = "I_MPI_HYDRA_ENV" if intel and "I_MPI_HYDRA_ENV" in b.f.environ else None
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
