"""Fuzz target: the worker's sshd_config writer (ssh/sshd.py). The rule every fuzz target
follows, and the shared strategies: tests/support/strategies.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import names
from mpi_bootstrap.ssh import sshd
from mpi_bootstrap.ssh.sshconfig import UnsafeValue
from tests.support.strategies import LDH, any_hosts, fuzz, ipv4, ipv6, outcome, tainted, users

pytestmark = pytest.mark.timeout(120)


SSHD_KEYWORDS = {
    "Port",
    "ListenAddress",
    "HostKey",
    "PidFile",
    "AuthorizedKeysFile",
    "AllowUsers",
    "PubkeyAuthentication",
    "PasswordAuthentication",
    "KbdInteractiveAuthentication",
    "HostbasedAuthentication",
    "PermitEmptyPasswords",
    "PermitRootLogin",
    "UsePAM",
    "PermitUserEnvironment",
    "DisableForwarding",
    "AllowAgentForwarding",
    "AllowTcpForwarding",
    "AllowStreamLocalForwarding",
    "X11Forwarding",
    "PermitTunnel",
    "UseDNS",
    "StrictModes",
    "AcceptEnv",
    "LogLevel",
    "SetEnv",
}
plain_paths = st.builds(lambda p: "/" + p, st.text(LDH + "_./@+-", max_size=20))
any_paths = st.one_of(plain_paths, tainted(st.just("/run/mpi-bootstrap/key")), st.text(max_size=20))


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` 9 times in 10 (one_of would not weight a strategy listed twice)."""
    return st.integers(0, 9).flatmap(lambda n: bad if n == 0 else good)


class TestSshdConfigFuzz:
    """The worker's sshd_config: unsafe paths, users or addresses raise UnsafeValue;
    otherwise every line is one known keyword and its value, each keyword once (sshd
    takes the first), so no value can add `PasswordAuthentication yes`."""

    @fuzz(800)
    @given(
        st.fixed_dictionaries(
            {
                "host_key": mostly(plain_paths, any_paths),
                "authorized_keys": mostly(plain_paths, any_paths),
                "pid_file": mostly(plain_paths, any_paths),
                "user": mostly(users, st.text(max_size=12)),
                "listen": st.lists(mostly(ipv4 | ipv6, any_hosts), max_size=3),
                "port": st.one_of(st.integers(1, 65535), st.integers(-2, 70000)),
                "control": st.one_of(st.none(), mostly(plain_paths, any_paths)),
            }
        )
    )
    @example(
        {
            "host_key": "/k",
            "authorized_keys": "/x\nPasswordAuthentication yes\n#",
            "pid_file": "/p",
            "user": "root",
            "listen": [],
            "port": 22,
        }
    )
    @example(
        {
            "host_key": "/k",
            "authorized_keys": "/a",
            "pid_file": "/p",
            "user": "root",
            "listen": ["::1%\nPasswordAuthentication yes"],
            "port": 22,
        }
    )
    @example(
        {
            "host_key": "/k",
            "authorized_keys": "/a",
            "pid_file": "/p",
            "user": "root",
            "listen": [],
            "port": 22,
            "control": "/f LD_PRELOAD=/tmp/x.so",
        }
    )
    def test_config_text(self, args: dict[str, Any]) -> None:
        """config_text refuses (UnsafeValue) any unsafe path, user, address or port; else each line
        is a known keyword, once, so no value can turn on password login or forwarding."""
        try:
            text = sshd.config_text(**args)
        except UnsafeValue:
            outcome("refused")
            assert not (
                all(
                    map(
                        names.is_plain_path,
                        (
                            args["host_key"],
                            args["authorized_keys"],
                            args["pid_file"],
                            args.get("control") or "/",
                        ),
                    )
                )
                and names.is_user_name(args["user"])
                and 0 < args["port"] <= 65535
                and all(map(names.is_ip_literal, args["listen"]))
            )
            return
        outcome("written")
        lines = text.splitlines()
        assert lines[0].startswith("# ") and text.endswith("\n")
        words = [ln.split(" ", 1)[0] for ln in lines[1:]]
        assert set(words) <= SSHD_KEYWORDS
        assert all(words.count(w) == 1 for w in set(words) - {"ListenAddress"})
        assert words.count("ListenAddress") == len(args["listen"])
        assert "PasswordAuthentication no" in lines
        assert "StrictModes no" in lines and "DisableForwarding yes" in lines
        setenv = [ln for ln in lines if ln.startswith("SetEnv ")]
        control = args.get("control")
        assert setenv == ([f"SetEnv MPI_BOOTSTRAP_CONTROL={control}"] if control else [])
