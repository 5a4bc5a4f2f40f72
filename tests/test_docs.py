"""README and docs/ stay true: every setting, variable and exit code the code has is
documented (docs/configuration.md, docs/troubleshooting.md), the configuration page's
lists are the code's (tests/support/docgen.py), every link resolves, and the README stays
a page a newcomer reads (at most 15 KB)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpi_bootstrap.core.errors import ExitStatus
from mpi_bootstrap.core.runtimes import schema
from mpi_bootstrap.core.settings import SETTINGS
from tests.support import docgen

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_setting_documented(setting: object) -> None:
    """Every setting's variables and flag appear in backticks in the configuration page."""
    for env in setting.envs:  # type: ignore[attr-defined]
        assert f"`{env}`" in CONFIGURATION, env
    if setting.flag:  # type: ignore[attr-defined]
        assert f"`{setting.flag}`" in CONFIGURATION  # type: ignore[attr-defined]


class TestGenerated:
    """docs/configuration.md's settings tables and what each MPI gets are written from the
    code by tests/support/docgen.py (`make docs`), never by hand."""

    def test_up_to_date(self) -> None:
        """The page's generated parts are what `make docs` writes from the code now."""
        import difflib

        expected = docgen.render(CONFIGURATION)
        if expected != CONFIGURATION:
            diff = difflib.unified_diff(
                CONFIGURATION.splitlines(), expected.splitlines(), "page", "code", lineterm=""
            )
            pytest.fail(
                "docs/configuration.md's generated parts differ from the code: run `make "
                "docs`\n" + "\n".join(list(diff)[:40])
            )

    def test_a_changed_part_is_rewritten(self) -> None:
        """A cell edited by hand is put back, a part without its markers is refused: the
        check above can fail."""
        edited = CONFIGURATION.replace("| `MPI_HOSTFILE` |", "| `MPI_HOSTFILES` |", 1)
        assert edited != CONFIGURATION
        assert docgen.render(edited) == docgen.render(CONFIGURATION)
        with pytest.raises(ValueError, match="0 parts marked 'mpi'"):
            docgen.render(CONFIGURATION.replace("<!-- end generated: mpi -->", ""))

    def test_every_kind_of_row_is_described(self) -> None:
        """A runtime's rows of a new kind cannot go missing from the page."""
        import typing

        assert set(docgen.DESCRIBERS) == set(typing.get_args(schema.Row))

    def test_conditions_in_words(self) -> None:
        """A row's condition is named by the cases where it holds; one that depends on two
        of them stops the generator, naming the row."""
        assert docgen.condition(lambda f: f.is_root, "row") == "as root"
        assert docgen.condition(lambda f: True, "row") == ""
        with pytest.raises(ValueError, match="both: its condition depends on 2"):
            docgen.condition(lambda f: f.is_root and f.startup_timeout > 0, "both")

    def test_notes_name_settings(self) -> None:
        """Each note below the settings tables starts with a flag or variable the code has."""
        import re

        names = {s.flag for s in SETTINGS} | {e for s in SETTINGS for e in s.envs}
        notes = CONFIGURATION.split("**More on some settings**", 1)[1].split("\n\n")[1]
        heads = re.findall(r"^- `([^`]+)`:", notes, re.M)
        assert heads and set(heads) <= names


@pytest.mark.parametrize("status", [s for s in ExitStatus if s not in (0, 128)])
def test_exit_code_documented(status: ExitStatus) -> None:
    """Every exit status but 0 and 128 has a row in the troubleshooting page's table."""
    assert f"| {int(status)} |" in TROUBLESHOOTING


def test_readme_is_short() -> None:
    """The README is the newcomer's page: at most 15 KB; the rest is in docs/."""
    assert len(README.encode()) <= 15 * 1024


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    """Every relative link of README, SECURITY.md and docs/ names a file that is there, and
    every page of docs/ is linked from the README."""
    import re

    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: {target}"
    if page.name == "README.md":
        for doc in (ROOT / "docs").glob("*.md"):
            assert f"(docs/{doc.name})" in README, doc.name


def test_first_lines_give_the_two_commands() -> None:
    """The README's first six lines give `make demo` and `make test`."""
    head = README.splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


SECURITY = (Path(__file__).resolve().parent.parent / "SECURITY.md").read_text()


def _defined(path: Path) -> set[str]:
    """`Class::test` and `test` names defined in a test module."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)
            )
    return names


def test_every_security_promise_cites_tests_that_exist() -> None:
    """SECURITY.md: each promise row names at least one test, and every test it names is
    really there (a renamed test cannot leave a promise unproved)."""
    import re

    root = Path(__file__).resolve().parent.parent
    rows = [ln for ln in SECURITY.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) >= 12
    for row in rows:
        refs = re.findall(r"`(tests/[\w/]+\.py)::([\w:]+)`", row)
        assert refs or "make lint" in row, f"no test for: {row[:80]}"
        for module, name in refs:
            assert name in _defined(root / module), f"{module}::{name} (SECURITY.md) missing"


# A file of tests/ cited by path, with the class and the test where given (`tests/test_` a
# module `.py::TestClass::test_name`), also broken across a comment's or a docstring's
# lines after `::`.
CITED = r"(tests/(?:test_\w+|conftest|demo|(?:support|bench)/[\w/]+)\.py)((?:::\w+)*)"


def _citations(text: str) -> list[tuple[str, str]]:
    import re

    joined = re.sub(r"::\n[\s#]*", "::", text)
    return [(m[1], m[2].lstrip(":")) for m in re.finditer(CITED, joined)]


def test_every_cited_test_exists() -> None:
    """Every test module, class and test that the code, the tests and the docs cite by path
    is there: a module renamed or a class moved cannot leave a citation pointing at
    nothing (SECURITY.md's rows are checked above, this is everything else)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = []
    for name in tracked:
        path = root / name
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".sh") and not (
            path.name == "Makefile" or path.name.startswith("Dockerfile")
        ):
            continue
        if "fixtures" in path.parts or not path.exists():
            continue  # captured program output; a file removed but not yet committed
        for module, test in _citations(path.read_text(errors="replace")):
            if not (root / module).exists():
                missing.append(f"{name}: {module}")
            elif test and test not in _defined(root / module):
                missing.append(f"{name}: {module}::{test}")
    assert missing == []


# A section of docs/ the package cites: `docs/PAGE.md, "Section"` (a comma or not); its
# quotes may close on the next line of a comment or string.
DOCS_CITE = re.compile(r'(docs/[a-z-]+\.md),?\s+"([^"]+)"')


def test_every_docs_section_the_package_cites_resolves() -> None:
    """Every `docs/PAGE.md, "Section"` the package's code cites names a section of that
    page — a heading, or a paragraph or item led by the section's name in bold: a
    docstring that points to the docs instead of restating them must point somewhere."""
    missing = []
    for path in sorted((ROOT / "mpi_bootstrap").rglob("*.py")):
        text = re.sub(r"[\"']?\s*\n\s*(#\s*)?[\"']?", " ", path.read_text(encoding="utf-8"))
        for page, section in DOCS_CITE.findall(text):
            lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
            headings = {line.lstrip("#").strip() for line in lines if line.startswith("#")}
            led = {
                m[1].rstrip(".:").split(" (")[0]
                for line in lines
                if (m := re.match(r"\s*(?:- )?\*\*([^*]+)\*\*", line))
            }
            if section not in headings | led:
                missing.append(f"{path.relative_to(ROOT)}: {page}, {section!r}")
    assert not missing, "\n".join(missing)
