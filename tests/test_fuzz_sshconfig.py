"""Fuzz target: the launcher's ssh client config and known_hosts writers
(ssh/sshconfig.py). The rule every fuzz target follows, and the shared strategies:
tests/support/strategies.py."""

from __future__ import annotations

import dataclasses
import re
import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import names
from mpi_bootstrap.ssh import sshconfig
from mpi_bootstrap.ssh.sshconfig import Peer, UnsafeValue
from tests.support.strategies import (
    KEY_LINE,
    any_hosts,
    fuzz,
    good_hostnames,
    inert,
    outcome,
    public_keys,
    tainted,
    users,
    valid_hosts,
)

pytestmark = pytest.mark.timeout(120)


IDENTITY, KNOWN_HOSTS = "/run/mpi-bootstrap/id_job", "/run/mpi-bootstrap/known_hosts"
COMMON = {
    "IdentityFile": IDENTITY,
    "IdentitiesOnly": "yes",
    "UserKnownHostsFile": KNOWN_HOSTS,
    "GlobalKnownHostsFile": "/dev/null",
    "StrictHostKeyChecking": "yes",
    "UpdateHostKeys": "no",
    "BatchMode": "yes",
    "ConnectionAttempts": "3",
    "ServerAliveInterval": "30",
    "SendEnv": " ".join(sshconfig.SEND_ENV),
    "LogLevel": "ERROR",
}
PER_PEER = ("HostName", "Port", "User", "HostKeyAlias")
_CONFIG_LINE = re.compile(r"  ([A-Za-z]+) ([!-~]+(?: [!-~]+)*)")
_KNOWN_HOSTS_LINE = re.compile(r"([A-Za-z0-9.:%_-]+) (" + KEY_LINE.pattern + ")")

peers = st.builds(
    Peer,
    names=st.lists(st.one_of(valid_hosts, any_hosts), max_size=3).map(tuple),
    hostname=st.one_of(valid_hosts, any_hosts),
    port=st.one_of(st.integers(1, 65535), st.integers(-2, 70000), st.integers()),
    user=st.one_of(users, tainted(users), st.text(max_size=10)),
    host_key=st.one_of(
        public_keys,
        tainted(public_keys),
        public_keys.map(lambda k: k + " user@host"),
        public_keys.map(lambda k: 'command="id" ' + k),
        st.text(max_size=20),
    ),
)
good_peers = st.builds(
    Peer,
    names=st.lists(good_hostnames, min_size=1, max_size=3).map(tuple),
    hostname=good_hostnames,
    port=st.integers(1, 65535),
    user=users,
    host_key=public_keys,
)
peer_lists = st.lists(st.one_of(good_peers, peers), max_size=4)


def peer_is_safe(p: Peer) -> bool:
    return (
        bool(p.names)
        and all(names.is_host(n) for n in (*p.names, p.hostname))
        and 1 <= p.port <= 65535
        and names.is_user_name(p.user)
        and names.is_public_key(p.host_key)
    )


def check_client_config(text: str, ps: list[Peer], timeout: int) -> None:
    assert text.isascii() and text.endswith("\n")
    lines = text.split("\n")[:-1]
    # No other character any reader could take for a line break.
    assert text.splitlines() == lines and all(line.isprintable() for line in lines)
    assert lines[0].startswith("# Written by mpi-bootstrap")
    blocks: list[tuple[list[str], dict[str, str]]] = []
    for line in lines[1:]:
        if line.startswith("Host "):
            patterns = line[5:].split(" ")
            assert all(inert(p) for p in patterns), line
            blocks.append((patterns, {}))
            continue
        m = _CONFIG_LINE.fullmatch(line)
        assert m and blocks, line
        keyword, value = m.groups()
        assert keyword in COMMON or keyword in PER_PEER or keyword == "ConnectTimeout", line
        assert keyword not in blocks[-1][1], f"{keyword} twice in one block"
        blocks[-1][1][keyword] = value
    assert len(blocks) == len(ps) + 1
    assert blocks[-1] == (["*"], {**COMMON, "ConnectTimeout": str(timeout)})
    for p, (patterns, body) in zip(ps, blocks, strict=False):
        assert patterns == list(dict.fromkeys(p.names))
        # (the pinning and the rest come from `Host *`: ssh takes each option from the
        # first matching block that sets it, and these set no other)
        assert body == {
            "HostName": p.hostname,
            "Port": str(p.port),
            "User": p.user,
            "HostKeyAlias": p.names[0],
        }
        assert inert(p.hostname) and inert(p.user)


def check_known_hosts(text: str, ps: list[Peer]) -> None:
    lines = text.split("\n")
    assert lines.pop() == "" and text.splitlines() == lines and len(lines) == len(ps)
    for p, line in zip(ps, lines, strict=True):
        m = _KNOWN_HOSTS_LINE.fullmatch(line)
        assert m, line
        assert m.group(1) == p.names[0] and names.is_host(m.group(1))
        assert m.group(2) == p.host_key


# ipaddress takes any zone after '%': before names.py checked it, this HostName was
# followed by a ProxyCommand line.
INJECTED = Peer(
    names=("w0",),
    hostname="::1%\n  ProxyCommand sh -c id",
    port=22,
    user="mpi",
    host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9",
)


class TestSshConfigFuzz:
    """Peers that are not all valid raise UnsafeValue; otherwise every written line has the
    fixed shape, with one Host block per peer and one known_hosts line per peer."""

    @fuzz(800)
    @given(peer_lists, st.integers(1, 10**6))
    @example([INJECTED], 10)
    @example([dataclasses.replace(INJECTED, hostname="fe80::1%eth0")], 10)
    @example([dataclasses.replace(INJECTED, names=("w0", "w0", "W0.", "10.0.0.2"))], 1)
    @example(
        [
            dataclasses.replace(
                INJECTED,
                hostname="10.0.0.2",
                host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9 x",
            )
        ],
        1,
    )
    def test_client_config(self, ps: list[Peer], timeout: int) -> None:
        """client_config raises UnsafeValue unless every peer is valid; else only fixed-shape lines:
        one Host block per peer, then `Host *` (no injected ProxyCommand)."""
        try:
            text = sshconfig.client_config(
                ps, identity=IDENTITY, known_hosts=KNOWN_HOSTS, connect_timeout=timeout
            )
        except UnsafeValue:
            outcome("UnsafeValue")
            assert not all(map(peer_is_safe, ps))
            return
        outcome("written")
        assert all(map(peer_is_safe, ps))
        check_client_config(text, ps, timeout)

    @fuzz(600)
    @given(peer_lists)
    @example([INJECTED])
    def test_known_hosts(self, ps: list[Peer]) -> None:
        """known_hosts raises UnsafeValue unless every peer is valid; else one `name type base64`
        line per peer (no comment, no option)."""
        try:
            text = sshconfig.known_hosts(ps)
        except UnsafeValue:
            outcome("UnsafeValue")
            assert not all(map(peer_is_safe, ps))
            return
        outcome("written")
        assert all(map(peer_is_safe, ps))
        check_known_hosts(text, ps)

    @fuzz(500)
    @given(
        st.one_of(
            st.text(string.ascii_letters + string.digits + "_./@+-", max_size=30).map("/".__add__),
            tainted(st.just("/run/x/id")),
            st.text(max_size=20),
        )
    )
    @example("/run/x/id\n")  # `$` matched before the newline
    def test_own_paths(self, path: str) -> None:
        """The identity and known_hosts paths are written only when plain absolute paths (no
        trailing newline); anything else is UnsafeValue."""
        try:
            text = sshconfig.client_config([], identity=path, known_hosts=path, connect_timeout=5)
        except UnsafeValue:
            assert re.fullmatch(r"/[A-Za-z0-9_./@+-]*", path) is None
            return
        assert f"  IdentityFile {path}\n" in text and text.count("\n") == len(COMMON) + 3
