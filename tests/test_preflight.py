"""launcher/session.py: which failures of a worker's check are worth another try."""

from __future__ import annotations

import pytest

from mpi_bootstrap.launcher import session

pytestmark = pytest.mark.timeout(60)


class TestPreflightRetry:
    """Only ssh's own failure to connect (exit 255) is worth another try."""

    @pytest.mark.parametrize(
        ("code", "output", "expected"),
        [
            (255, "ssh: connect to host w port 22: Connection refused", True),
            (255, "kex_exchange_identification: read: Connection reset by peer", True),
            (255, "Connection closed by 10.0.0.1 port 2222", True),
            (255, "Host key verification failed.", False),
            (255, "w: Permission denied (publickey).", False),
            (1, "my script printed: connection refused", False),
        ],
    )
    def test_transient(self, code: int, output: str, expected: bool) -> None:
        """Only ssh's own connection failures (255: refused, reset, closed) are retried; a host key
        mismatch, a denied key or the program's own exit code fail at once."""
        assert session.transient(code, output) is expected
