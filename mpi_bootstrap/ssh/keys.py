"""SSH keys: generated in-process (ed25519), or copied from a mounted Secret with modes
ssh accepts. Private key material is only ever written to files (0600, in the private
state directory) — never logged, never in a record, never in `--explain`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.names import is_public_key
from mpi_bootstrap.system.files import atomic_write

# MPI Operator mounts the job's key under these names at sshAuthMountPath (and the
# public half as id_rsa.pub, which the agent derives from the private key instead).
MOUNT_PRIVATE = "id_rsa"
MOUNT_AUTHORIZED = "authorized_keys"


@dataclasses.dataclass(frozen=True)
class KeyPair:
    private_path: str
    public: str  # "ssh-ed25519 AAAA… comment" — safe to share


def clean_public_key(line: str, *, where: str) -> str:
    """`type blob` of a public key, comment dropped (it is attacker-controlled text)."""
    key = " ".join(line.split()[:2])
    if not is_public_key(key):
        raise ConfigError([f"{where}: not an OpenSSH public key line"])
    return key


def generate(private_path: str, comment: str) -> KeyPair:
    """A fresh ed25519 key: private key file 0600, public key returned."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    atomic_write(private_path, private, 0o600)
    atomic_write(private_path + ".pub", f"{public} {comment}\n", 0o644)
    return KeyPair(private_path, public)


def make_job_key(path: str) -> str:
    """A new job key at `path` (the dir exchange's `job-key/id`); its public key."""
    return generate(path, "mpi-bootstrap job key").public


def public_of(private_text: str, where: str) -> str:
    """The OpenSSH public key line of a private key (any type paramiko/cryptography read)."""
    from cryptography.hazmat.primitives import serialization as ser

    try:
        data = private_text.encode()
        key: Any = (
            ser.load_ssh_private_key(data, password=None)
            if b"BEGIN OPENSSH PRIVATE KEY" in data
            else ser.load_pem_private_key(data, password=None)
        )
        public: str = (
            key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
        )
        return public
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            [f"{where}: not a usable unencrypted private key ({type(exc).__name__})"]
        ) from None


def from_secret(mount: str, state_dir: str) -> tuple[KeyPair, list[tuple[str, str]]] | None:
    """Copy the mounted Secret's key into the private dir with modes ssh accepts.

    Returns (client key, [(authorized public key, where it came from)]) or None when
    nothing is mounted. The originals (often 0644, which ssh refuses: mpi-operator #429)
    are left untouched.
    """
    private_src = os.path.join(mount, MOUNT_PRIVATE)
    if not os.path.exists(private_src):
        return None
    try:
        with open(private_src, encoding="utf-8") as fh:
            private_text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{private_src}: cannot read the mounted key ({exc})"]) from None
    public = public_of(private_text, private_src)
    private_path = os.path.join(state_dir, "id_job")
    atomic_write(private_path, private_text, 0o600)
    atomic_write(private_path + ".pub", public + "\n", 0o644)
    public = " ".join(public.split()[:2])
    authorized = [(public, private_src)]
    auth_src = os.path.join(mount, MOUNT_AUTHORIZED)
    if os.path.exists(auth_src):
        with open(auth_src, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, start=1):
                if line.strip() and not line.startswith("#"):
                    key = clean_public_key(line, where=f"{auth_src}:{n}")
                    if key not in (k for k, _ in authorized):
                        authorized.append((key, f"{auth_src}:{n}"))
    return KeyPair(private_path, public), authorized
