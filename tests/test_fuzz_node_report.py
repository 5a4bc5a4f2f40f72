"""Fuzz target: the launcher's reading of a worker's node report (core/remote.py parse),
which a compromised worker, its login shell or its `df` may fill with anything. The rule
every fuzz target follows: tests/support/strategies.py."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import remote
from mpi_bootstrap.launcher import nodecheck
from tests.support.strategies import NASTY, fuzz, outcome

pytestmark = pytest.mark.timeout(120)

KEYS = ["DAEMON", "LD", "PATH", "PROGRAM", "CLAIM", "SHM", "NCCL", "GPUS", "IMEX", "PORT", "GID"]
# Digits of other scripts and forms: str.isdigit takes some that int() refuses.
DIGITS = ["0", "7", "²", "٣", "１", "9" * 40, "-1", "+1", "1_000", " 1", "1e3", ""]
words = st.one_of(st.sampled_from(DIGITS + NASTY), st.text(max_size=12))
lines = st.builds(
    lambda key, ws: " ".join([key, *ws]), st.sampled_from(KEYS), st.lists(words, max_size=4)
)


@fuzz(3000)
@given(st.lists(lines, max_size=12))
@example(["DAEMON orted /x", "SHM ² ²"])
@example(["DAEMON orted /x", "GPUS ٣", "IMEX 99999999999999999999"])
def test_parse_never_fails_and_numbers_are_bounded(report: list[str]) -> None:
    """Whatever the worker printed, parse returns a Report (never raises) whose numbers
    are ASCII-digit numbers of at most 18 digits, or it says which line did not parse;
    the node rules then run on it without raising."""
    r = remote.parse("\n".join(report))
    for n in (*(r.shm or ()), r.gpus, r.imex or 0):
        assert isinstance(n, int) and 0 <= n < 10**18
    outcome("unparsed" if r.unparsed else "parsed")
    nodecheck.problems(
        {"w0": r}, {"w0": 2}, {"NCCL_MNNVL_ENABLE": "1"}, {"shm", "nccl", "gpus", "rdma", "imex"}
    )
