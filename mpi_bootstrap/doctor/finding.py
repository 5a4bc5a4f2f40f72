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
    # ok, but worth changing (a secret exposed): said, and never a failed check
    warning: bool = False

    def line(self) -> str:
        """One line for a person: what a worker, a nameserver or an sshd's banner said
        is escaped (it cannot erase a line above or forge an `ok`)."""
        mark = "!! " if not self.ok else "?? " if self.warning else "ok "
        text = f"{mark}{self.host}: {self.check}: {self.detail}"
        said = self.advice and (not self.ok or self.warning)
        return printable(text + (f" — {self.advice}" if said else ""), lines=False)
