"""The repository is self-contained: no file in it reads anything beside the clone.

A fresh clone has no `../shared` (or any other sibling) next to it; a test, a Makefile
target or a README step that reads one passes only where the clone happens to sit
beside it (as test_manifests.py once did with the upstream CRD).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Ways a path can leave the clone: a relative climb to a sibling, the repository root's
# parent in Python, or an absolute path of the machine it was written on.
OUTSIDE = [
    re.compile(r"\.\./(?!\.\.)[A-Za-z_.]"),  # ../shared, ../.library, ../x
    re.compile(r"ROOT\.parent\b"),  # ROOT.parent / "shared"
    re.compile(r"parent\.parent\.parent"),  # three levels up from tests/x.py
    re.compile(r"(?<![\w/])/work/"),  # this machine's checkout location
]
# Text that may legitimately contain `../`: a relative path inside the clone.
INSIDE = re.compile(r"\.\./(?:mpi_bootstrap|tests|container|README|SECURITY)\b")


def tracked() -> list[Path]:
    """Every file git tracks, or every file below the root when this is not a checkout
    (a source tarball)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True
        ).stdout
        files = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    return [f for f in files if f.is_file()]


def test_the_file_list_is_the_repository() -> None:
    """The scan sees the code, the tests, the Makefile and the README."""
    names = {str(p.relative_to(ROOT)) for p in tracked()}
    assert {
        "Makefile",
        "README.md",
        ".ci/run",
        "mpi_bootstrap/cli.py",
        "tests/test_manifests.py",
    } <= names


@pytest.mark.parametrize("pattern", OUTSIDE, ids=lambda p: p.pattern)
def test_nothing_reads_outside_the_clone(pattern: re.Pattern[str]) -> None:
    """No tracked text file names a path outside the clone."""
    me = Path(__file__).resolve()
    captured = ROOT / "tests" / "fixtures" / "mpirun-failures"  # programs' own output
    found = []
    for path in tracked():
        if path.resolve() == me or (path.parent == captured and path.suffix == ".txt"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for n, line in enumerate(text.splitlines(), start=1):
            if pattern.search(INSIDE.sub("", line)):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert found == []


def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, by its absolute name (`from . import x` in tests/support
    is tests.support.x)."""
    import ast

    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_no_test_module_imports_another() -> None:
    """Test modules share code through tests/support/ and conftest.py only: a test module
    that imports another runs (and breaks) with it, and pytest may collect its tests twice.
    Nothing else under tests/ imports one either."""
    test_module = re.compile(r"^tests\.test_\w+$")
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        found += [
            f"{path.relative_to(ROOT)}: {name}"
            for name in sorted(_imported_modules(path))
            if test_module.match(name)
        ]
    assert found == []
    # (the scan does see imports: test_ssh.py takes its workers from tests/support)
    assert "tests.support.workers" in _imported_modules(ROOT / "tests" / "test_ssh.py")
