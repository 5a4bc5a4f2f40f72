"""mpirun failure explainer: real captured output → the right explanation; unrelated
failures → none. Captures: tests/fixtures/mpirun-failures/ (capture.py made them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_bootstrap import failures

CAPTURES = Path(__file__).parent / "fixtures" / "mpirun-failures"
EXPECTED = {
    "could-not-resolve": ("could-not-resolve", "no-such-worker.job.default.svc"),
    "permission-denied": ("permission-denied", "cap-worker-0"),
    "host-key-mismatch": ("host-key-mismatch", "cap-worker-0"),
    "daemon-not-found": ("daemon-not-found", "/opt/openmpi-not-here/bin/"),
    "no-route-to-host": ("no-route", "10.250.0.99"),
}


def cases() -> list[Path]:
    return sorted(p for p in CAPTURES.glob("*.txt"))


@pytest.mark.parametrize("path", cases(), ids=lambda p: p.stem)
def test_capture(path: Path) -> None:
    mpi, _, case = path.stem.partition("-")
    if mpi == "openmpi":  # openmpi4-… / openmpi5-…
        mpi, _, case = path.stem.partition("-")[2].partition("-")
    text = path.read_text()
    found = failures.explain(text)
    if case.startswith("unrelated"):
        assert found is None, found
        return
    name, detail = EXPECTED[case]
    assert found is not None, path.name
    assert found.signature == name, (path.name, found)
    assert detail in found.cause
    paragraph = found.text(255)
    assert paragraph.startswith("mpi-bootstrap: mpirun exited 255. Likely cause: ")
    assert "What to do: " in paragraph


def test_every_case_was_captured_for_two_mpis() -> None:
    for case in EXPECTED:
        assert len(list(CAPTURES.glob(f"*-{case}.txt"))) >= 2, case


@pytest.mark.parametrize("text", [
    "",
    "Hello from rank 0\n",
    "mpirun detected that one or more processes exited with non-zero status\n",
    "Traceback (most recent call last):\n  File \"train.py\"\nValueError: bad batch\n",
    "NCCL WARN Connect to 10.0.0.2<43333> failed : Connection refused\n",
])
def test_unrelated_output_gets_no_explanation(text: str) -> None:
    assert failures.explain(text) is None
