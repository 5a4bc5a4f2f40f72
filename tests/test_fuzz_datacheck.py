"""Fuzz target: what a worker's data check session says to the launcher (ssh/datacheck.py
`report` and `probe_result`, validated by core/datanet.py). A compromised worker is in the
threat model (SECURITY.md): its report's values build the other workers' probe lines and
the launcher's messages. The rule every fuzz target follows, and the shared strategies:
tests/support/strategies.py."""

from __future__ import annotations

import json
import re
import string
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import datanet, names
from mpi_bootstrap.ssh import datacheck
from tests.support.strategies import NASTY, fuzz, ipv4, ipv6, json_values, outcome, tainted

pytestmark = pytest.mark.timeout(120)

NIC = "net1"
PEERS = frozenset({"job-worker-0", "job-worker-2"})
RECORD = datanet.DataNIC(NIC, ("10.251.0.12",), 1500)
TARGET = re.compile(r"[a-z0-9-]+=[0-9a-f.:]+:\d{1,5}:\d{2,5}")
VALID = {
    "nic": NIC,
    "mtu": 1500,
    "addresses": ["10.251.0.12"],
    "rdma": [],
    "memlock": -1,
    "port": 4444,
}
JUNK: dict[str, st.SearchStrategy[Any]] = {
    "nic": st.one_of(tainted(st.just(NIC)), st.just("net2")),
    "mtu": st.sampled_from([0, 67, 65537, True, 1500.0, "1500", None, {}, [1500]]),
    "addresses": st.one_of(
        st.lists(tainted(ipv4), min_size=1, max_size=2),
        st.lists(st.one_of(ipv4, ipv6), max_size=20),
        st.just([]),
        st.just({"10.251.0.12": 1}),
        st.just("10.251.0.12"),
    ),
    "rdma": st.one_of(st.lists(tainted(st.just("mlx5_0")), max_size=2), st.just("mlx5_0")),
    "memlock": st.sampled_from([-2, True, 1.0, "-1", None, 2**80]),
    "port": st.one_of(
        st.sampled_from([0, 65536, True, 22.0, "22", None, "1:1500 evil=10.0.0.1:80"]),
        tainted(st.just("4444")),
        st.integers(),
    ),
}


@st.composite
def near_valid_reports(draw: st.DrawFn) -> object:
    """A valid report with (usually) one field broken, dropped, or one added; or an
    error report."""
    report: dict[str, Any] = dict(VALID)
    field = draw(st.sampled_from(sorted(VALID)))
    how = draw(st.sampled_from(["keep", "junk", "junk", "json", "drop", "extra", "error"]))
    if how == "junk":
        report[field] = draw(JUNK[field])
    elif how == "json":
        report[field] = draw(json_values)
    elif how == "drop":
        del report[field]
    elif how == "extra":
        report[draw(st.text(max_size=8))] = draw(json_values)
    elif how == "error":
        report = {
            "nic": NIC,
            "error": draw(st.sampled_from(["missing", *NASTY]) | st.text(max_size=300)),
            "have": draw(st.lists(st.sampled_from(["eth0", "lo", *NASTY]), max_size=3)),
        }
    return report


def one_line(text: str) -> bool:
    """One printable line (the worker's words escaped to ASCII, cut with '…'): what may
    go into a message, a log line or a finding."""
    return text.isprintable() and text.replace("…", "").isascii()


def check_report(line: str) -> None:
    """Any line gives (facts, why) — never an exception; a refusal is one printable line
    naming the worker; accepted facts are inert and build only well-formed probe lines."""
    facts, why = datacheck.report("job-worker-1", line, NIC, RECORD)
    if why is not None:
        assert why.startswith("job-worker-1") and one_line(why), why
    if facts is None:
        outcome("refused")
        assert why is not None
        return
    if "error" in facts:
        outcome("error report")
        assert why is not None and facts["nic"] == NIC
        return
    outcome("accepted")
    assert facts["nic"] == NIC and facts["addresses"][0] in RECORD.addresses
    assert all(names.is_ip_literal(a) and one_line(a) for a in facts["addresses"])
    assert type(facts["port"]) is int and 1 <= facts["port"] <= 65535
    assert type(facts["mtu"]) is int and 68 <= facts["mtu"] <= 65536
    other = {**VALID, "addresses": ["10.251.0.11"]}
    lines = datacheck.requests({"job-worker-0": other, "job-worker-1": facts}, seed=0)
    for words in lines.values():
        allowed, *targets = words
        assert allowed.startswith("from=") and " " not in allowed
        assert all(names.is_ip_literal(a) for a in allowed[5:].split(","))
        assert targets and all(TARGET.fullmatch(t) for t in targets), targets


class TestReportFuzz:
    """A session's first line, whatever a compromised worker puts there."""

    @fuzz(600)
    @given(st.text(max_size=200))
    @example("[]")
    @example('{"nic": "net1", "mtu": {}, "addresses": ["10.251.0.12"]}')
    @example("[" * 100_000)
    def test_text(self, line: str) -> None:
        """Any text is a refusal naming the worker or inert facts, never an exception."""
        check_report(line)

    @fuzz(600)
    @given(json_values)
    def test_json(self, value: object) -> None:
        """Any JSON value is a refusal naming the worker or inert facts."""
        check_report(json.dumps(value))

    @fuzz(1500)
    @given(near_valid_reports())
    @example({**VALID, "port": "1:1500 evil=10.251.0.66:1"})
    @example({**VALID, "addresses": ["169.254.169.254"], "port": 80})
    @example({**VALID, "addresses": []})
    def test_near_valid(self, report: object) -> None:
        """Reports one field away from valid: each field is checked, and must agree with
        the worker's record."""
        check_report(json.dumps(report))

    def test_valid_is_accepted(self) -> None:
        """The honest report passes (the fuzz's control)."""
        facts, why = datacheck.report("job-worker-1", json.dumps(VALID), NIC, RECORD)
        assert why is None and facts == VALID


results = st.fixed_dictionaries(
    {"peer": st.sampled_from(sorted(PEERS)), "ok": st.booleans()},
    optional={
        "kind": st.text(max_size=40) | st.sampled_from(NASTY),
        "address": st.one_of(ipv4, tainted(ipv4)),
        "port": st.integers(-1, 70000),
        "mtu": st.integers(0, 70000),
        "reaches": st.integers(-1, 70000),
    },
)


class TestProbeResultFuzz:
    """The lines of a session's probes."""

    @fuzz(600)
    @given(st.one_of(json_values.map(json.dumps), results.map(json.dumps), st.text(max_size=80)))
    @example("[]")
    @example('{"done": []}')
    @example('{"peer": {"a": 1}, "ok": 1}')
    def test_any_line(self, line: str) -> None:
        """Any line is a refusal naming the worker, `done`, or a result for a peer it was
        given whose every field is inert; never an exception."""
        result, why = datacheck.probe_result("job-worker-1", line, PEERS)
        if result is None:
            outcome("refused")
            assert why is not None and why.startswith("job-worker-1") and one_line(why)
            return
        assert why is None
        if "done" in result:
            outcome("done")
            assert set(result) == {"done"} and type(result["done"]) is int
            return
        outcome("result")
        assert result["peer"] in PEERS and isinstance(result["ok"], bool)
        problem = datanet.probe_problem(NIC, "job-worker-1", result)
        assert problem is None or one_line(problem), problem
        assert set(string.whitespace[1:]).isdisjoint(problem or "")
