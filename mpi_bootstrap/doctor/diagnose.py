"""`mpi-bootstrap doctor`: why a job cannot start, host by host, each finding ending in
what to do (dnscheck.py, sshcheck.py, datacheck.py; all in parallel under one deadline).
Exit 0 when every check passed (a `?? ` warning does not fail it), else 1
(ExitStatus.PROBLEMS_FOUND); `--json`: docs/troubleshooting.md, "When it does not start".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Sequence

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ExitStatus
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.doctor import datacheck, tokencheck
from mpi_bootstrap.doctor.dnscheck import dns_findings, service_finding
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.doctor.sshcheck import reach_jobs, ssh_jobs
from mpi_bootstrap.system import dns as sysdns
from mpi_bootstrap.system import hostfile_reader
from mpi_bootstrap.system.parallel import map_within

JSON_VERSION = 1  # of `doctor --json`; bumped when a key changes meaning or goes away


def within(
    deadline: float,
    jobs: Sequence[Callable[[], list[Finding]]],
    on_late: Callable[[int], list[Finding]],
) -> list[Finding]:
    """Run every job at once; keep what finished by `deadline` (a check stuck in the
    resolver or on a dead nameserver never holds the doctor past it, nor at exit)."""
    found: list[Finding] = []
    late = 0
    for outcome in map_within(lambda job: job(), jobs, deadline):
        if outcome is None:
            late += 1
        elif outcome[1] is not None:  # a check that breaks is a finding, not a crash
            found.append(Finding("doctor", "internal", False, repr(outcome[1])))
        else:
            found.extend(outcome[0] or [])
    return found + (on_late(late) if late else [])


def run(config: Config, *, deadline_s: float = 10.0, data: bool = True) -> list[Finding]:
    """Every check for every host in the hostfile (and the launcher), in parallel; with
    `data`, the data network's too (not when explaining a failed preflight)."""
    import socket

    deadline = time.monotonic() + deadline_s
    conf = sysdns.read_resolv_conf()
    try:
        hostfile = hostfile_reader.read(config.hostfile)
        names = [
            hf.lookup_name(h.name, config.rewrite, config.cluster_domain) for h in hostfile.hosts
        ]
    except Exception as exc:  # the doctor reports; it does not fail on a bad hostfile
        return [Finding(config.hostfile, "hostfile", False, str(exc), "fix the hostfile first")]
    names = [n for n in names if not is_ip_literal(n)]
    own = socket.gethostname()
    jobs: list[Callable[[], list[Finding]]] = [
        functools.partial(dns_findings, n, conf, deadline) for n in [*names, own]
    ]
    jobs.append(lambda: service_finding(names, config.cluster_domain, conf, deadline))
    jobs.extend(ssh_jobs(config, names, deadline))
    jobs.extend(reach_jobs(config, names, deadline))
    jobs.append(lambda: tokencheck.findings(config))
    jobs.append(lambda: [node_finding(own, config.sysfs)])
    if data:
        jobs.extend(datacheck.jobs(config, names, deadline))
    return within(
        deadline + 0.5,
        jobs,
        lambda n: [
            Finding(
                "doctor",
                "deadline",
                False,
                f"{n} checks did not finish in {deadline_s:g} s",
                "a nameserver or a worker does not answer; the findings above say which",
            )
        ],
    )


def node_finding(own: str, sysfs: str) -> Finding:
    """This pod's node, as a worker's preflight reports it (core/remote.py `node`): the
    doctor run in a worker's pod, with no launcher, shows what the launch would judge."""
    import os

    from mpi_bootstrap.core import remote
    from mpi_bootstrap.proc import children

    _, out = children.capture(["sh", "-c", remote.node(sysfs)], env=dict(os.environ), timeout=5)
    return Finding(own, "node", True, remote.parse(out).node())


def render(findings: Sequence[Finding], as_json: bool) -> str:
    if as_json:
        return (
            json.dumps(
                {
                    "version": JSON_VERSION,
                    "findings": [dataclasses.asdict(f) for f in findings],
                    "problems": sum(not f.ok for f in findings),
                },
                indent=2,
            )
            + "\n"
        )
    problems = [f for f in findings if not f.ok]
    lines = [
        "mpi-bootstrap doctor",
        *(f.line() for f in findings),
        "",
        f"{len(problems)} problem(s) found" if problems else "no problem found",
    ]
    return "\n".join(lines) + "\n"


def main(config: Config, as_json: bool) -> int:
    findings = run(config)
    import sys

    sys.stdout.write(render(findings, as_json))
    return int(ExitStatus.OK if all(f.ok for f in findings) else ExitStatus.PROBLEMS_FOUND)


def for_dump(names: Sequence[str], deadline_s: float = 3.0) -> str:
    """The DNS part of the doctor for the DNS-wait timeout dump (bounded)."""
    conf = sysdns.read_resolv_conf()
    deadline = time.monotonic() + deadline_s
    found = within(
        deadline + 0.5,
        [functools.partial(dns_findings, n, conf, deadline) for n in names],
        lambda n: [],
    )
    return "\n".join(f.line() for f in found)
