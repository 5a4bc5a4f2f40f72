"""What resolving a runtime's rows takes (the launch's facts) and gives (the spec)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap.core import nccl
from mpi_bootstrap.core.model import Decision, PlannedFile
from mpi_bootstrap.launcher.mpi.detect import MPIInfo


@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """What the rows are read against; gathered by the launcher, so resolving stays pure."""

    mpi: MPIInfo
    program: tuple[str, ...]
    hostfile: str  # the rewritten hostfile mpirun will read
    input_hostfile: str
    total_slots: int
    np: int | None
    np_source: str
    control_iface: str
    nccl_rule: nccl.Rule  # the NCCL_SOCKET_IFNAME the ranks get (core/nccl.py)
    environ: Mapping[str, str]
    is_root: bool
    ssh_command: tuple[str, ...]
    ssh_wrapper: str  # path of the hydra launcher-exec wrapper
    forward_patterns: tuple[str, ...]
    startup_timeout: float
    # The launch gate (core/gate.py), mpirun's ssh in place of ssh_command, when the
    # checks run beside mpirun; None: they run before it.
    ssh_gate: str | None = None
    multi_host: bool = True  # some rank runs on another host (over ssh)
    # Hosts of the hostfile that are this pod (mpirun starts their ranks without ssh):
    # the launch gate cannot hold what it never sees (launcher/mpi/gating.py).
    local_hosts: tuple[str, ...] = ()
    # Remote hosts mpirun gets by name where the runtime takes addresses (Gate.literal):
    # it resolves them itself, so the gate cannot hold what a second answer turns local.
    by_name: tuple[str, ...] = ()
    # The RDMA devices behind the data NICs, with where each was seen ("job-worker-1",
    # "mlx5_0"): NCCL_IB_HCA names exactly them.
    rdma: tuple[tuple[str, str], ...] = ()
    forward_source: str = "default"  # where forward_patterns came from


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env_set: Mapping[str, str]  # variables the agent adds to mpirun's environment
    forwarded: tuple[str, ...]
    files: tuple[PlannedFile, ...]
    decisions: tuple[Decision, ...]
    wrap: bool
    program_index: int  # where the user's program starts in argv
    # The launch gate's mode where mpirun's ssh is the gate (core/gate.py: gate.EACH or
    # gate.EVERY), None where it is not; and why (launcher/mpi/gating.py).
    gate: str | None = None
    gate_why: str = ""
