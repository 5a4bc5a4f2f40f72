"""What the config needs to know about this machine, gathered once before it is built."""

from __future__ import annotations

import os
import socket
import stat

from mpi_bootstrap.core import tokens
from mpi_bootstrap.core.config import Machine
from mpi_bootstrap.system import files


def machine() -> Machine:
    return Machine(
        euid=os.geteuid(),
        exists=os.path.exists,
        read_token_file=read_token_file,
        hostname=socket.gethostname(),
        creatable=creatable,
    )


def creatable(path: str) -> bool:
    """Could this user make `path`: its nearest existing directory writable (not read-only)."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path) and os.access(path, os.W_OK)


def read_token_file(path: str) -> tokens.TokenFile:
    """The token file's bytes, mode and owner, all from the one file opened.

    A symlink is followed: every key of a Kubernetes Secret volume is one (`KEY ->
    ..data/KEY`, so that the kubelet can swap a new version in at once: kubernetes
    pkg/volume/util/atomic_writer.go). What counts is the file it opens, checked on the
    open descriptor: a regular file (opened without blocking: a FIFO would hold the agent
    forever), of at most tokens.MAX_FILE bytes, whose text only root and this user could
    have chosen (files.foreign: in a 0777 emptyDir another uid renamed its own 0600 token
    over the real one and had its key authorised: tests/test_attacks.py::TestTokenFileSwap)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        problem = files.foreign(path, st, os.geteuid())
        if problem:
            raise OSError(problem)
        data = b""
        while len(data) <= tokens.MAX_FILE:
            chunk = os.read(fd, tokens.MAX_FILE + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > tokens.MAX_FILE:
            raise OSError(f"longer than {tokens.MAX_FILE} bytes")
        return tokens.TokenFile(data, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    finally:
        os.close(fd)
