"""The doctor's data-plane checks: this pod's data NIC (present, addressed, its MTU, the
RDMA device behind it and the locked-memory limit RDMA needs), and, where a launcher
has written its pinned ssh config, the same test the launcher runs before mpirun (ring
and random pairs between the workers: ssh/datacheck.py), one finding per failure."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from mpi_bootstrap.core import datanet, nccl
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError, ConfigError, PeerUnavailableError
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.ssh import datacheck
from mpi_bootstrap.system import files, netif

ADVICE = "fix the data network before the job: NCCL hangs or fails on it"


def data_nics(config: Config) -> tuple[tuple[str, ...], str, nccl.Rule]:
    """This pod's data NICs (what NCCL would use here less the control interface), the
    rule that chose them in words, and the rule (core/nccl.py, as the launcher applies
    it; NCCL_SOCKET_IFNAME from this process's environment, as the ranks would get it)."""
    names = netif.nccl_order()
    rule = nccl.rule(config.data_iface, os.environ, names, DATA_IFACE_CANDIDATES)
    nics, why = rule.select(names)
    return nccl.data_of(nics, config.control_iface), f"{why}: {', '.join(nics) or 'none'}", rule


def local(config: Config) -> list[Finding]:
    """This pod's data NIC, as the check's own program sees it."""
    own = socket.gethostname()
    nics, why, rule = data_nics(config)
    if not nics:
        return [
            Finding(own, "data NIC", True, f"{why} (besides {config.control_iface}): no data check")
        ]
    nic = nics[0]
    report = dataprobe.nic_report(nic, config.sysfs)
    problem = datanet.listener_problem(own, report, rule.value)
    if problem is not None:
        return [Finding(own, "data NIC", False, problem, ADVICE)]
    lock = report["memlock"]
    rdma = ",".join(report["rdma"]) or "none"
    return [
        Finding(
            own,
            "data NIC",
            True,
            f"{why}; {nic} {' '.join(report['addresses']) or '(no address)'} MTU "
            f"{report['mtu']}, RDMA {rdma}, locked memory "
            f"{'unlimited' if lock == -1 else f'{lock} bytes'}",
        )
    ]


def state_dir(config: Config) -> tuple[Finding | None, Config]:
    """Whether the launcher would accept the state directory (system/files.py state_dir,
    without making or changing anything; `config` with the path it is reached by); None
    when there is none yet. The doctor reads nothing from a directory the launcher would
    refuse: someone else may have put it there (an ssh config's ProxyCommand runs as the
    doctor's user)."""
    try:
        held = files.state_dir(config.state_dir, create=False)
    except BootstrapError as exc:
        why = "; ".join(exc.problems) if isinstance(exc, ConfigError) else exc.message
        return Finding(
            config.state_dir,
            "state directory",
            False,
            f"would be refused: {why}",
            "nothing in it was used (the data network check was skipped); "
            "mount an emptyDir at the state directory itself, or choose another "
            "MPI_BOOTSTRAP_STATE_DIR",
        ), config
    ok = Finding(config.state_dir, "state directory", True, "private to this user")
    return (ok, dataclasses.replace(config, state_dir=held)) if held else (None, config)


def network(
    config: Config, names: Sequence[str], deadline: float, state: Finding | None
) -> list[Finding]:
    """The launcher's test between the workers, over its pinned ssh config (written by a
    launcher run in this pod); nothing when there is none, or when it is switched off.
    Only from a state directory the launcher would accept (`state`, from `state_dir`:
    its own finding says why not), and only a config file of this user's that nobody
    else may write: ssh runs what it says."""
    cfg = os.path.join(config.state_dir, "ssh_config")
    nics, _, rule = data_nics(config)
    if not config.data_check or not nics or not names or state is None or not state.ok:
        return []
    try:
        if not files.own_file(cfg):
            return []
    except files.UnsafeFileError as exc:
        return [
            Finding(
                cfg,
                "ssh config",
                False,
                f"not used: {exc}",
                "the data network check was skipped; remove the file (a launcher "
                "run writes it afresh)",
            )
        ]

    try:
        # Every worker is first asked for this pod's first data NIC (the doctor reads no
        # records); one that lacks it is asked again for the one NCCL's rule picks among
        # its own interfaces, and says so, naming them, where the rule picks none.
        nic = nics[0]
        found = datacheck.run(
            names,
            ("ssh", "-F", cfg),
            nic,
            sysfs=config.sysfs,
            env=dict(os.environ),
            deadline=deadline,
            log=_quiet,
            value=rule.value,
            choose=_chooser(rule, config.control_iface),
        )
    except PeerUnavailableError as exc:
        lines = (exc.details or exc.message.removeprefix("data network: ")).splitlines()
        return [Finding("data network", nic, False, line, ADVICE) for line in lines]
    mtus = sorted({f["mtu"] for f in found.values()})
    tested = ", ".join(dict.fromkeys(str(f["nic"]) for f in found.values()))
    summary = f"{len(found)} workers, ring and random pairs: TCP and MTU {mtus} pass"
    return [Finding("data network", tested, True, summary)]


def _chooser(rule: nccl.Rule, control: str) -> datacheck.Chooser:
    """A worker's data NIC by NCCL's rule on the interfaces it has, as the launcher
    chooses from its record (launcher/dataplan.py worker)."""

    def choose(have: tuple[str, ...]) -> str | None:
        selected = rule.select(have)[0]
        if not selected:
            return None  # NCCL fails there: said as the NIC it lacks, naming what it has
        theirs = nccl.data_of(selected, control)
        return theirs[0] if theirs else ""

    return choose


def _quiet(event: str, /, level: str = "info", **keys: Any) -> None:
    """The doctor reports findings, not the check's log."""


def jobs(
    config: Config, names: Sequence[str], deadline: float
) -> list[Callable[[], list[Finding]]]:
    state, config = state_dir(config)  # checked once, before anything of it is used
    return [
        lambda: local(config),
        lambda: [state] if state is not None else [],
        lambda: network(config, names, deadline - 0.2, state),
    ]
