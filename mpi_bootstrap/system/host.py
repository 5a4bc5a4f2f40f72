"""What the config needs to know about this machine, gathered once before it is built."""

from __future__ import annotations

import os
import socket
import stat

from mpi_bootstrap.core import tokens
from mpi_bootstrap.core.config import Machine


def machine() -> Machine:
    return Machine(
        euid=os.geteuid(),
        exists=os.path.exists,
        read_token_file=read_token_file,
        hostname=socket.gethostname(),
    )


def read_token_file(path: str) -> tokens.TokenFile:
    """The token file's bytes, mode and owner, all from the one file opened.

    A symlink is followed: every key of a Kubernetes Secret volume is one (`KEY ->
    ..data/KEY`, so that the kubelet can swap a new version in at once: kubernetes
    pkg/volume/util/atomic_writer.go). What counts is the file it opens, checked on the
    open descriptor: a regular file (opened without blocking: a FIFO would hold the agent
    forever), which neither group nor others may write (whoever could would choose the
    token), of at most tokens.MAX_FILE bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_mode & 0o022:
            raise OSError(f"others may write it ({stat.S_IMODE(st.st_mode):04o})")
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
