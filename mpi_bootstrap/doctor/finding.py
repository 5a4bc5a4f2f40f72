"""One thing the doctor found: a host, a check, ok or not, and what to do."""

from __future__ import annotations

import dataclasses

from mpi_bootstrap.core.errors import printable


@dataclasses.dataclass(frozen=True)
class Finding:
    host: str
    check: str
    ok: bool
    detail: str
    advice: str = ""

    def line(self) -> str:
        """One line for a person: what a worker, a nameserver or an sshd's banner said
        is escaped (it cannot erase a line above or forge an `ok`)."""
        mark = "ok " if self.ok else "!! "
        text = f"{mark}{self.host}: {self.check}: {self.detail}"
        return printable(text + (f" — {self.advice}" if self.advice and not self.ok else ""),
                         lines=False)
