"""The worker's private OpenSSH sshd: its config, a port, and starting it until it answers."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence

from mpi_bootstrap.core.env import ACCEPT_ENV
from mpi_bootstrap.core.errors import PeerUnavailableError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import is_ip_literal, is_plain_path, is_user_name
from mpi_bootstrap.core.remote import CONTROL_ENV
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh.sshconfig import UnsafeValue
from mpi_bootstrap.system.retry import LOCAL, retry_until

BANNER = b"SSH-2.0-"
SETENV_SINCE = (8, 7)  # sshd_config's SetEnv; older sshd refuses the whole file
PORT_TRIES = 5


# What every job's sshd says the same way.
FIXED = (
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "HostbasedAuthentication no",
    "PermitEmptyPasswords no",
    "PermitRootLogin prohibit-password",
    "UsePAM no",
    "PermitUserEnvironment no",
    # No forwarding of any kind (agent, TCP, stream-local sockets, X11, tunnels):
    # DisableForwarding covers them all; the single switches say so in `sshd -T`.
    "DisableForwarding yes",
    "AllowAgentForwarding no",
    "AllowTcpForwarding no",
    "AllowStreamLocalForwarding no",
    "X11Forwarding no",
    "PermitTunnel no",
    "UseDNS no",
    # Off: the agent checks its state directory itself, knowing the sticky bit, and holds
    # open one that others could rename (system/files.py state_dir; SECURITY.md 14).
    "StrictModes no",
)


def config_text(
    *,
    port: int,
    listen: Sequence[str],
    host_key: str,
    authorized_keys: str,
    pid_file: str,
    user: str,
    control: str | None = None,
) -> str:
    """sshd_config for one job: public-key login for the job's user only. `control`: the
    worker's PID 1's control FIFO (pid1/control.py), named to every session by `SetEnv`
    (OpenSSH 8.7 or later: see `takes_setenv`).

    Every value is checked first (UnsafeValue otherwise): sshd takes the *first* value of
    a keyword, so one injected line (`PasswordAuthentication yes`) would win.
    """
    for path in (host_key, authorized_keys, pid_file, control or "/"):
        if not is_plain_path(path):
            raise UnsafeValue(f"{path!r} is not a plain absolute path")
    if not all(is_ip_literal(a) for a in listen) or not is_user_name(user) or not 0 < port <= 65535:
        raise UnsafeValue(
            f"listen {list(listen)!r}, user {user!r}, port {port!r}: not "
            "addresses, a user name and a port"
        )
    lines = [
        "# Written by mpi-bootstrap: a private sshd for this MPI job only.",
        f"Port {port}",
        *(f"ListenAddress {a}" for a in listen),
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"AllowUsers {user}",
        *FIXED,
        f"AcceptEnv {' '.join(ACCEPT_ENV)}",
        "LogLevel INFO",
    ]
    if control:
        lines.append(f"SetEnv {CONTROL_ENV}={control}")
    return "\n".join(lines) + "\n"


def version(sshd: str) -> tuple[int, int] | None:
    """OpenSSH's version of the `sshd` binary (`sshd -V`; one before 9.1 names it in
    its usage message), or None if it does not say."""
    _, out = children.capture([sshd, "-V"], timeout=5.0)
    found = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else None


def takes_setenv(openssh: tuple[int, int] | None) -> bool:
    """Does an sshd of OpenSSH `openssh` (`version`) take sshd_config's SetEnv?"""
    return openssh is not None and openssh >= SETENV_SINCE


def free_port(address: str) -> int:
    """A port the OS says is free now (it may be taken again before sshd binds it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def port_in_use(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return True
    return False


def listening(
    port: int, pid: int | None = None, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")
) -> bool:
    """Is a TCP socket of this network namespace listening on `port` (one of process
    `pid`'s, if given)? Read from the kernel's tables, without connecting: sshd logs two
    lines for every connection (`kex_exchange_identification: … Connection reset`), so a
    readinessProbe every 10 s would fill the worker's log with them."""
    wanted = f"{port:04X}"
    inodes: set[str] = set()
    for table in tables:
        try:
            with open(table, encoding="ascii") as fh:
                next(fh, None)  # the header
                for line in fh:
                    fields = line.split()
                    # local_address is ADDR:PORT in hex; st 0A is TCP_LISTEN
                    if (
                        len(fields) > 9
                        and fields[3] == "0A"
                        and fields[1].rsplit(":", 1)[-1] == wanted
                    ):
                        inodes.add(fields[9])
        except OSError:
            continue
    if pid is None or not inodes:
        return bool(inodes)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:[") : -1] in inodes:
                return True
    return False


def answers(address: str, port: int, timeout: float = 1.0) -> bool:
    """Does an SSH server answer on address:port with its banner?"""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            return conn.recv(len(BANNER)) == BANNER
    except OSError:
        return False


def _up(pid: int, port: int, bind_address: str, fixed_port: int) -> str | None:
    """`ready` (its own socket: no connection for sshd to log), `lost` (its port was
    taken first), None (not yet); raises when sshd failed for good."""
    if listening(port, pid):
        return "ready"
    code = children.exited(pid)
    if code is None:
        return None
    taken = port_in_use(bind_address, port)
    if taken and not fixed_port:
        return "lost"
    why = (
        (
            f"port {port} is already in use (a system sshd, or hostNetwork "
            "pods on one node: mpi-operator #593)"
        )
        if taken
        else f"sshd exited with {code} (its messages are above)"
    )
    raise PeerUnavailableError(f"worker sshd did not start: {why}", phase="sshd")


def start(
    argv_for_port: Callable[[int], list[str]],
    env: Mapping[str, str],
    *,
    fixed_port: int,
    probe_address: str,
    bind_address: str,
    log: Log,
    timeout: float = 10.0,
) -> tuple[int, int, list[str]]:
    """Start sshd and wait for its banner. Returns (pid, port, argv).

    With a fixed port, a port in use is an error naming it. With port 0, a port chosen
    by the OS can be taken before sshd binds it: then a new port is tried.
    """
    for attempt in range(1, PORT_TRIES + 1):
        port = fixed_port or free_port(bind_address)
        argv = argv_for_port(port)
        pid = children.spawn(argv, env, group=False)

        outcome = retry_until(
            time.monotonic() + timeout,
            functools.partial(_up, pid, port, bind_address, fixed_port),
            every=LOCAL,
        )
        if outcome == "ready":
            log("sshd ready", port=port, pid=pid, attempt=attempt)
            return pid, port, argv
        if outcome == "lost":
            log(
                "sshd lost its port",
                level="warning",
                port=port,
                attempt=attempt,
                reason="another process bound it first; trying a new port",
            )
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        children.exited(pid, wait=True)
        raise PeerUnavailableError(
            f"worker sshd did not answer on {probe_address}:{port} within {timeout:g} s",
            phase="sshd",
        )
    raise PeerUnavailableError(
        f"worker sshd lost the race for a free port {PORT_TRIES} times", phase="sshd"
    )
