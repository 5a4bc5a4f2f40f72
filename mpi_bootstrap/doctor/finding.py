"""One thing the doctor found: a host, a check, ok or not, and what to do."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Finding:
    host: str
    check: str
    ok: bool
    detail: str
    advice: str = ""

    def line(self) -> str:
        mark = "ok " if self.ok else "!! "
        text = f"{mark}{self.host}: {self.check}: {self.detail}"
        return text + (f" — {self.advice}" if self.advice and not self.ok else "")
