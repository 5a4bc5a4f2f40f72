"""The shape the code keeps: small modules and functions, and comments that cite only
what a reader of the repository can open. (The import rules themselves are
import-linter contracts in pyproject.toml, run by `make lint`.)"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mpi_bootstrap"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_over_400_lines() -> None:
    """A module that grows past 400 lines holds more than one idea: split it."""
    big = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, big


def test_no_function_over_60_lines() -> None:
    """A function past 60 lines hides its steps: name them."""
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, long


# Documents that live outside the repository (the tracker's issues, the team's notes):
# a reader of the code cannot open them, so code, tests and docs never cite them.
OUTSIDE = re.compile(r"\b(?:issue|issues) #?\d+\b|FIELD-NOTES|\bSTYLE(?:\.md| §)", re.IGNORECASE)
# Upstream trackers are fine to cite: they are public and named ("mpi-operator #731").
UPSTREAM = re.compile(r"[\w.-]+ #\d+")


def test_comments_cite_only_what_the_repository_holds() -> None:
    """'issue 7', 'FIELD-NOTES §5', 'STYLE §6' point at nothing a reader can open."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    hits = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in (
            ".py",
            ".md",
            ".toml",
            ".yaml",
            ".yml",
            ".conf",
            ".cfg",
            ".sh",
            ".txt",
        ) and path.name not in ("Makefile", "run"):
            continue
        if "fixtures" in path.parts or not path.exists() or path == Path(__file__).resolve():
            # captured output kept verbatim; a file removed but not yet committed; this
            # file, which names the patterns
            continue  # captured program output, kept verbatim
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if OUTSIDE.search(UPSTREAM.sub("", line)):
                hits.append(f"{name}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def _imports(path: Path) -> set[str]:
    """The package's modules `path` imports, anywhere in it: at the top, inside a
    function (lazily), or only for type checking."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if path.name == "__init__.py":
        module = module.removesuffix(".__init__")
        package = module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("mpi_bootstrap")}


def test_no_import_cycle() -> None:
    """No module imports, through any chain, a module that imports it back — lazy and
    type-only imports count: a cycle is two ideas that cannot be read one at a time."""
    names = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in _modules()
    }
    graph = {m: {i for i in _imports(p) if i in names and i != m} for m, p in names.items()}
    # A package's __init__ re-exporting its modules is not an idea of its own.
    graph = {m: {i for i in deps if not m.startswith(i + ".")} for m, deps in graph.items()}
    cycles: set[tuple[str, ...]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                cycle = path[path.index(nxt) :]
                i = cycle.index(min(cycle))
                cycles.add(tuple(cycle[i:] + cycle[:i]))
            elif len(path) < 12:
                walk(nxt, [*path, nxt])

    for start in graph:
        walk(start, [start])
    assert not cycles, "\n".join(" -> ".join((*c, c[0])) for c in sorted(cycles))


def test_the_resident_pid1_starts_lean() -> None:
    """The resident PID 1 imports, to start, none of what it needs only at a job's end or
    in another role: the failure explainer and its tables (the MPIs' runtimes), liveness
    and hashlib's OpenSSL (4 MiB alone); with them it held 17.6 MiB while a job ran,
    without 13.2 (docs/benchmarks.md, "PID 1's memory")."""
    import sys

    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from mpi_bootstrap.pid1.resident import main; print(' '.join(sys.modules))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True)  # fmt: skip
    loaded = set(done.stdout.split())
    heavy = {"mpi_bootstrap.core.failures", "mpi_bootstrap.core.runtimes", "hashlib", "_hashlib"}
    assert not loaded & heavy, sorted(loaded & heavy)
