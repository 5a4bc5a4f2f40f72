"""The net exchange's token: its two forms (the file `MPI_BOOTSTRAP_TOKEN_FILE` names, and
`MPI_BOOTSTRAP_TOKEN`, kept for compatibility), and who else may read it in each:
docs/exchanges.md, "The net exchange's token" (tests/test_attacks.py::TestTokenNotInEnviron).
Pure: the file is read by system/host.py and handed in through `Machine` (core/config.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mpi_bootstrap.core.model import Decision

MIN_LENGTH = 16
MAX_FILE = 4096  # bytes: a token file holds one line

ENV_VAR = "MPI_BOOTSTRAP_TOKEN"
FILE_VAR = "MPI_BOOTSTRAP_TOKEN_FILE"
HOW_TO_MOVE = (
    f"put the token in a file instead: {FILE_VAR} naming a key of a Secret "
    "volume (defaultMode 0400, or 0440 with fsGroup for an agent that is not "
    "root; docs/exchanges.md)"
)
EXPOSED = (
    "every process the container starts holds it in its /proc/PID/environ — the "
    "readiness probe every few seconds, whatever `kubectl exec` runs — where any "
    "process of the same user, a rank of the job included, can read it"
)
ENV_EXPOSED = f"{ENV_VAR} is in the container's environment, so {EXPOSED}; {HOW_TO_MOVE}"


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """A token file as read: its bytes, and the mode and owner of the file opened."""

    data: bytes = dataclasses.field(repr=False)  # the secret: never in repr or logs
    mode: int  # permission bits
    uid: int
    gid: int


def check(text: str) -> str:
    """The token, or ValueError saying what is wrong with it (never showing it)."""
    if len(text) < MIN_LENGTH:
        raise ValueError(f"must be at least {MIN_LENGTH} characters (value not shown)")
    # os.environ surrogate-escapes bytes that are not UTF-8 (a binary Secret); the
    # exchange encodes the token, which then raised UnicodeEncodeError (exit 70).
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("is not UTF-8 text (value not shown)") from None
    return text


def from_file(data: bytes) -> str:
    """The token a file holds: its UTF-8 text without one trailing newline (a Secret made
    with `echo` or from a file ends in one); ValueError otherwise."""
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text (value not shown)") from None
    return check(text)


def other_readers(found: TokenFile, euid: int) -> str | None:
    """Who besides the agent's user may read the file without needing to, or None.

    Others' read bit always counts (a Secret volume's default mode is 0644). The group's
    counts where the agent does not need it: as root (root reads a 0400 file) or as the
    file's owner. A non-root agent reads a Secret's file, which Kubernetes makes root's,
    through the pod's fsGroup: 0440 is then the least it can be."""
    mode = found.mode & 0o777
    if mode & 0o004:
        return f"is readable by every user ({mode:04o})"
    if mode & 0o040 and euid in (0, found.uid):
        return f"is readable by group {found.gid} too ({mode:04o})"
    return None


def file_advice() -> str:
    return (
        "make it readable by the agent's user only: defaultMode 0400 on the Secret "
        "volume (an agent running as root), or 0440 with the pod's fsGroup (another "
        "user)"
    )


def decision(file: str | None, source: str, warnings: Sequence[str]) -> Decision | None:
    """--explain's line on the token: where it comes from (`file`, else the environment
    when `source` names the variable; `source` "default": no token), and who else may
    read it (`warnings`)."""
    said = [f"WARNING: {w}" for w in warnings]
    if file:
        return Decision(
            "token",
            f"file {file}",
            source,
            "; ".join(
                [
                    *said,
                    "read once by the launcher and each worker, and in no process's "
                    "environment; the readiness probe and the doctor do not read it",
                ]
            ),
        )
    if source != "default":
        return Decision("token", "environment", source, "; ".join(said))
    return None
