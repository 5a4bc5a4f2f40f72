"""What the launcher's planning works with: the facts it gathered (launcher/gather.py),
the hosts as mpirun will name them, and the Plan that `--explain` renders and the
executor carries out (launcher/plan.py makes it). Pure: values only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core import records
from mpi_bootstrap.core.datanet import DataNIC
from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.model import Answer, ClientKey, Decision, PlannedFile
from mpi_bootstrap.launcher import mpi


@dataclasses.dataclass(frozen=True)
class HostEntry:
    name: str  # as written in the input hostfile
    address: str | None  # first address the system resolver gave
    slots: int
    rewritten_to: str  # the name mpirun sees
    line: int

    def own_named(self, remote: Set[str], own_name: str) -> HostEntry:
        """A host of this pod's (not `remote`) by the pod's hostname `own_name`: the one
        name every MPI takes for its own node (Open MPI 5's PRRTE and Intel MPI's hydra
        ssh'd to Trainer v2's `<pod>.<subdomain>` of a launcher that runs ranks:
        tests/test_operators.py test_trainjob)."""
        if not own_name or self.rewritten_to in remote:
            return self
        return dataclasses.replace(self, rewritten_to=own_name)


@dataclasses.dataclass(frozen=True)
class Gathered:
    """Everything the launcher learned before planning."""

    environ: Mapping[str, str]
    hostfile: hf.Hostfile
    answers: Mapping[str, Answer]  # lookup name → last answer
    mpi: mpi.MPIInfo
    interfaces: frozenset[str]
    is_root: bool
    is_pid1: bool
    # SSH trust: the job's client key, and the records of the remote workers
    # by the name mpirun uses. Empty with MPI_BOOTSTRAP_EXCHANGE=none.
    client: ClientKey | None = None
    records: Mapping[str, records.Record] = dataclasses.field(default_factory=dict)
    remote: tuple[str, ...] = ()  # names mpirun reaches over ssh
    deadline: float = 0.0  # monotonic: DNS, records, sshd readiness and preflight share it
    rdma: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # own NICs
    # The interfaces NCCL could use here, in its order (system/netif.py nccl_order);
    # empty: `interfaces`, sorted.
    ifaces: tuple[str, ...] = ()
    # The key exchanges the launcher's ssh takes (`ssh -Q kex`), for the agent's choice
    # (core/kex.py); empty where it was not asked.
    ssh_kex: tuple[str, ...] = ()
    own_name: str = ""  # this pod's hostname (socket.gethostname)


@dataclasses.dataclass(frozen=True)
class Plan:
    mpi: mpi.MPIInfo
    hosts: tuple[HostEntry, ...]
    hostfile_path: str
    hostfile_text: str
    files: tuple[PlannedFile, ...]
    argv: tuple[str, ...]
    env_set: Mapping[str, str]
    forwarded: tuple[str, ...]
    decisions: tuple[Decision, ...]
    wrap: bool
    program_index: int  # argv[program_index:] is the user's program
    ssh_command: tuple[str, ...] = ("ssh",)
    ssh_targets: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    remote: tuple[str, ...] = ()
    preflight: bool = False
    prefix: str | None = None  # Open MPI's --prefix, where preflight looks for orted
    control_dir: str | None = None  # ssh's ControlPath directory (connection reuse)
    # The data NICs each worker tests before mpirun (core/nccl.py chose them); empty: off.
    data_check: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    data_value: str | None = None  # the NCCL_SOCKET_IFNAME the ranks get (None: unset)
    # The data NICs the workers' records name, by host: their check's reports must agree.
    published_data: Mapping[str, DataNIC] = dataclasses.field(default_factory=dict)
    # The launch gate (core/gate.py): mpirun starts with the checks, its ssh to a worker
    # waits for them. None: the checks run first, mpirun after them.
    gate: str | None = None  # gate.EACH or gate.EVERY
    # Each worker taken as soon as it is ready (launcher/pipeline.py), not every one first.
    pipeline: bool = False
    done_file: str | None = None  # dir exchange: `job-done`, written after success
    done_text: str = ""
    deadline: float = 0.0

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """mpirun's environment: the agent's own, then what the plan adds, in its order.

        Order matters: the plan's variables come last (see mpi.ENV_END).
        """
        # The agent's own secret never reaches mpirun (local ranks inherit its env).
        env = {k: v for k, v in public(environ).items() if k not in self.env_set}
        env.update(self.env_set)
        return env


def supervision(is_pid1: bool, exec_requested: bool) -> tuple[str, str]:
    """(mode, reason) for --explain: how the child will be run."""
    if exec_requested:
        return "exec", "--exec: the agent is replaced by mpirun (for images that run tini)"
    if is_pid1:
        return "pid1", "the agent is PID 1: it supervises mpirun, forwards signals, reaps"
    return "subreaper", (
        "not PID 1: the agent becomes a child subreaper so orphans are still reaped"
    )
