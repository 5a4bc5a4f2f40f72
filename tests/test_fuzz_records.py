"""Fuzz target: the exchange record decoder (core/records.py). The rule every fuzz target
follows, and the shared strategies: tests/support/strategies.py."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import records
from mpi_bootstrap.ssh.netx import RecordError
from tests.support.strategies import (
    check_record,
    fuzz,
    json_values,
    near_valid_records,
    outcome,
    record_is_valid,
)

pytestmark = pytest.mark.timeout(120)


def check_decode(text: bytes | str) -> None:
    try:
        record = records.decode(text, "fuzz/w0.json")
    except RecordError as exc:
        outcome("RecordError")
        assert str(exc).startswith("fuzz/w0.json: ")
        return
    check_record(record)


def check_record_from(value: object) -> None:
    """The decoder and the validator agree with the independent oracle on `value`."""
    check_decode(json.dumps(value))
    try:
        record = records.record_from(value)
    except RecordError:
        assert not record_is_valid(value)
        return
    assert record_is_valid(value)
    check_record(record)


class TestRecordDecodeFuzz:
    """Any bytes or JSON give a Record whose fields are inert and that round-trips, or a
    RecordError; never another exception (RecursionError included)."""

    @fuzz(1000)
    @given(st.binary(max_size=300))
    @example(b"\xff\xfe{")
    @example(b"[" * 100_000)
    def test_bytes(self, data: bytes) -> None:
        """Any bytes decode to an inert, round-tripping Record or a RecordError naming the file,
        never another exception."""
        check_decode(data)

    @fuzz(1000)
    @given(json_values)
    def test_any_json(self, value: object) -> None:
        """For any JSON value, decode and record_from accept exactly what the independent oracle
        deems valid, and what they accept is inert and round-trips."""
        check_record_from(value)

    @fuzz(1200)
    @given(near_valid_records())
    @example(
        {
            "v": 1,
            "host": "w0",
            "addresses": ["::1%\n  ProxyCommand sh -c id"],
            "port": 22,
            "user": "mpi",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq",
        }
    )
    def test_near_valid(self, value: object) -> None:
        """Records with one field broken, dropped or added (an injected address included) are
        accepted exactly when the independent oracle deems them valid."""
        check_record_from(value)

    def test_deep_nesting(self) -> None:
        """JSON nested up to 100,000 deep is a RecordError, not a RecursionError."""
        for depth in [*range(1, sys.getrecursionlimit() + 50), 10_000, 100_000]:
            for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
                with pytest.raises(RecordError):
                    records.decode(text, "deep")
