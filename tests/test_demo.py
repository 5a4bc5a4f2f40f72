"""`make demo` stays true: it installs only the chosen MPI, and its default run (Open MPI 4
on a simulated 3-pod cluster) computes the right sum on every rank and prints what a
person wants to read."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.demo import needs


@pytest.mark.parametrize(
    ("mpi", "venvs"),
    [
        ("openmpi4", []),  # Debian's openmpi-bin: nothing from PyPI
        ("openmpi5", [".venv-mpi/openmpi5"]),
        ("mpich", [".venv-mpi/mpich"]),
        ("intel", [".venv-mpi/mpich", ".venv-mpi/impi"]),  # MPICH's header builds the program
    ],
)
def test_demo_needs_only_its_mpi(mpi: str, venvs: list[str]) -> None:
    """`--print-needs` names exactly the venvs `make demo` installs for that MPI."""
    assert needs(mpi) == venvs
    out = subprocess.run(
        [sys.executable, "tests/demo.py", "--print-needs", "--mpi", mpi],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == venvs


@pytest.mark.usefixtures("dnsmasq", "realmpi")  # what tests/demo.py builds and runs
def test_default_demo_runs() -> None:
    """The default demo: 4 ranks on 2 workers, each line rank/host/result, exit 0."""
    done = subprocess.run(
        [sys.executable, "tests/demo.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = re.findall(
        r"^rank (\d)/4 on (demo-worker-\d): allreduce sum 10 \(expected 10\) OK$", done.stdout, re.M
    )
    assert sorted(r for r, _ in ranks) == ["0", "1", "2", "3"]
    assert {h for _, h in ranks} == {"demo-worker-0", "demo-worker-1"}
    assert " start " not in done.stdout  # the program's raw timestamp is not shown
    assert "ranks:          4 of 4 computed the right sum" in done.stdout
    assert "job exit code:  0" in done.stdout
