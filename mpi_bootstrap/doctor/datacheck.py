"""The doctor's data-plane checks: this pod's data NIC (present, addressed, its MTU, the
RDMA device behind it and the locked-memory limit RDMA needs), and, where a launcher
has written its pinned ssh config, the same test the launcher runs before mpirun (ring
and random pairs between the workers: ssh/datacheck.py), one finding per failure."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mpi_bootstrap.core import datanet
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import dataprobe, netif

ADVICE = "fix the data network before the job: NCCL hangs or fails on it"


def data_nic(config: Config) -> str | None:
    return datanet.choose(config.data_iface, "", netif.present(), DATA_IFACE_CANDIDATES)


def local(config: Config) -> list[Finding]:
    """This pod's data NIC, as the check's own program sees it."""
    own = socket.gethostname()
    nic = data_nic(config)
    if nic is None:
        return [Finding(own, "data NIC", True,
                        f"none of {', '.join(DATA_IFACE_CANDIDATES)} here: no data check")]
    facts = dataprobe.nic_facts(nic, config.sysfs)
    why = datanet.listener_problem(own, facts)
    if why is not None:
        return [Finding(own, "data NIC", False, why, ADVICE)]
    lock = facts["memlock"]
    rdma = ",".join(facts["rdma"]) or "none"
    return [Finding(own, "data NIC", True,
                    f"{nic} {' '.join(facts['addresses']) or '(no address)'} MTU "
                    f"{facts['mtu']}, RDMA {rdma}, locked memory "
                    f"{'unlimited' if lock == -1 else f'{lock} bytes'}")]


def network(config: Config, names: Sequence[str], deadline: float) -> list[Finding]:
    """The launcher's test between the workers, over its pinned ssh config (written by a
    launcher run in this pod); nothing when there is none, or when it is switched off."""
    cfg = os.path.join(config.state_dir, "ssh_config")
    nic = data_nic(config)
    if not config.data_check or nic is None or not names or not os.path.exists(cfg):
        return []
    try:
        found = datacheck.run(names, ("ssh", "-F", cfg), nic, python=sys.executable,
                              sysfs=config.sysfs, env=dict(os.environ), deadline=deadline,
                              log=_quiet)
    except PeerUnavailableError as exc:
        lines = (exc.details or exc.message.removeprefix("data network: ")).splitlines()
        return [Finding("data network", nic, False, line, ADVICE) for line in lines]
    mtus = sorted({f["mtu"] for f in found.values()})
    return [Finding("data network", nic, True,
                    f"{len(found)} workers, ring and random pairs: TCP and MTU {mtus} pass")]


def _quiet(event: str, /, level: str = "info", **keys: Any) -> None:
    """The doctor reports findings, not the check's log."""


def jobs(config: Config, names: Sequence[str], deadline: float
         ) -> list[Callable[[], list[Finding]]]:
    return [lambda: local(config), lambda: network(config, names, deadline - 0.2)]
