"""The tiers (tests/support/resources.py, tests/conftest.py): each test's markers are
derived from the fixtures it uses, a marker set by hand is refused, and a test that
reaches a resource without asking for its fixture fails at once, naming the fixture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support import handmarked, resources, unasked

pytestmark = pytest.mark.timeout(60)


def session(*args: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own in the repository, as the suite runs."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )


@pytest.mark.parametrize(
    ("fixtures", "fuzzer", "expected"),
    [
        ({"tmp_path", "monkeypatch"}, False, ["unit"]),
        ({"tmp_path"}, True, ["fuzz"]),
        ({"pod", "netns", "root", "tmp_path"}, False, ["root", "netns"]),
        ({"real_mpi", "realmpi"}, False, ["realmpi"]),
        (
            {"cluster", "netns", "root", "dnsmasq", "realmpi"},
            False,
            ["root", "netns", "dnsmasq", "realmpi"],
        ),
    ],
)
def test_markers(fixtures: set[str], fuzzer: bool, expected: list[str]) -> None:
    """The resources a test's fixtures name, a fuzzer's `fuzz`, else `unit`."""
    assert resources.markers(fixtures, fuzzer) == expected


def test_derived_at_collection() -> None:
    """A test that uses the `pod` fixture is marked `netns` (and `root`) though nothing in
    its module says so: the terminal test that `make test-fast` used to run by mistake."""
    done = session("--collect-only", "-q", "-m", "netns", "tests/test_pid1_conformance.py")
    assert done.returncode == 0, done.stdout + done.stderr
    selected = [ln for ln in done.stdout.splitlines() if "::" in ln]
    assert selected == [
        "tests/test_pid1_conformance.py::TestTerminal::test_launcher_gives_mpirun_the_terminal"
        f"[{group}]"
        for group in ("False", "True")
    ]


def test_marker_by_hand_refused() -> None:
    """A resource marker set by hand stops the session at collection, naming the test."""
    done = session("--collect-only", "-q", handmarked.__file__)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "markers set by hand" in done.stderr
    assert "handmarked.py::test_marked_by_hand: netns" in done.stderr


# Each test of tests/support/unasked.py, and the fixture it should have asked for.
UNASKED = {
    "test_cluster": "netns",
    "test_netns": "netns",
    "test_dnsmasq": "dnsmasq",
    "test_pid_namespace": "root",
    "test_mpi": "realmpi",
    "test_wheelhouse": "container",
    "test_podman": "container",
    "test_mpi_asked": None,  # asked: passes
}


def test_unasked_resource_fails_naming_its_fixture(tmp_path: Path) -> None:
    """Each test of tests/support/unasked.py fails with Unasked naming the fixture it did
    not ask for (before it makes anything: also as nobody); the one that asked passes."""
    import xml.etree.ElementTree as ET

    report = tmp_path / "report.xml"
    session("-q", f"--junitxml={report}", unasked.__file__)
    said = {
        case.get("name"): " ".join(f.get("message", "") for f in case.iter("failure"))
        for case in ET.parse(report).getroot().iter("testcase")  # noqa: S314 - pytest wrote it
    }
    assert set(said) == set(UNASKED), said
    for test, fixture in UNASKED.items():
        if fixture is None:
            assert said[test] == "", said[test]
        else:
            assert "Unasked" in said[test] and f"the `{fixture}` fixture" in said[test], said


def test_timing_sensitive_tests_share_one_group() -> None:
    """The tests that measure against a bound run one after another on one xdist worker
    (`timing`), the container tier on another group of its own; the rest anywhere."""
    from tests.support import resources

    def node(module: str) -> str:  # a test's id in `module` (not a citation of one)
        return f"tests/{module}.py::" + "test_any"

    assert resources.group(node("test_liveness"), None) == "timing"
    assert resources.group(node("test_soak"), None) == "timing"
    assert resources.group(node("test_container"), object()) == "container"
    assert resources.group(node("test_cli"), None) is None
