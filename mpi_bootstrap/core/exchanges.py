"""The exchanges: how the launcher learns each worker's sshd (address, port, host key)
and how each worker learns the key it lets in (docs/exchanges.md). One row each, as the
MPI runtimes have: what an exchange does is asked of the object its row names (`side`:
a module whose `SIDE` it is, ssh/sides.py), and its name is looked up here alone (and
chosen by `auto` in core/config.py). A new exchange is one module and one row
(tests/test_exchange_sides.py). Pure.
"""

from __future__ import annotations

import dataclasses

# The port MPI Operator's base images run sshd on: the secret exchange's fixed port (no
# exchange tells the launcher another). Here, not in settings/, which import this module.
SECRET_SSHD_PORT = 2222

# Where the job's key comes from (`key`), and how the launcher has each worker's record
# (`records`): words for --explain and the docs. Nobody compares them but the properties
# below.
MOUNTED, SHARED, OWN = "the Secret's", "the shared directory's", "the launcher's own"
MADE, READ, FETCHED = "made", "read", "fetched"


@dataclasses.dataclass(frozen=True)
class Exchange:
    name: str
    # The job's key: MOUNTED (the Secret, also every sshd's host key, pinned with no
    # exchange), SHARED (made once in the exchange directory; the launcher writes
    # `job-done` there after a success), OWN (the launcher makes one and hands it over),
    # "" (none: ssh as the image configures it — no claim, no connection reuse, no check
    # that the library path arrives).
    key: str
    records: str = ""  # MADE from the Secret, READ from the directory, FETCHED from each
    side: str = ""  # the module whose SIDE does what this exchange does ("": none's)
    mounted: bool = False  # the worker takes the Secret at its default path unasked
    port: int = 0  # every worker's sshd port (0: a free one, named in its record)
    # Settings of which one must be set (for `needed_by`'s roles; none: every role's),
    # and what to say.
    needs: tuple[str, ...] = ()
    needs_what: str = ""
    needed_by: tuple[str, ...] = ()
    trust: str = ""  # --explain's words for how host keys are trusted (str.format: config)

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    @property
    def made(self) -> bool:
        """Records are made, not published: they carry no data NIC (launcher/dataplan.py)."""
        return self.records == MADE

    @property
    def shared(self) -> bool:
        """One key in a place every pod shares: the launcher marks the job done there."""
        return self.key == SHARED

    @property
    def needs_token(self) -> bool:
        return "token" in self.needs


EXCHANGES = {
    x.name: x
    for x in (
        Exchange(
            "secret",
            MOUNTED,
            MADE,
            side="mpi_bootstrap.ssh.secretside",
            mounted=True,
            port=SECRET_SSHD_PORT,
            trust="the job's key from the Secret is also each worker's host key: pinned, "
            "no exchange",
        ),
        Exchange(
            "dir",
            SHARED,
            READ,
            side="mpi_bootstrap.ssh.dirside",
            needs=("exchange_dir",),
            needs_what="MPI_BOOTSTRAP_EXCHANGE_DIR",
            trust="records and the job key in {c.exchange_dir}",
        ),
        Exchange(
            "net",
            OWN,
            FETCHED,
            side="mpi_bootstrap.ssh.netside",
            needs=("token", "token_file"),
            needs_what="MPI_BOOTSTRAP_TOKEN_FILE (a key of a Kubernetes Secret volume)",
            needed_by=("launcher", "worker"),
            trust="records fetched from each worker on port {c.exchange_port}, "
            "HMAC-authenticated with the job's token",
        ),
        Exchange("none", "", mounted=True),
    )
}
