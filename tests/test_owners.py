"""Facts the agent keeps in one place only: each literal below is written in its owner
module and nowhere else in the package (the others import it), so two copies cannot
drift apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mpi_bootstrap.core import config, failures, runtimes
from mpi_bootstrap.core.settings import SECRET_SSHD_PORT
from mpi_bootstrap.launcher import session
from mpi_bootstrap.pid1.restart import RestartPolicy

PACKAGE = Path(__file__).parent.parent / "mpi_bootstrap"

OWNERS = {
    # literal: the one module that may write it
    "K_MPI_JOB_ROLE": "core/operators.py",  # what each operator puts in its pods
    "JOB_COMPLETION_INDEX": "core/operators.py",
    "orted": "core/runtimes/openmpi.py",  # the MPI daemons' names: their runtimes'
    "prted": "core/runtimes/openmpi.py",
    "hydra_pmi_proxy": "core/runtimes/hydra.py",
    "hydra_bstrap_proxy": "core/runtimes/hydra.py",
    2222: "core/exchanges.py",  # the secret exchange's sshd port
    "kex_exchange_identification": "core/failures.py",  # ssh's failure words
    "connection refused": "core/failures.py",
    "NCCL_SOCKET_IFNAME": "core/nccl.py",  # the data NIC's chooser
    "NCCL_IB_HCA": "core/nccl.py",
    "NCCL_*": "core/env.py",  # what the job's environment carries (CARRIED)
    "UCX_*": "core/env.py",
    "HYDRA_*": "core/env.py",
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
    """What the other modules use is the owner's: the same values, one list of each; ssh
    sends (SendEnv) only what the worker's sshd takes (AcceptEnv), every rank gets it."""
    from mpi_bootstrap.core import env
    from mpi_bootstrap.launcher.mpi import env as forwarding
    from mpi_bootstrap.ssh import sshconfig, sshd

    assert sshconfig.SEND_ENV is env.SEND_ENV and sshd.ACCEPT_ENV is env.ACCEPT_ENV
    assert forwarding.FORWARD_PREFIXES is env.FORWARD_PREFIXES
    assert set(env.SEND_ENV) <= set(env.ACCEPT_ENV) and "PATH" not in env.ACCEPT_ENV
    assert all(c.ranks for c in env.CARRIED if c.send)
    assert failures.DAEMONS is runtimes.DAEMONS
    assert config.ROLE_ENV == "MPI_BOOTSTRAP_ROLE" and SECRET_SSHD_PORT == 2222
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
    assert session.transient is failures.transient  # core/model.py's is DNS's, not ssh's
    assert defs["SSH_AT_ONCE"] == ["system/parallel.py"] and "MAX_PARALLEL" not in defs


# Runtimes are told apart by name only where one is chosen (detection) and where each is
# described (its descriptor); everything else asks the descriptor's fields.
MAY_NAME_RUNTIMES = ("launcher/mpi/detect.py", "core/runtimes/")
# core/hostfile.py compares hostfile forms (`host:N`, `host slots=N`), which a runtime's
# `hostfile_form` names: spelled `hydra` and `openmpi`, they are not runtimes.
FORMS = "core/hostfile.py"
RUNTIME_WORDS = {w for r in runtimes.RUNTIMES for w in (r.name, r.vendor, *r.choices)}
# Their constants (`ORTE`, `mpi.HYDRA`, `ORTE_ROW`) and the fields that hold them.
RUNTIME_NAMES = re.compile(r"(?:ORTE|PRRTE|MPICH|INTEL|OPENMPI|HYDRA)(?:_\w+)?|runtime|vendor")


def _names_a_runtime(node: ast.AST) -> bool:
    """A runtime's or vendor's name as a word (`"hydra"`), a constant (`ORTE`, `mpi.HYDRA`)
    or a field (`info.runtime`, `mpi.vendor`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.lower() in RUNTIME_WORDS
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return RUNTIME_NAMES.fullmatch(name) is not None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_runtime(e) for e in node.elts)
    return False


def _comparisons(tree: ast.AST) -> list[ast.AST]:
    """Where a runtime or vendor is compared by name: `==`, `in`, `is`, `startswith`,
    or a table keyed by the names."""
    hits: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
        ):
            operands = list(node.args)
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        else:
            continue
        if any(_names_a_runtime(o) for o in operands):
            hits.append(node)
    return hits


def test_runtimes_are_told_apart_only_by_detection_and_their_descriptors() -> None:
    """Nothing after detection compares a runtime or vendor by name: it asks the runtime's
    descriptor (core/runtimes/), so a fifth runtime is one descriptor more."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name.startswith(MAY_NAME_RUNTIMES) or name == FORMS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{name}:{n.lineno}: {ast.unparse(n)[:80]}" for n in _comparisons(tree)]
    assert not found, "\n".join(found)
