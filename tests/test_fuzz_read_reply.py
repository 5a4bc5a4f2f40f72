"""Fuzz target: the launcher's reading of a net exchange reply (ssh/netx.py, read_reply),
and of the challenge a worker sends first (read_challenge).
The rule every fuzz target follows, and the shared strategies: tests/support/strategies.py
and tests/support/fuzz_exchange.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.ssh import netx
from mpi_bootstrap.ssh.netx import RecordError
from tests.support.fuzz_exchange import (
    CHALLENGE,
    NONCE,
    RECORD,
    TARGET,
    TOKEN,
    challenges,
    check_read_reply,
    nonces,
    signed,
)
from tests.support.strategies import (
    fuzz,
    json_values,
    near_valid_records,
    outcome,
    record_dicts,
    record_is_valid,
)

pytestmark = pytest.mark.timeout(120)


@st.composite
def replies(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(reply, token it is signed with): a valid reply to NONCE signed with TOKEN, with up
    to two changes: type, nonce, record (near-valid or any JSON), token, an extra field."""
    reply: dict[str, Any] = {
        "v": 3,
        "type": "record",
        "nonce": NONCE,
        "record": draw(st.just(RECORD.to_dict()) | record_dicts),
    }
    token = TOKEN
    changes = st.sampled_from(["type", "nonce", "record", "token", "extra"])
    for change in draw(st.lists(changes, max_size=2, unique=True)):
        if change == "type":
            reply["type"] = draw(st.sampled_from(["denied", "hello", "RECORD", None]))
        elif change == "nonce":
            reply["nonce"] = draw(
                st.sampled_from(["cd" * 32, NONCE.upper(), NONCE + "\n", NONCE[:-1]]) | nonces
            )
        elif change == "record":
            reply["record"] = draw(near_valid_records() | json_values)
        elif change == "token":
            token = draw(st.sampled_from([TOKEN + "x", "", TOKEN.upper()]) | st.text())
        else:
            reply[draw(st.text(max_size=6))] = draw(json_values)
    return reply, token


class TestReadReplyFuzz:
    """The launcher takes a record only from a reply signed with its token that echoes its
    own nonce, and a challenge only as one line of protocol 3 holding 64 hex digits;
    anything else is a RecordError, never another exception."""

    @fuzz(1000)
    @given(st.binary(max_size=400))
    @example(b"[" * 100_000)
    def test_bytes(self, raw: bytes) -> None:
        """Any unsigned bytes as a reply are a RecordError naming the target, never a record or
        another exception."""
        assert check_read_reply(raw) is None

    @fuzz(1000)
    @given(json_values)
    def test_any_json(self, value: object) -> None:
        """Any JSON value as an unsigned reply is a RecordError, never a record or another error."""
        assert check_read_reply(json.dumps(value).encode()) is None

    @fuzz(1200)
    @given(replies())
    def test_signed(self, reply_token: tuple[dict[str, Any], str]) -> None:
        """A signed reply yields its record exactly when it has the job's token, type `record`, our
        nonce and a valid record of the worker asked; anything else is a RecordError."""
        reply, token = reply_token
        try:
            raw = signed(reply, token)
        except UnicodeEncodeError:  # a lone surrogate cannot be a token: nothing to send
            return
        record = check_read_reply(raw)
        ok = (
            token == TOKEN
            and reply["type"] == "record"
            and reply["nonce"] == NONCE
            and record_is_valid(reply["record"])
            and reply["record"]["host"].lower() == TARGET
        )  # the worker asked
        assert (record is not None) == ok
        if record is not None:
            assert record.to_dict() == {**reply["record"], "v": 1}

    @fuzz(800)
    @given(
        st.one_of(
            st.binary(max_size=200),
            st.builds(
                lambda v, t, c, extra: json.dumps(
                    {"v": v, "type": t, "challenge": c, **extra}
                ).encode(),
                st.sampled_from([3, 3, 2, "3", 3.0, True]),
                st.sampled_from(["challenge", "challenge", "hello", "record", None]),
                challenges,
                st.sampled_from([{}, {}, {"mac": ""}, {"nonce": NONCE}]),
            ),
        )
    )
    @example(b"")
    @example(b"[" * 100_000)
    @example(json.dumps({"v": 3, "type": "challenge", "challenge": CHALLENGE}).encode())
    def test_challenge(self, raw: bytes) -> None:
        """Any first line is the challenge exactly when it is {"v": 3, "type": "challenge",
        "challenge": 64 lowercase hex}, else a RecordError naming the worker."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            message = None
        valid = (
            isinstance(message, dict)
            and set(message) == {"v", "type", "challenge"}
            and type(message["v"]) is int
            and message["v"] == 3
            and message["type"] == "challenge"
            and isinstance(message["challenge"], str)
            and len(message["challenge"]) == 64
            and set(message["challenge"]) <= set("0123456789abcdef")
        )
        try:
            challenge = netx.read_challenge(raw, TARGET)
        except RecordError as exc:
            outcome("RecordError")
            assert str(exc).startswith(f"{TARGET}: ")
            assert not valid
            return
        outcome("challenge")
        assert valid and challenge == message["challenge"]  # type: ignore[index]
