"""The exchanges: how the launcher learns each worker's sshd (address, port, host key)
and how each worker learns the key it lets in (docs/exchanges.md). One descriptor each,
as the MPI runtimes have: what an exchange does is asked of its descriptor, and its name
is looked up here alone (and chosen by `auto` in core/config.py). A fifth exchange is one
more row (tests/test_plan.py, class `TestAFifthExchange`). Pure.
"""

from __future__ import annotations

import dataclasses

from mpi_bootstrap.core.settings.base import SECRET_SSHD_PORT

# Where the job's key comes from (`key`), and how the launcher has each worker's record
# (`records`). Their values are these words; an exchange's name is never compared.
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
    mounted: bool = False  # the worker takes the Secret at its default path unasked
    port: int = 0  # every worker's sshd port (0: a free one, named in its record)
    needs: str = ""  # the setting it cannot do without
    trust: str = ""  # --explain's words for how host keys are trusted (str.format: config)

    @property
    def keyed(self) -> bool:
        return bool(self.key)


EXCHANGES = {
    x.name: x
    for x in (
        Exchange(
            "secret",
            MOUNTED,
            MADE,
            mounted=True,
            port=SECRET_SSHD_PORT,
            trust="the job's key from the Secret is also each worker's host key: pinned, "
            "no exchange",
        ),
        Exchange(
            "dir",
            SHARED,
            READ,
            needs="exchange_dir",
            trust="records and the job key in {c.exchange_dir}",
        ),
        Exchange(
            "net",
            OWN,
            FETCHED,
            needs="token",
            trust="records fetched from each worker on port {c.exchange_port}, "
            "HMAC-authenticated with the job's token",
        ),
        Exchange("none", "", mounted=True),
    )
}
