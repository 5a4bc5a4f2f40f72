"""Connections made from inside a pod of the simulated cluster (tests/support/cluster.py):
a TCP socket in the pod's network namespace, waiting for a port there to listen, and one
turn of the net exchange (the worker's challenge, one line sent, the reply)."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable

from mpi_bootstrap.ssh import netx
from tests.support.cluster import Pod
from tests.support.wait import wait_until

EXCHANGE_PORT = 2223  # the worker's net exchange

# A TCP listener program for a pod (`python3 -c LISTEN ADDRESS PORT`) that says who
# connects to it: where a forged report would send the honest workers' probes, or a
# planted record points.
LISTEN = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("listening", flush=True)
while True:
    c, peer = s.accept()
    print(f"connection from {peer[0]}", flush=True)
    c.close()
"""

_CLONE_NEWNET = 0x40000000


def connect(pod: Pod, address: str, port: int, timeout: float = 10.0) -> socket.socket:
    """A TCP connection made from inside `pod`'s network namespace.

    A socket stays in the namespace it was created in, so a short-lived thread enters the
    pod (setns affects only the calling thread) and hands the connected socket back.
    """
    box: list[socket.socket | BaseException] = []

    def inner() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{pod.netns.name}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            box.append(socket.create_connection((address, port), timeout=timeout))
        except BaseException as exc:  # handed to the caller's thread
            box.append(exc)

    t = threading.Thread(target=inner)
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def wait_listening(
    pod: Pod, address: str, port: int, proc: subprocess.Popen[str], timeout: float = 15.0
) -> None:
    """Until a connection from `pod` to address:port succeeds; fails at once if `proc`
    (the program meant to listen there) exits."""

    def listening() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            connect(pod, address, port, timeout=1.0).close()
        except OSError:
            return False
        return True

    wait_until(listening, timeout, f"something to listen on {address}:{port} in {pod.name}")


def ask(
    pod: Pod, address: str, line: bytes | Callable[[str], bytes], port: int = EXCHANGE_PORT
) -> bytes:
    """One net-exchange turn from `pod`: read the worker's challenge, send `line` as it is
    (a captured hello replayed) or `line(challenge)` (a hello made for this connection),
    and return the reply line."""
    with connect(pod, address, port) as conn:
        data = b""

        def next_line() -> bytes:
            nonlocal data
            while b"\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            first, _, data = data.partition(b"\n")
            return first

        challenge = netx.read_challenge(next_line(), address)
        conn.sendall(line(challenge) if callable(line) else line)
        return next_line()


def hello_for(
    token: str, key: str, target: str, nonces: list[str] | None = None
) -> Callable[[str], bytes]:
    """`ask`'s line: a hello signed with `token` for the connection's challenge (its nonce
    appended to `nonces`)."""

    def make(challenge: str) -> bytes:
        hello, nonce = netx.make_hello(token, key, target, challenge)
        if nonces is not None:
            nonces.append(nonce)
        return hello

    return make


def replay(pod: Pod, address: str, raw: bytes, port: int = EXCHANGE_PORT) -> list[bytes]:
    """Send a captured line as it is, at once (whatever the peer says first: protocol 2
    said nothing before the hello), from `pod`; every line the peer sends until it
    closes."""
    with connect(pod, address, port) as conn:
        conn.sendall(raw.rstrip(b"\n") + b"\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return [ln for ln in data.split(b"\n") if ln]
