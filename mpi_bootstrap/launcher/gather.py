"""Gather what the launcher's Plan is a function of: the MPI (from `mpirun --version`),
the hostfile, every host's address (the DNS wait), this pod's interfaces, the job's
client key and the workers' records. All the launcher's I/O before planning is here.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.errors import (
    ConfigError,
    DNSTimeoutError,
    ExecError,
    ExitStatus,
    HostfileError,
    some,
)
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import Answer, Decision
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.launcher import mpi as mpimod
from mpi_bootstrap.launcher.hosts import host_entries
from mpi_bootstrap.launcher.model import Gathered
from mpi_bootstrap.proc import children
from mpi_bootstrap.proc.spawn import resolve
from mpi_bootstrap.ssh import peers
from mpi_bootstrap.system import account, dns, hostfile_reader, netif

RESOLV_CONF = "/etc/resolv.conf"
ETC_HOSTS = "/etc/hosts"


def find_mpi(
    config: Config, environ: Mapping[str, str]
) -> tuple[mpimod.MPIInfo, dict[str, str], list[Decision]]:
    """Locate mpirun, ask it `--version`, and return the environment mpirun will get."""
    env = public(environ)
    path, notes = _mpirun_path(config, env)
    bindir = os.path.dirname(os.path.abspath(path))
    if bindir not in env.get("PATH", "").split(os.pathsep):
        # Intel's mpirun is a script that runs `mpiexec.hydra` from PATH.
        env["PATH"] = bindir + os.pathsep + env.get("PATH", os.defpath)
        why = "mpirun's own directory must be on PATH for its helpers"
        notes.append(Decision("PATH", f"{bindir} prepended", "agent default", why))
    code, text = children.capture([path, "--version"], env=env)
    # The install prefix decides --prefix/--noprefix: a fact, gathered here, so the
    # builders stay pure.
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    info = mpimod.identify(text, path, config.mpi, str(config.source("mpi")), prefix=prefix)
    if code != 0 and info.source == "detected":
        why = f"`{path} --version` exited {code} but named its MPI"
        notes.append(Decision("mpi", info.vendor, "detected", why))
    if config.mpi != "auto" and (found := mpimod.overridden(text, info)):
        why = f"overrides the detected {found[0]} {found[1]}"
        notes.append(Decision("mpi", info.vendor, str(config.source("mpi")), why))
    return info, env, notes


def _mpirun_path(config: Config, env: Mapping[str, str]) -> tuple[str, list[Decision]]:
    """The mpirun to run: the user's own command's, else the setting's, else PATH's."""
    notes: list[Decision] = []
    if mpimod.is_launcher(config.program):
        wanted, source = config.program[0], "the user's command"
        if config.mpirun:
            why = f"user wins over {config.source('mpirun')}"
            notes.append(Decision("mpirun", config.program[0], "user command", why))
    else:
        wanted = config.mpirun or "mpirun"
        source = str(config.source("mpirun")) if config.mpirun else "PATH"
    path = resolve(wanted, env.get("PATH"))
    if path is None:
        raise ExecError(
            f"{wanted}: command not found (from {source}; set MPI_BOOTSTRAP_MPIRUN "
            "or put the MPI's bin directory on PATH)",
            ExitStatus.NOT_FOUND,
        )
    return path, notes


def input_hostfile(config: Config, info: mpimod.MPIInfo) -> tuple[str, list[Decision]]:
    """The hostfile to read: the configured one, or the one the user's mpirun names."""
    if not mpimod.is_launcher(config.program):
        return config.hostfile, []
    user = mpimod.scan_user_command(config.program, info.runtime)
    named = [v for key in mpimod.HOSTFILE_OPTIONS for v in user.values(key)]
    if not named:
        return config.hostfile, []
    theirs = named[0]
    if config.source("hostfile").kind != "default" and os.path.normpath(theirs) != os.path.normpath(
        config.hostfile
    ):
        raise ConfigError(
            [
                f"{config.source('hostfile')} names {config.hostfile} but the "
                f"user's mpirun command names {theirs}; use one"
            ]
        )
    return theirs, [
        Decision("input hostfile", theirs, "user command", "named by the user's mpirun command")
    ]


def wait_for_dns(
    config: Config,
    hostfile: hf.Hostfile,
    own_name: str,
    log: Log,
    *,
    resolved: Callable[[Answer], None] | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Answer]:
    """Resolve every host (and the launcher itself) or raise DNSTimeoutError. Each name
    that resolves is handed to `resolved` as it does (the pipelined launch); `stop` ends
    the wait early, unresolved names then said as on the deadline."""
    answers: dict[str, Answer] = {}
    names: list[str] = []
    for host in hostfile.hosts:
        name = hf.lookup_name(host.name, config.rewrite, config.cluster_domain)
        if is_ip_literal(name):
            answers[name] = Answer(name, addresses=(name,))
        else:
            names.append(name)
    if own_name and own_name not in names:
        names.append(own_name)  # remote daemons connect back to the launcher by name

    def on_answer(answer: Answer, previous: Answer | None) -> None:
        if answer.ok:
            log("DNS OK", host=answer.name, address=answer.addresses[0])
            if resolved is not None:
                resolved(answer)
        elif previous is None or previous.error_kind != answer.error_kind:
            log("DNS WAIT", host=answer.name, reason=answer.error_kind, detail=answer.detail)

    rate = dns.lookup_rate(len(names), config.dns_wait_interval)
    # --explain is a dry run wherever it runs (a laptop, CI): one round, no waiting; the
    # plan marks what did not resolve (gather's `DNS` decision).
    wait = 0.0 if config.explain else config.dns_wait_seconds
    log("DNS wait", hosts=len(names), deadline_s=wait, max_lookups_per_s=round(rate, 1))
    result = dns.wait_for(
        names,
        lookup=dns.SystemResolver(RESOLV_CONF),
        deadline=wait,
        interval=config.dns_wait_interval,
        concurrency=config.dns_concurrency,
        on_answer=on_answer,
        stop=stop,
    )
    answers.update(result.answers)
    log(
        "DNS done",
        resolved=len(names) - len(result.unresolved),
        unresolved=len(result.unresolved),
        lookups=result.lookups,
        elapsed_s=round(result.elapsed, 3),
    )
    if not result.ok and not config.explain and not (stop is not None and stop.is_set()):
        failing = [result.answers[n] for n in result.unresolved]
        raise dns_timeout(config, hostfile, failing, len(names), own_name)
    return answers


def dns_timeout(
    config: Config, hostfile: hf.Hostfile, failing: list[Answer], asked: int, own_name: str
) -> DNSTimeoutError:
    """Names that did not resolve by the deadline: which, and what the doctor finds."""
    summary = some([f"{a.name} ({a.error_kind})" for a in failing], shown=5)
    from mpi_bootstrap.doctor import diagnose

    doctor = diagnose.for_dump([a.name for a in failing[:16]])
    return DNSTimeoutError(
        f"DNS: {len(failing)} of {asked} names did not resolve within "
        f"{config.dns_wait_seconds:g} s: {summary}",
        details=dns_dump(hostfile, failing, own_name) + "\n--- doctor (each "
        "nameserver asked directly)\n" + doctor,
        host=failing[0].name,
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        return f"(cannot read: {exc.strerror})\n"


def dns_dump(hostfile: hf.Hostfile, failing: list[Answer], own_name: str) -> str:
    """What a person needs to see when the DNS wait times out."""
    parts = [
        f"--- hostfile {hostfile.path}",
        hostfile.text.rstrip("\n"),
        f"--- {RESOLV_CONF}",
        _read(RESOLV_CONF).rstrip("\n"),
        f"--- {ETC_HOSTS}",
        _read(ETC_HOSTS).rstrip("\n"),
        "--- unresolved names (last error)",
    ]
    for a in failing:
        who = " (this launcher's own hostname)" if a.name == own_name else ""
        hint = "" if a.transient else "  <- the resolver itself is failing"
        parts.append(f"{a.name}{who}: {a.error_kind}: {a.detail}{hint}")
    return "\n".join(parts)


def read_hostfile(config: Config, path: str) -> hf.Hostfile:
    """The hostfile; a missing default one says where it comes from and how to name
    another."""
    try:
        return hostfile_reader.read(path)
    except HostfileError as exc:
        if config.source("hostfile").kind == "default" and exc.message.endswith("not found"):
            exc.message += (
                " (the default path, where MPI Operator mounts the job's "
                "hostfile; name another with --hostfile or MPI_HOSTFILE)"
            )
            exc.args = (exc.message,)
        raise


def dns_decision(config: Config, answers: Mapping[str, Answer]) -> Decision:
    """--explain's one DNS round: what did not resolve here, and what the launcher would
    do about it."""
    unresolved = sorted(n for n, a in answers.items() if not a.ok)
    if not unresolved:
        return Decision(
            "DNS",
            f"{len(answers)} of {len(answers)} resolved",
            "one lookup",
            "every name resolved here",
        )
    return Decision(
        "DNS",
        f"{len(unresolved)} of {len(answers)} unresolved",
        "one lookup (--explain)",
        f"not resolved here: {some(unresolved, shown=5)}; the launcher would wait up to "
        f"{config.dns_wait_seconds:g} s for them (MPI_DNS_WAIT_SECONDS), then exit 68; what "
        "depends on their addresses (--rewrite ip, local or remote, records, preflight) "
        "is planned as if they stay unresolved",
    )


def before_dns(
    config: Config, environ: Mapping[str, str], log: Log
) -> tuple[Gathered, list[Decision], Config]:
    """What this pod alone says: the MPI, the hostfile, its interfaces, the job's client
    key and its ssh's key exchanges; the workers remote by name (an address may make one
    local later: `resolved`). No host resolved, no record read; `config` as it returns."""
    # One deadline for DNS, the workers' records, sshd readiness and preflight.
    deadline = time.monotonic() + config.dns_wait_seconds
    log("exchange", mode=config.exchange, reason=config.exchange_reason)
    for warning in config.token_warnings:
        log("token exposed", level="warning", reason=warning)
    info, env, notes = find_mpi(config, environ)
    log("MPI", vendor=info.vendor, version=info.version, mpirun=info.mpirun)
    path, more = input_hostfile(config, info)
    notes.extend(more)
    hostfile = read_hostfile(config, path)
    if not config.explain:  # the state directory, once the hostfile was read
        config, env = account.settle(config, env, log)
    interfaces = netif.present()
    facts = Gathered(
        environ=env,
        hostfile=hostfile,
        answers={},
        mpi=info,
        interfaces=interfaces,
        rdma={
            nic: tuple(devs)
            for nic in interfaces
            if (devs := dataprobe.rdma_devices(nic, config.sysfs))
        },
        is_root=os.geteuid() == 0,
        is_pid1=os.getpid() == 1,
        deadline=deadline,
        own_name=socket.gethostname(),
    )
    remote = remote_hosts(config, facts)
    return (
        dataclasses.replace(
            facts,
            client=peers.client_key(config, write=not config.explain, log=log),
            remote=tuple(new for _, new, _ in remote),
            ssh_kex=ssh_kex(config, env, bool(remote)),
        ),
        notes,
        config,
    )


def remote_hosts(config: Config, facts: Gathered) -> list[tuple[str, str, str | None]]:
    """(name in the hostfile, name mpirun uses, address) of each host mpirun reaches
    over ssh, by the answers so far (none: by name alone)."""
    own, mine = socket.gethostname(), frozenset(netif.addresses())
    return [
        (e.name, e.rewritten_to, e.address)
        for e in host_entries(config, facts.hostfile, facts.answers)
        if not peers.is_local(e.rewritten_to, e.address, own, mine)
    ]


def resolved(config: Config, facts: Gathered, answers: Mapping[str, Answer], log: Log) -> Gathered:
    """The facts with every host's address, and the records of the remote workers."""
    facts = dataclasses.replace(facts, answers=dict(answers))
    remote = remote_hosts(config, facts)
    records = {}
    if facts.client is not None and remote:
        records = peers.collect(
            config, remote, facts.client, facts.deadline, log, fetch=not config.explain
        )
        log("records", exchange=config.exchange, found=len(records), remote=len(remote))
    return dataclasses.replace(facts, records=records, remote=tuple(new for _, new, _ in remote))


def ssh_kex(config: Config, env: Mapping[str, str], remote: bool) -> tuple[str, ...]:
    """The key exchanges this pod's ssh takes, where the agent chooses one (core/kex.py):
    a name ssh does not know in its config fails every connection."""
    if config.ssh_kex is not None or not config.ex.keyed or not remote:
        return ()
    code, out = children.capture(["ssh", "-Q", "kex"], env=env, timeout=5.0)
    return tuple(out.split()) if code == 0 else ()
