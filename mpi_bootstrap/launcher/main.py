"""The launcher role: gather facts, build the Plan, then explain it or carry it out.

config → mpirun --version → hostfile → DNS wait → Plan → --explain
(gather.py)                                      (plan.py)  (render.py)

A launch runs the one pipeline (pipeline.py): this pod's facts (gather.py), then the
workers as they arrive (arrivals.py), each checked as it does, mpirun started behind the
launch gate. Here the launch's order is chosen, by the Plan of this pod's facts (its
`launch order`): the workers as they come, or every worker first — every name resolved
and every record read before the first is taken (`Arrivals.whole`).
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Mapping

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import gather, render
from mpi_bootstrap.launcher.model import Plan
from mpi_bootstrap.launcher.plan import build_plan


def explain(config: Config, environ: Mapping[str, str], log: Log) -> Plan:
    """--explain's Plan: every fact, this pod's first (before_dns), then every host's
    address after one DNS round, and the remote workers' records as they are here."""
    facts, notes, _ = gather.before_dns(config, environ, log)
    answers = gather.wait_for_dns(config, facts.hostfile, socket.gethostname(), log)
    p = build_plan(config, gather.resolved(config, facts, answers, log))
    return dataclasses.replace(
        p, decisions=(*notes, gather.dns_decision(config, answers), *p.decisions)
    )


def main(config: Config, environ: Mapping[str, str], log: Log) -> int:
    if config.explain:
        p = explain(config, environ, log)
        sys.stdout.write(render.as_json(p) if config.json else render.as_text(p))
        return 0
    from mpi_bootstrap.launcher import pipeline  # not for --explain (cli._dispatch)
    from mpi_bootstrap.launcher.arrivals import Arrivals

    facts, _, config = gather.before_dns(config, environ, log)
    arrivals = Arrivals(config, facts, log)
    if build_plan(config, facts).pipeline:
        arrivals.start()  # as they come
    else:
        arrivals.whole()  # every worker first
    pipeline.launch(config, arrivals, log)
