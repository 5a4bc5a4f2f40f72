"""How mpirun's ssh reaches the workers, for the launcher's Plan: the ssh config with
the exchanged host keys pinned, connection reuse (ControlMaster), and the launch gate
(core/gate.py). Pure, as plan.py: facts in, files and decisions out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mpi_bootstrap.core import gate, kex
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.model import Decision, PlannedFile
from mpi_bootstrap.launcher import mpi
from mpi_bootstrap.launcher.model import Gathered, HostEntry
from mpi_bootstrap.ssh import sshconfig


def launch_gate(
    config: Config, facts: Gathered, spec: mpi.LaunchSpec, ssh_cmd: tuple[str, ...], preflight: bool
) -> tuple[str | None, list[PlannedFile], Decision]:
    """Whether mpirun starts beside the checks (core/gate.py): its mode, the gate
    script, and the decision that says so. The runtime's rows chose the mode, or why there is
    none (launcher/mpi/gating.py)."""
    source = str(config.source("preflight"))
    if spec.gate is None:
        why = (
            "no checks to wait for (preflight is off)"
            if not preflight
            else "--exec: no resident supervisor to carry the checks beside mpirun"
            if config.exec
            else spec.gate_why
        )
        return (
            None,
            [],
            Decision(
                "launch gate", "off", source, f"{why}: the checks, if any, run first, then mpirun"
            ),
        )
    if spec.gate == gate.EVERY:
        mode, last = gate.EVERY, None
        waits = f"every worker's ssh waits for every check and the data check: {spec.gate_why}"
    else:
        mode, last = gate.EACH, _holder(facts)
        waits = (
            f"its ssh to each worker waits until that worker's check passed, and the "
            f"one to {last} also for every check and the data check: {spec.gate_why}"
        )
    state = config.state_dir
    text = gate.script(state, ssh_cmd, mode, last)
    return (
        mode,
        [
            PlannedFile(
                f"{state}/{gate.SCRIPT}",
                text,
                0o700,
                "the launch gate: mpirun's ssh, once the checks passed",
                shown=True,
            )
        ],
        Decision(
            "launch gate",
            "on",
            source,
            f"mpirun starts with the checks, not after them; {waits}; a worker's failed check "
            "ends mpirun before any rank starts: exit 69",
        ),
    )


def _holder(facts: Gathered) -> str:
    """The worker whose gate also waits for every check (EACH): the last one known to be
    a worker, its name resolved to an address not this pod's. In a pipelined launch's
    first Plan a name not resolved yet may turn out to be this pod, whose ranks mpirun
    starts without ssh: its gate, never run, would hold nothing back."""
    known = (h for h in reversed(facts.remote) if (a := facts.answers.get(h)) is not None and a.ok)
    return next(known, facts.remote[-1])


def control_dir(config: Config, facts: Gathered, preflight: bool) -> tuple[str | None, Decision]:
    """Where ssh keeps preflight's connections for mpirun to reuse (or None), and why."""
    path: str | None = f"{config.state_dir}/cm"
    if not config.ssh_reuse or not config.ex.keyed or facts.client is None:
        why, path = (
            (
                "disabled"
                if not config.ssh_reuse
                else "no exchange: mpirun uses ssh as the image configures it"
            ),
            None,
        )
    elif not preflight:
        why, path = "no preflight: there is no connection to reuse", None
    elif path is not None and len(path) > sshconfig.MAX_CONTROL_DIR:
        why = (
            f"{path} is too long for a socket path (at most "
            f"{sshconfig.MAX_CONTROL_DIR} characters): set a shorter "
            "MPI_BOOTSTRAP_STATE_DIR"
        )
        path = None
    else:
        why = (
            f"preflight's ssh connection to each worker stays open (ControlMaster, "
            f"socket in {path}/, 0700) and mpirun's ssh runs over it: one handshake "
            "and one login per worker, not two"
        )
    return path, Decision(
        "ssh reuse", "on" if path else "off", str(config.source("ssh_reuse")), why
    )


@dataclasses.dataclass(frozen=True)
class SshSetup:
    """How mpirun reaches the workers: its ssh command, the files behind it (config,
    known_hosts, the key's copy), where each worker's sshd listens, and why."""

    command: tuple[str, ...]
    files: tuple[PlannedFile, ...]
    targets: Mapping[str, tuple[str, int]]
    decisions: tuple[Decision, ...]


def ssh_setup(
    config: Config, facts: Gathered, entries: list[HostEntry], control: str | None = None
) -> SshSetup:
    """The ssh command mpirun uses, the files behind it, and where each sshd listens."""
    if not config.ex.keyed or facts.client is None:
        why = f" ({config.exchange_reason})" if not config.ex.keyed else ""
        said = f"no exchange{why}: mpirun uses ssh as the image configures it"
        return SshSetup(
            ssh_command(config),
            (),
            {},
            (Decision("ssh trust", "none", str(config.source("exchange")), said),),
        )
    state = config.state_dir
    cfg_path, kh_path = f"{state}/ssh_config", f"{state}/known_hosts"
    by_new = {e.rewritten_to: e for e in entries}
    ps, kex_all, kex_said = _peers(config, facts, by_new)
    text = sshconfig.client_config(
        ps,
        identity=facts.client.path,
        known_hosts=kh_path,
        connect_timeout=config.ssh_connect_timeout,
        control_dir=control,
        kex=kex_all,
    )
    files = [
        PlannedFile(cfg_path, text, 0o600, "ssh client config: pinned host keys", shown=True),
        PlannedFile(
            kh_path,
            sshconfig.known_hosts(ps),
            0o644,
            "the workers' host keys, from the exchange",
            shown=True,
        ),
        *([facts.client.file] if facts.client.file is not None else []),
    ]
    targets = {
        new: (sshconfig.endpoint(new, rec), rec.port)
        for new, rec in facts.records.items()
        if new in by_new
    }
    decisions = (kex_said, *_servers(facts), *_stale_dns(facts, by_new), _trust(config, facts))
    return SshSetup(("ssh", "-F", cfg_path), tuple(files), targets, decisions)


def _peers(
    config: Config, facts: Gathered, by_new: Mapping[str, HostEntry]
) -> tuple[list[sshconfig.Peer], str | None, Decision]:
    """The workers as ssh reaches them (every name mpirun may use for each), and the key
    exchange offered: to all (`Host *`), and to a worker whose older sshd takes less."""
    names = {
        new: tuple(dict.fromkeys(n for n in (new, e.name, e.address) if n))
        for new, e in by_new.items()
    }
    recs = {n: r for n, r in facts.records.items() if n in names}
    ps = sshconfig.peers(recs, names, config.ssh_user)
    kex_all, said = kex.decision(
        config.ssh_kex,
        str(config.source("ssh_kex")),
        facts.ssh_kex,
        [(n, kex.version_of(r.openssh)) for n, r in recs.items()],
    )
    if kex_all and config.ssh_kex is None:  # the agent's choice: an older sshd, its own
        ps = [
            dataclasses.replace(
                p, kex=kex.for_worker(facts.ssh_kex, kex.version_of(recs[p.names[0]].openssh))
            )
            if p.names[0] in recs
            else p
            for p in ps
        ]
    return ps, kex_all, said


def _servers(facts: Gathered) -> tuple[Decision, ...]:
    """Which ssh server the workers published that they run (a record's `server`); none
    said where no record is read (the `secret` exchange)."""
    own = sorted(n for n, r in facts.records.items() if r.server == "agent")
    others = len(facts.records) - len(own)
    said = [f"the agent's own on {', '.join(own)}"] if own else []
    said += [f"OpenSSH's sshd on {others} worker{'s' * (others != 1)}"] if others else []
    why = "as each worker published it (MPI_BOOTSTRAP_SSH_SERVER on the worker)"
    return (Decision("workers' ssh server", "; ".join(said), "exchange record", why),) * bool(said)


def _stale_dns(facts: Gathered, by_new: Mapping[str, HostEntry]) -> list[Decision]:
    """A worker whose published address is not the one DNS gives (an earlier pod's)."""
    out = []
    for new, rec in facts.records.items():
        dns_addr = by_new[new].address if new in by_new else None
        if rec.addresses and dns_addr and dns_addr not in rec.addresses:
            out.append(
                Decision(
                    f"ssh endpoint {new}",
                    rec.addresses[0],
                    "exchange record",
                    f"WARNING: DNS says {dns_addr}, the worker published {rec.addresses[0]}: "
                    "ssh uses the published address (stale DNS of an earlier pod?)",
                )
            )
    return out


def _trust(config: Config, facts: Gathered) -> Decision:
    how = config.ex.trust.format(c=config)
    known = f"; {len(facts.records)} of {len(facts.remote)} remote workers known"
    return Decision("ssh trust", config.exchange, str(config.source("exchange")), how + known)


def ssh_command(config: Config) -> tuple[str, ...]:
    """The ssh client command mpirun's launcher uses to reach workers.

    BatchMode: a PID 1 has no terminal, so a password or host-key prompt would hang the
    job instead of failing it. With an exchange, `ssh -F` and a per-host config with
    pinned host keys replace it (ssh_setup).
    """
    return ("ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={config.ssh_connect_timeout}")
