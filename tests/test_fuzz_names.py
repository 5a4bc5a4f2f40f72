"""Fuzz target: the names predicates (core/names.py), which guard every value written
into the agent's files. The rule every fuzz target follows, and the shared strategies:
tests/support/strategies.py."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import names
from tests.support.strategies import fuzz, inert, public_keys, tainted, users, valid_hosts, zoned

pytestmark = pytest.mark.timeout(120)


class TestNamePredicates:
    """Whatever a names predicate accepts holds no whitespace, control character, quote,
    comma or '#', so it can be written into any of the agent's files as one token."""

    @fuzz(2000)
    @given(
        st.one_of(
            st.text(max_size=40),
            tainted(valid_hosts),
            tainted(users),
            tainted(public_keys),
            zoned,
            valid_hosts,
            public_keys,
        )
    )
    @example("::1%\n  ProxyCommand sh -c id")  # was accepted by is_ip_literal
    @example('fe80::1%a"b,c')
    @example("fe80::1%eth0")
    def test_accepted_is_inert(self, text: str) -> None:
        """Whatever is_host, is_dns_name, is_ip_literal, is_user_name or is_public_key accepts is
        inert (an IPv6 zone carrying a newline and an ssh option once passed is_ip_literal)."""
        for accepts in (names.is_host, names.is_dns_name, names.is_ip_literal, names.is_user_name):
            if accepts(text):
                assert inert(text), (accepts.__name__, text)
        if names.is_public_key(text):
            kind, blob = text.split(" ")
            assert inert(kind) and inert(blob)
