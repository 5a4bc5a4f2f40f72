"""What every argv builder shares: the facts in, the spec out, and the rule that the
user wins.

Every agent default can be overridden by the user, either with the same flag in their
own mpirun command (wrap mode) or with the MPI's own environment variable; the user wins
and the plan records why (DeepSpeed #4460). The one exception is a value that cannot
work for a multi-host job (`Default.works`): the agent overrides it and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from mpi_bootstrap.core import nccl
from mpi_bootstrap.core.model import Decision, PlannedFile
from mpi_bootstrap.launcher.mpi.command import HOSTFILE_OPTIONS, scan_user_command
from mpi_bootstrap.launcher.mpi.detect import MPIInfo, is_launcher
from mpi_bootstrap.launcher.mpi.env import forwarded_names


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
    # The RDMA devices behind the data NICs, with where each was seen ("job-worker-1",
    # "mlx5_0"): NCCL_IB_HCA names exactly them.
    rdma: tuple[tuple[str, str], ...] = ()


# Why the launch gate is off when mpirun's ssh is the user's own.
OWN_AGENT = "the user's own ssh agent for mpirun (it would not wait)"


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


@dataclasses.dataclass(frozen=True)
class Default:
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
    # remote hosts the agent overrides them, and says so (docs/configuration.md "Settings the image
    # brings"). None: every value is the user's.
    works: Callable[[str], bool] | None = None
    why: str = ""  # why such a value cannot work
    only_to_override: bool = False  # add nothing unless a value must be overridden


class Builder:
    def __init__(self, facts: LaunchFacts) -> None:
        self.f = facts
        self.wrap = is_launcher(facts.program)
        self.user = scan_user_command(facts.program, facts.mpi.runtime) if self.wrap else None
        self.user_mca = self.user.mca_names() if self.user else set()
        self.args: list[str] = []
        self.env_set: dict[str, str] = {}
        self.decisions: list[Decision] = []
        self.files: list[PlannedFile] = []
        self.gate: str | None = None  # the launch gate's mode (LaunchSpec.gate)
        self.gate_why = ""

    def decide(self, setting: str, value: str, source: str, reason: str) -> None:
        self.decisions.append(Decision(setting, value, source, reason))

    def theirs(self, d: Default) -> str | None:
        """Where the user set `d` so that their setting wins (`user flag --novm`, `env
        OMPI_MCA_plm`), or None."""
        if self.user and (spelled := self.user.has(*d.flags)):
            return f"user flag {spelled}"
        for name in d.mca:
            if name in self.user_mca:
                return f"user flag --mca {name}"
        for var in d.env:  # the first one set: the agent overrides a value that cannot work
            if var in self.f.environ:
                theirs = self.f.environ[var]
                works = d.works is None or d.works(theirs) or not self.f.multi_host
                return f"env {var}" if works else None
        return None

    def add(self, d: Default) -> bool:
        """Add `d` unless the user set it; record the decision either way."""
        value = d.args[-1] if len(d.args) > 1 else "on"
        if source := self.theirs(d):
            self.decide(d.setting, "(user's)", source,
                        f"user wins: agent default {value!r} not added")
            return False
        for var in d.env:
            if var not in self.f.environ:
                continue
            theirs = self.f.environ[var]
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

    def np_default(self, flag: str, flags: tuple[str, ...]) -> Default:
        count = self.f.np if self.f.np is not None else self.f.total_slots
        why = (f"from {self.f.np_source}" if self.f.np is not None
               else f"sum of slots in the hostfile ({self.f.total_slots})")
        return Default("ranks", (flag, str(count)), why, flags=flags)

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
        """NCCL_SOCKET_IFNAME as the rule says (the user's, or the agent's data NIC, or
        unset), and NCCL_IB_HCA: the RDMA devices behind the data NICs."""
        r = self.f.nccl_rule
        if r.by_agent and r.value is not None:
            self.env_set[nccl.SOCKET_IFNAME] = r.value
            self.decide(nccl.SOCKET_IFNAME, r.value, "agent default",
                        f"NCCL data on the data interface ({r.why}); control stays on "
                        f"{self.f.control_iface}")
        elif r.value is not None:
            self.decide(nccl.SOCKET_IFNAME, "(user's)", f"env {nccl.SOCKET_IFNAME}",
                        f"user wins: NCCL reads {r.value!r} as written")
        else:
            self.decide(nccl.SOCKET_IFNAME, "(unset)", "agent default",
                        "no data interface (net1, dranet0) found; NCCL picks its own")
        self.ib_hca()

    def ib_hca(self) -> None:
        if not self.f.rdma:
            return
        devices = [dev for _, dev in self.f.rdma]
        seen = "; ".join(f"{where}: {dev}" for where, dev in self.f.rdma[:4])
        more = f" (+{len(self.f.rdma) - 4} more)" if len(self.f.rdma) > 4 else ""
        theirs = nccl.given(self.f.environ, nccl.IB_HCA)
        if theirs is not None:
            taken = nccl.hca_select(theirs, sorted(set(devices)))
            self.decide(nccl.IB_HCA, "(user's)", f"env {nccl.IB_HCA}",
                        f"user wins: of the RDMA devices behind the data NICs ({seen}{more}) "
                        f"it selects {', '.join(taken)}" if taken else
                        f"user wins, but WARNING: it selects none of the RDMA devices "
                        f"behind the data NICs ({seen}{more})")
            return
        value = nccl.ib_hca(devices)
        self.env_set[nccl.IB_HCA] = value
        self.decide(nccl.IB_HCA, value, "detected",
                    f"the RDMA devices behind the data NICs (sysfs device/infiniband): "
                    f"{seen}{more}; NCCL uses no other HCA in the pod")

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
                          program_index=start, gate=self.gate, gate_why=self.gate_why)
