"""The user's own `mpirun …` (wrap mode): its options, and where the program starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mpi_bootstrap.core.runtimes import Runtime

MCA_OPTIONS = ("mca", "gmca", "prtemca", "pmixmca", "omca")  # each takes NAME VALUE

# Options that name a hostfile in the user's own command (Open MPI and hydra spellings).
HOSTFILE_OPTIONS = ("hostfile", "machinefile", "default-hostfile", "f")


@dataclasses.dataclass(frozen=True)
class UserCommand:
    """The user's own `mpirun …` in wrap mode: its options and where the program starts."""

    argv: tuple[str, ...]
    options: tuple[tuple[str, int, tuple[str, ...]], ...]  # (name, argv index, values)
    program_index: int

    def has(self, *names: str) -> str | None:
        """The user's spelling of the first of `names` given, or None."""
        for name, index, _ in self.options:
            if name in names:
                return self.argv[index].split("=", 1)[0]
        return None

    def mca_names(self) -> set[str]:
        return {values[0] for name, _, values in self.options if name in MCA_OPTIONS and values}

    def mca_value(self, param: str) -> str | None:
        """The value the user's command gives MCA parameter `param`, if it does."""
        return next(
            (
                values[1]
                for name, _, values in self.options
                if name in MCA_OPTIONS and values[:1] == (param,) and len(values) > 1
            ),
            None,
        )

    def values(self, name: str) -> list[str]:
        return [v[0] for n, _, v in self.options if n == name and v]


def scan_user_command(argv: Sequence[str], runtime: Runtime) -> UserCommand:
    """The user's options (their values counted by `runtime.options`: wrap mode must know
    where the program starts, so that a `--mca` among the program's own arguments is not
    mistaken for one)."""
    arity = runtime.options
    options: list[tuple[str, int, tuple[str, ...]]] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or tok == "-":
            break
        name, eq, inline = tok.lstrip("-").partition("=")
        n = arity.get(name, 0)
        if eq:
            values: tuple[str, ...] = (inline, *argv[i + 1 : i + n])
            options.append((name, i, values))
            i += max(1, n)
            continue
        options.append((name, i, tuple(argv[i + 1 : i + 1 + n])))
        i += 1 + n
    return UserCommand(argv=tuple(argv), options=tuple(options), program_index=i)
