"""The launcher role: gather facts, build the Plan, then explain it or carry it out.

config → mpirun --version → hostfile → DNS wait → Plan → (--explain | write + run)
(facts.py)                                       (plan.py)  (render.py | execute.py)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.launcher import render
from mpi_bootstrap.launcher.execute import execute
from mpi_bootstrap.launcher.gather import gather
from mpi_bootstrap.launcher.model import Gathered, Plan
from mpi_bootstrap.launcher.plan import build_plan


def plan(config: Config, environ: Mapping[str, str], log: Log) -> tuple[Plan, Gathered]:
    facts, notes = gather(config, environ, log)
    p = build_plan(config, facts)
    if notes:
        p = dataclasses.replace(p, decisions=(*notes, *p.decisions))
    return p, facts


def main(config: Config, environ: Mapping[str, str], log: Log) -> int:
    p, facts = plan(config, environ, log)
    if config.explain:
        sys.stdout.write(render.as_json(p) if config.json else render.as_text(p))
        return 0
    return execute(p, config, facts.environ, log)
