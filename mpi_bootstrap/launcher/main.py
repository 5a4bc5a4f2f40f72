"""The launcher role: gather facts, build the Plan, then explain it or carry it out.

    config → mpirun --version → hostfile → DNS wait → Plan → (--explain | write + run)
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.env import public
from mpi_bootstrap.core.errors import (
    ConfigError,
    DNSTimeoutError,
    ExecError,
    ExitStatus,
    PeerUnavailableError,
)
from mpi_bootstrap.core.model import Answer, Decision
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.launcher import mpi as mpimod
from mpi_bootstrap.launcher import preflight, render
from mpi_bootstrap.launcher.plan import Facts, Plan, build_plan, host_entries, lookup_name
from mpi_bootstrap.proc import children, handoff
from mpi_bootstrap.proc.spawn import resolve
from mpi_bootstrap.ssh import peers
from mpi_bootstrap.system import dns, files, hostfiles, netif
from mpi_bootstrap.system import log as logmod

RESOLV_CONF = "/etc/resolv.conf"
ETC_HOSTS = "/etc/hosts"


def find_mpi(config: Config, environ: Mapping[str, str]) -> tuple[
        mpimod.MPIInfo, dict[str, str], list[Decision]]:
    """Locate mpirun, ask it `--version`, and return the environment mpirun will get."""
    env = public(environ)
    notes: list[Decision] = []
    if mpimod.is_launcher(config.program):
        wanted, source = config.program[0], "the user's command"
        if config.mpirun:
            notes.append(Decision("mpirun", config.program[0], "user command",
                                  f"user wins over {config.source('mpirun')}"))
    else:
        wanted = config.mpirun or "mpirun"
        source = str(config.source("mpirun")) if config.mpirun else "PATH"
    path = resolve(wanted, env.get("PATH"))
    if path is None:
        raise ExecError(f"{wanted}: command not found (from {source}; set MPI_BOOTSTRAP_MPIRUN "
                        "or put the MPI's bin directory on PATH)", ExitStatus.NOT_FOUND)
    bindir = os.path.dirname(os.path.abspath(path))
    if bindir not in env.get("PATH", "").split(os.pathsep):
        # Intel's mpirun is a script that runs `mpiexec.hydra` from PATH.
        env["PATH"] = bindir + os.pathsep + env.get("PATH", os.defpath)
        notes.append(Decision("PATH", f"{bindir} prepended", "agent default",
                              "mpirun's own directory must be on PATH for its helpers"))
    code, text = children.capture([path, "--version"], env=env)
    # The install prefix decides --prefix/--noprefix: a fact, gathered here, so the
    # builders stay pure.
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    info = mpimod.identify(text, path, config.mpi, str(config.source("mpi")), prefix=prefix)
    if code != 0 and info.source == "detected":
        notes.append(Decision("mpi", info.vendor, "detected",
                              f"`{path} --version` exited {code} but named its MPI"))
    if config.mpi != "auto":
        found = mpimod.parse_version(text)
        if found and found[0] != info.vendor:
            notes.append(Decision("mpi", info.vendor, str(config.source("mpi")),
                                  f"overrides the detected {found[0]} {found[1]}"))
    return info, env, notes


def input_hostfile(config: Config, info: mpimod.MPIInfo) -> tuple[str, list[Decision]]:
    """The hostfile to read: the configured one, or the one the user's mpirun names."""
    if not mpimod.is_launcher(config.program):
        return config.hostfile, []
    user = mpimod.scan_user_command(config.program, info.runtime)
    named = [v for key in mpimod.HOSTFILE_OPTIONS for v in user.values(key)]
    if not named:
        return config.hostfile, []
    theirs = named[0]
    if config.source("hostfile").kind != "default" and \
            os.path.normpath(theirs) != os.path.normpath(config.hostfile):
        raise ConfigError([f"{config.source('hostfile')} names {config.hostfile} but the "
                           f"user's mpirun command names {theirs}; use one"])
    return theirs, [Decision("input hostfile", theirs, "user command",
                             "named by the user's mpirun command")]


def wait_for_dns(config: Config, hostfile: hf.Hostfile, own_name: str, log: Any
                 ) -> dict[str, Answer]:
    """Resolve every host (and the launcher itself) or raise DNSTimeoutError."""
    answers: dict[str, Answer] = {}
    names: list[str] = []
    for host in hostfile.hosts:
        name = lookup_name(host.name, config)
        if is_ip_literal(name):
            answers[name] = Answer(name, addresses=(name,))
        else:
            names.append(name)
    if own_name and own_name not in names:
        names.append(own_name)  # remote daemons connect back to the launcher by name

    def on_answer(answer: Answer, previous: Answer | None) -> None:
        if answer.ok:
            log.info("DNS OK", host=answer.name, address=answer.addresses[0])
        elif previous is None or previous.error_kind != answer.error_kind:
            log.info("DNS WAIT", host=answer.name, reason=answer.error_kind,
                     detail=answer.detail)

    rate = dns.lookup_rate(len(names), config.dns_wait_interval)
    log.info("DNS wait", hosts=len(names), deadline_s=config.dns_wait_seconds,
             max_lookups_per_s=round(rate, 1))
    result = dns.wait_for(names, lookup=dns.SystemResolver(RESOLV_CONF),
                          deadline=config.dns_wait_seconds,
                          interval=config.dns_wait_interval,
                          concurrency=config.dns_concurrency, on_answer=on_answer)
    answers.update(result.answers)
    log.info("DNS done", resolved=len(names) - len(result.unresolved),
             unresolved=len(result.unresolved), lookups=result.lookups,
             elapsed_s=round(result.elapsed, 3))
    if not result.ok:
        failing = [result.answers[n] for n in result.unresolved]
        summary = ", ".join(f"{a.name} ({a.error_kind})" for a in failing[:5])
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        from mpi_bootstrap.doctor import diagnose

        doctor = diagnose.for_dump([a.name for a in failing[:16]])
        raise DNSTimeoutError(
            f"DNS: {len(failing)} of {len(names)} names did not resolve within "
            f"{config.dns_wait_seconds:g} s: {summary}{more}",
            details=dns_dump(hostfile, failing, own_name) + "\n--- doctor (each "
            "nameserver asked directly)\n" + doctor)
    return answers


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        return f"(cannot read: {exc.strerror})\n"


def dns_dump(hostfile: hf.Hostfile, failing: list[Answer], own_name: str) -> str:
    """What a person needs to see when the DNS wait times out."""
    parts = [f"--- hostfile {hostfile.path}", hostfile.text.rstrip("\n"),
             f"--- {RESOLV_CONF}", _read(RESOLV_CONF).rstrip("\n"),
             f"--- {ETC_HOSTS}", _read(ETC_HOSTS).rstrip("\n"),
             "--- unresolved names (last error)"]
    for a in failing:
        who = " (this launcher's own hostname)" if a.name == own_name else ""
        hint = "" if a.transient else "  <- the resolver itself is failing"
        parts.append(f"{a.name}{who}: {a.error_kind}: {a.detail}{hint}")
    return "\n".join(parts)


def gather(config: Config, environ: Mapping[str, str], log: Any) -> tuple[Facts, list[Decision]]:
    # One deadline for DNS, the workers' records, sshd readiness and preflight.
    deadline = time.monotonic() + config.dns_wait_seconds
    log.info("exchange", mode=config.exchange, reason=config.exchange_reason)
    info, env, notes = find_mpi(config, environ)
    log.info("MPI", vendor=info.vendor, version=info.version, mpirun=info.mpirun)
    path, more = input_hostfile(config, info)
    notes.extend(more)
    hostfile = hostfiles.read(path)
    own = socket.gethostname()
    answers = wait_for_dns(config, hostfile, own, log)
    mine = frozenset(netif.addresses())
    remote = [(e.name, e.rewritten_to, e.address)
              for e in host_entries(config, hostfile, answers)
              if not peers.is_local(e.rewritten_to, e.address, own, mine)]
    client = peers.client_key(config, write=not config.explain, log=logmod.events(log))
    records = {}
    if client is not None and remote:
        records = peers.collect(config, remote, client, deadline, logmod.events(log),
                                fetch=not config.explain)
        log.info("records", exchange=config.exchange, found=len(records), remote=len(remote))
    facts = Facts(environ=env, hostfile=hostfile, answers=answers, mpi=info,
                  interfaces=netif.present(), is_root=os.geteuid() == 0,
                  is_pid1=os.getpid() == 1, launcher_hostname=own, client=client,
                  records=records, remote=tuple(new for _, new, _ in remote),
                  deadline=deadline)
    return facts, notes


def plan(config: Config, environ: Mapping[str, str], log: Any) -> tuple[Plan, Facts]:
    facts, notes = gather(config, environ, log)
    p = build_plan(config, facts)
    if notes:
        p = dataclasses.replace(p, decisions=(*notes, *p.decisions))
    return p, facts


def execute(p: Plan, config: Config, environ: Mapping[str, str], log: Any) -> int:
    """Write the plan's files, then become mpirun (--exec) or its supervisor.

    Neither returns on success: the process image is replaced, and the supervisor
    exits with mpirun's code.
    """
    files.state_dir(config.state_dir)
    for f in p.files:
        files.atomic_write(f.path, f.text, f.mode)
        log.debug("wrote", path=f.path, purpose=f.purpose)
    env = p.environment(environ)
    events = logmod.events(log)
    if p.ssh_targets:
        preflight.wait_sshd(p.ssh_targets, p.deadline, events)
    if p.preflight:
        check = remote_check(p, config, env)
        try:
            preflight.run(p.remote, p.ssh_command, check, env=env, deadline=p.deadline,
                          log=events)
        except PeerUnavailableError as exc:
            if check.refused_hint and check.refused_hint in exc.message:
                raise  # said all there is to say; DNS and the Service are beside the point
            from mpi_bootstrap.doctor import diagnose

            problems = [f.line() for f in diagnose.run(config, deadline_s=5.0) if not f.ok]
            exc.details = "\n".join(filter(None, [
                exc.details, "--- doctor", *(problems or ["(no other problem found)"])]))
            raise
    if config.exec:
        log.info("mpirun exec", argv=list(p.argv), forwarded=list(p.forwarded))
        handoff.exec_replace(p.argv, env)
    log.info("mpirun start", argv=list(p.argv), forwarded=list(p.forwarded))
    handoff.handoff(p.argv, env, grace=config.grace_seconds, group=config.signal_group,
                 role=config.role, log_level=config.log_level, log_format=config.log_format,
                 done_file=p.done_file, done_text=p.done_text, explain=True)
    raise AssertionError("unreachable: handoff replaces the process")


# With no exchange, a refused connection on every try for this long is a setup mistake
# (nothing set the workers' sshd up), not a worker still starting: said within seconds.
NO_EXCHANGE_PATIENCE = 5.0


def remote_check(p: Plan, config: Config, env: Mapping[str, str]) -> preflight.RemoteCheck:
    """What preflight checks on each worker; the program is resolved here (the launcher's
    filesystem), with the PATH the ranks will get."""
    program = preflight.program_of(p.argv, p.program_index)
    path = preflight.ranks_path(env, p.forwarded, p.prefix)
    expected = None
    if program:
        expected = program if program.startswith("/") else \
            resolve(program, path if path is not None else env.get("PATH"))
    auto_none = config.exchange == "none" and config.source("exchange").kind == "default"
    hint = (f"no exchange is set up ({config.exchange_reason}); run `mpi-bootstrap worker` "
            "in the worker pods with the same settings as the launcher: mount the MPIJob's "
            "Secret at MPI_BOOTSTRAP_SSH_AUTH_DIR (secret), or set MPI_BOOTSTRAP_TOKEN "
            "(net) or MPI_BOOTSTRAP_EXCHANGE_DIR (dir) in every pod") if auto_none else ""
    return preflight.RemoteCheck(
        mpi=p.mpi, prefix=p.prefix,
        want_ld=env.get("LD_LIBRARY_PATH") if config.exchange != "none" else None,
        program=program, ranks_path=path, expected=expected,
        refused_patience=NO_EXCHANGE_PATIENCE if auto_none else None, refused_hint=hint)


def main(config: Config, environ: Mapping[str, str], log: Any) -> int:
    p, facts = plan(config, environ, log)
    if config.explain:
        sys.stdout.write(render.as_json(p) if config.json else render.as_text(p))
        return 0
    return execute(p, config, facts.environ, log)
