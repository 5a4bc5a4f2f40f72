"""The key exchange of the launcher's ssh to its workers: which KexAlgorithms the
generated ssh config offers. Pure; the facts (`ssh -Q kex` on the launcher, each worker's
sshd version from its record) come in. The choice, and why: docs/configuration.md
(`--ssh-kex`) and SECURITY.md 25; where a worker's sshd takes none: ssh's own (`SSH_OWN`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mpi_bootstrap.core.model import Decision

PREFERRED = ("mlkem768x25519-sha256", "curve25519-sha256")
DEFAULT = "default"  # MPI_BOOTSTRAP_SSH_KEX=default: ssh's own choice
# Since which OpenSSH each of PREFERRED is in sshd (OpenSSH's release notes).
SINCE = {"mlkem768x25519-sha256": (9, 9), "curve25519-sha256": (7, 4)}
VERSION = re.compile(r"(\d{1,2})\.(\d{1,2})")


def version_of(text: str | None) -> tuple[int, int] | None:
    """`9.2` → (9, 2); None for anything else."""
    m = VERSION.fullmatch(text or "")
    return (int(m[1]), int(m[2])) if m else None


def takes(name: str, sshd: tuple[int, int] | None) -> bool:
    """Does an sshd of OpenSSH `sshd` take key exchange `name`? (Unknown: assume so; the
    negotiation then picks the next one the client offers.)"""
    return sshd is None or name not in SINCE or sshd >= SINCE[name]


def offer(own: Sequence[str], sshd: tuple[int, int] | None = None) -> tuple[str, ...]:
    """The agent's choice for one worker: PREFERRED, less what the launcher's ssh (`own`:
    `ssh -Q kex`) or the worker's sshd (`sshd`: its OpenSSH version) does not take."""
    return tuple(n for n in PREFERRED if n in own and takes(n, sshd))


# One worker's own list where its sshd takes none of the agent's (before OpenSSH 7.4): ssh
# has no word for its default list, but `+NAME` appends to it, and a NAME it holds already
# leaves it as it is (OpenSSH 7.6 and later): that worker negotiates as plain ssh would.
SSH_OWN = "+curve25519-sha256"


def for_worker(own: Sequence[str], sshd: tuple[int, int] | None) -> str:
    """The KexAlgorithms of one worker's own block: the agent's choice less what its sshd
    lacks, or ssh's own list where nothing is left."""
    return ",".join(offer(own, sshd)) or SSH_OWN


def decision(
    setting: str | None,
    source: str,
    own: Sequence[str],
    workers: Sequence[tuple[str, tuple[int, int] | None]],
) -> tuple[str | None, Decision]:
    """(the `Host *` KexAlgorithms, or None: ssh's own) and --explain's line on it.
    `workers`: each worker's name and its sshd's version, where its record says."""
    if setting == DEFAULT:
        return None, Decision(
            "ssh key exchange",
            "ssh's default",
            source,
            "MPI_BOOTSTRAP_SSH_KEX=default: OpenSSH picks (9.0 to 9.8: "
            "post-quantum sntrup761x25519-sha512, six times the CPU of "
            "curve25519 per handshake)",
        )
    if setting:
        return setting, Decision(
            "ssh key exchange", setting, source, "KexAlgorithms in the ssh config, as set"
        )
    chosen = offer(own)
    if not chosen:
        return None, Decision(
            "ssh key exchange",
            "ssh's default",
            "agent default",
            f"this ssh offers none of {', '.join(PREFERRED)}: ssh's own",
        )
    older = [name for name, v in workers if offer(own, v) != chosen]
    why = (
        "post-quantum and cheap where both ends offer mlkem768x25519-sha256 (OpenSSH "
        "9.9+), curve25519-sha256 otherwise; not sntrup761x25519 (six times the CPU per "
        "handshake): what rides these sessions also rides MPI's unencrypted control "
        "channel, and the host keys stay pinned (SECURITY.md, 25)"
    )
    if older:
        why += f"; {', '.join(older[:3])}{' …' if len(older) > 3 else ''}: its sshd is older"
    return ",".join(chosen), Decision("ssh key exchange", ",".join(chosen), "agent default", why)
