"""The launcher role: gather facts, build the Plan, then explain it or carry it out.

config → mpirun --version → hostfile → DNS wait → Plan → (--explain | write + run)
(gather.py)                                      (plan.py)  (render.py | execute.py)

Where the Plan takes the workers as they come (its `launch order`), the DNS wait, the
records and the checks run as one pipeline instead (pipeline.py).
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Mapping

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import gather, render
from mpi_bootstrap.launcher.model import Gathered, Plan
from mpi_bootstrap.launcher.plan import build_plan


def plan(config: Config, environ: Mapping[str, str], log: Log) -> tuple[Plan, Gathered]:
    facts, notes = gather.gather(config, environ, log)
    p = build_plan(config, facts)
    if notes:
        p = dataclasses.replace(p, decisions=(*notes, *p.decisions))
    return p, facts


def main(config: Config, environ: Mapping[str, str], log: Log) -> int:
    if config.explain:
        p, _ = plan(config, environ, log)
        sys.stdout.write(render.as_json(p) if config.json else render.as_text(p))
        return 0
    from mpi_bootstrap.launcher import execute, pipeline  # not for --explain (cli._dispatch)

    facts, _ = gather.before_dns(config, environ, log)
    if pipeline.wanted(config, facts):
        pipeline.launch(config, facts, log)
    answers = gather.wait_for_dns(config, facts.hostfile, socket.gethostname(), log)
    facts = gather.resolved(config, facts, answers, log)
    execute.execute(build_plan(config, facts), config, facts.environ, log)
