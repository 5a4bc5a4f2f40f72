"""Where ranks ran, and what a launch left: a program that writes one marker file per
rank (`<host>.<pid>`), the job's processes still on the pods, and a fault that hides the
program from one pod. Used by tests/test_gate.py and tests/test_pipeline.py."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

from tests.support.cluster import Cluster
from tests.support.job import pod_processes

# What a launch may leave behind: the MPIs' daemons, and ssh (the launcher's masters).
JOB_PROCESSES = {"orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy", "ssh", "mpirun"}
DAEMONS = {"orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy"}


def marker(programs: Path) -> Iterator[tuple[Path, Path]]:
    """A program that writes one marker per rank, and their directory (emptied after)."""
    marks = programs / "marks"
    marks.mkdir(mode=0o777, exist_ok=True)
    for old in marks.iterdir():
        old.unlink()
    prog = programs / "marker"
    prog.write_text(f'#!/bin/sh\n: > {shlex.quote(str(marks))}/"$(hostname).$$"\n')
    prog.chmod(0o755)
    yield prog, marks
    for m in marks.iterdir():
        m.unlink()


def hide(programs: Path) -> str:
    """The program's directory, empty in one pod (a tmpfs over it): sh for its PID 1."""
    return f"mount -t tmpfs none {shlex.quote(str(programs))}"


def left(c: Cluster) -> dict[str, list[str]]:
    """The job's processes still running, by pod."""
    found = {p.name: sorted(set(pod_processes(p)) & JOB_PROCESSES) for p in c.pods}
    return {name: procs for name, procs in found.items() if procs}
