"""The `secret` exchange (docs/exchanges.md): MPI Operator's ssh Secret, mounted in every
pod, is the launcher's key and every worker's host key, so there is nothing to read or
publish: a worker's record is made from its address and the agreed port."""

from __future__ import annotations

import os
from collections.abc import Sequence

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.model import ClientKey, PlannedFile
from mpi_bootstrap.core.records import Record
from mpi_bootstrap.core.settings import SECRET_SSHD_PORT
from mpi_bootstrap.ssh import keys
from mpi_bootstrap.ssh.sides import Ask, Host, Identity, Mounted, Put, Reader, Side
from mpi_bootstrap.system import account


def record(config: Config, key: ClientKey, new: str, address: str | None) -> Record:
    """A worker's record: nothing to fetch (the job's key is its host key, its sshd on
    the agreed port)."""
    user = config.ssh_user or account.user()
    port = config.sshd_port or SECRET_SSHD_PORT  # Config sets it: never 0 here
    return Record(new, (address,) if address else (), port, key.public, user)


class _Made(Reader):
    def __init__(self, config: Config, key: ClientKey) -> None:
        self.config, self.key = config, key

    def answered(self, host: Host) -> Record | None:
        return record(self.config, self.key, host[1], host[2])


class SecretSide(Side):
    def client_key(self, config: Config, *, write: bool, log: Log) -> ClientKey | None:
        del write, log
        src = os.path.join(config.ssh_auth_dir, keys.MOUNT_PRIVATE)
        try:
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError([f"{src}: cannot read the job's key ({exc.strerror})"]) from None
        path = os.path.join(config.state_dir, "id_job")
        why = "the job's key, copied from the Secret with the mode ssh accepts (mpi-operator #429)"
        return ClientKey(path, keys.public_of(text, src), PlannedFile(path, text, 0o600, why))

    def collect(self, ask: Ask, hosts: Sequence[Host], *, fetch: bool) -> dict[str, Record]:
        assert ask.key is not None  # noqa: S101 - client_key() returns one
        return {new: record(ask.config, ask.key, new, addr) for _, new, addr in hosts}

    def reader(self, ask: Ask, put: Put) -> Reader:
        assert ask.key is not None  # noqa: S101 - client_key() returns one
        return _Made(ask.config, ask.key)

    def where(self, config: Config) -> str:
        return f"in the Secret at {config.ssh_auth_dir}"

    def identity(self, config: Config, mounted: Mounted | None, log: Log) -> Identity:
        if mounted is None:
            raise ConfigError(
                [
                    f"MPI_BOOTSTRAP_EXCHANGE: {config.exchange!r} but no key is mounted at "
                    f"{config.ssh_auth_dir} (set MPI_BOOTSTRAP_SSH_AUTH_DIR to "
                    "the MPIJob's sshAuthMountPath)"
                ]
            )
        pair, from_mount = mounted
        # The job's key is every sshd's host key, so clients can pin it with no exchange.
        return Identity(pair.private_path, pair.public, tuple(from_mount), None)


SIDE = SecretSide()
