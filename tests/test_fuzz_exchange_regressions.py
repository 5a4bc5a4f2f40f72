"""Inputs that made the net exchange raise, or accept what it must not, before it was
fixed (found by the fuzz targets): each is now denied, without an exception. The shared
strategies: tests/support/strategies.py and tests/support/fuzz_exchange.py."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.fuzz_exchange import (
    NONCE,
    VALID_HELLO,
    Worker,
    check_denied,
    check_read_reply,
    hex_nonces,
    signed,
)
from tests.support.strategies import fuzz

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- exchange: regressions


class TestExchangeRegressions:
    """Inputs that made the net exchange raise, or accept what it must not, before it was fixed
    (found by the targets above): each is now denied, without an exception."""

    @fuzz(50)
    @given(st.text(min_size=1).filter(lambda t: not t.isascii()))
    @example("é")
    def test_non_ascii_mac(self, mac: str) -> None:
        """A non-ASCII mac is denied by the worker and a RecordError for read_reply, not a
        TypeError (hmac.compare_digest refuses non-ASCII text)."""
        worker = Worker()
        check_denied(worker, worker.answer(json.dumps({**VALID_HELLO, "mac": mac}).encode()))
        # "v": 3, so read_reply gets as far as the mac (not refused at the version)
        raw = json.dumps({"v": 3, "type": "record", "nonce": NONCE, "record": {}, "mac": mac})
        assert check_read_reply(raw.encode()) is None

    @fuzz(50)
    @given(st.integers(min_value=2**1024, max_value=10**400))
    @example(10**309)
    def test_huge_time(self, stamp: int) -> None:
        """A hello whose time is an int too large for a float was an OverflowError (protocol 2);
        a hello with a time at all is now denied (protocol 3 has none)."""
        worker = Worker()
        check_denied(worker, worker.answer(signed({**VALID_HELLO, "time": stamp})))

    @fuzz(50)
    @given(st.text(min_size=1, max_size=64).filter(lambda t: not t.isascii()))
    @example("é" * 64)
    def test_non_ascii_challenge(self, challenge: str) -> None:
        """A signed hello whose challenge is non-ASCII text is denied, not a TypeError
        (hmac.compare_digest, which compares the challenges, refuses non-ASCII text)."""
        worker = Worker()
        check_denied(worker, worker.answer(signed({**VALID_HELLO, "challenge": challenge})))

    @fuzz(50)
    @given(hex_nonces)
    @example("0" * 64)
    def test_nonce_with_newline(self, nonce: str) -> None:
        """A valid nonce with a trailing newline is denied (`$` matched before the newline)."""
        worker = Worker()
        check_denied(worker, worker.answer(signed({**VALID_HELLO, "nonce": nonce + "\n"})))

    def test_deep_nesting(self) -> None:
        """JSON nested beyond the recursion limit is denied by the worker and a RecordError for
        read_reply, not a RecursionError."""
        for depth in range(1, sys.getrecursionlimit() + 50):
            nested = "[" * depth + "]" * depth
            raw = (
                f'{{"v":3,"type":"hello","challenge":"","nonce":{nested},"client_key":"",'
                f'"target":"","mac":""}}'
            ).encode()
            worker = Worker()
            check_denied(worker, worker.answer(raw))
            reply = (f'{{"v":3,"type":"record","nonce":{nested},"record":{{}},"mac":""}}').encode()
            assert check_read_reply(reply) is None
