"""Fuzz target: the authorized_keys line reader (ssh/keys.py). The rule every fuzz target
follows, and the shared strategies: tests/support/strategies.py."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core.errors import ConfigError, ExitStatus
from mpi_bootstrap.ssh import keys
from tests.support.strategies import KEY_LINE, fuzz, outcome, public_keys, tainted

pytestmark = pytest.mark.timeout(120)


authorized_lines = st.one_of(
    public_keys,
    st.builds(lambda k, c: f"{k} {c}", public_keys, st.text(max_size=20)),
    st.builds(
        lambda o, k: f"{o} {k}",
        st.sampled_from(
            [
                'command="id"',
                'from="*",no-pty',
                "restrict",
                'environment="A=b"',
                'command="ssh-ed25519 AAAAAAAAAAAAAAAAAAAAAAAA"',
                "cert-authority",
            ]
        ),
        public_keys,
    ),
    st.builds(
        lambda sp, k, end: k.replace(" ", sp) + end,
        st.sampled_from([" ", "\t", "  ", "\u2003", "\x0b", "\n"]),
        public_keys,
        st.sampled_from(["", "\n", "\r\n", "\r", " \n", "\x00"]),
    ),
    tainted(public_keys),
    st.text(max_size=40),
)


class TestPublicKeyFuzz:
    """An authorized_keys line yields exactly `type base64` (no option, no comment) or a
    ConfigError (64) naming where it came from."""

    @fuzz(2000)
    @given(authorized_lines)
    @example('command="curl x|sh" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq')
    @example("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq\nssh-rsa AAAAB3NzaC1yc2E")
    def test_clean_public_key(self, line: str) -> None:
        """An authorized_keys line yields only its own first two fields, `type base64` (no option,
        comment or second key), or a ConfigError (64) naming where it came from."""
        where = "fuzz/authorized_keys:3"
        try:
            key = keys.clean_public_key(line, where=where)
        except ConfigError as exc:
            outcome("ConfigError")
            assert exc.status == ExitStatus.CONFIG == 64
            assert exc.problems == [f"{where}: not an OpenSSH public key line"]
            return
        outcome("key")
        m = KEY_LINE.fullmatch(key)
        assert m, key
        # The line's own first two fields: nothing was taken from an option or a comment.
        assert line.split()[:2] == [m.group(1), m.group(2)]
