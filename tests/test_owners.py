"""Gathered the agent keeps in one place only: each literal below is written in its owner
module and nowhere else in the package (the others import it), so two copies cannot
drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpi_bootstrap.core import config, failures, runtimes
from mpi_bootstrap.core.settings import SECRET_SSHD_PORT
from mpi_bootstrap.launcher import preflight
from mpi_bootstrap.pid1.restart import RestartPolicy

PACKAGE = Path(__file__).parent.parent / "mpi_bootstrap"

OWNERS = {
    # literal: the one module that may write it
    "K_MPI_JOB_ROLE": "core/config.py",  # the role word's variables (ROLE_ENVS)
    "orted": "core/runtimes/openmpi.py",  # the MPI daemons' names: their runtimes'
    "prted": "core/runtimes/openmpi.py",
    "hydra_pmi_proxy": "core/runtimes/hydra.py",
    "hydra_bstrap_proxy": "core/runtimes/hydra.py",
    2222: "core/settings.py",  # the secret exchange's sshd port
    "kex_exchange_identification": "core/failures.py",  # ssh's failure words
    "connection refused": "core/failures.py",
    "NCCL_SOCKET_IFNAME": "core/nccl.py",  # the data NIC's chooser
    "NCCL_IB_HCA": "core/nccl.py",
}


def _constants() -> dict[object, set[str]]:
    """Every constant in the package's code (docstrings included), by the modules holding it."""
    found: dict[object, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
                found.setdefault(node.value, set()).add(str(path.relative_to(PACKAGE)))
    return found


@pytest.mark.parametrize("literal", list(OWNERS), ids=str)
def test_one_owner(literal: object) -> None:
    """The literal is written in its owner module only."""
    assert _constants().get(literal, set()) == {OWNERS[literal]}


def test_names_are_the_owners() -> None:
    """What the other modules use is the owner's: the same values, one list of each."""
    assert failures.DAEMONS is runtimes.DAEMONS
    assert "K_MPI_JOB_ROLE" in config.ROLE_ENVS and SECRET_SSHD_PORT == 2222
    assert (RestartPolicy().limit, RestartPolicy().window) == (5, 60.0)


def test_one_definition() -> None:
    """lookup_name, transient/unreached (ssh's words) and the ssh fan-out's width are
    defined once."""
    defs: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                defs.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        defs.setdefault(t.id, []).append(str(path.relative_to(PACKAGE)))
    assert defs["lookup_name"] == ["core/hostfile.py"]
    assert defs["unreached"] == ["core/failures.py"]
    assert preflight.transient is failures.transient  # core/model.py's is DNS's, not ssh's
    assert defs["SSH_AT_ONCE"] == ["system/parallel.py"] and "MAX_PARALLEL" not in defs
