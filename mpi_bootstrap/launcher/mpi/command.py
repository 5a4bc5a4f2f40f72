"""The user's own `mpirun …` (wrap mode): its options, and where the program starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mpi_bootstrap.launcher.mpi.detect import HYDRA

# Options of each runtime that take arguments (wrap mode must know where the program
# starts, so that a `--mca` inside the user's program arguments is not mistaken for one).
_OMPI_ARITY = {
    **dict.fromkeys(["mca", "gmca", "prtemca", "pmixmca", "omca", "am", "tune"], 2),
    **dict.fromkeys([
        "np", "n", "c", "H", "host", "hostfile", "machinefile", "default-hostfile", "x",
        "bind-to", "map-by", "rank-by", "prefix", "wdir", "wd", "path", "timeout",
        "output-filename", "output", "npernode", "N", "npersocket", "ppr", "cpus-per-proc",
        "cpus-per-rank", "launch-agent", "report-uri", "app", "rankfile", "cpu-set",
        "preload-files", "s", "stdin", "xterm", "personality", "runtime-options", "hnp",
        "set-cwd-to-session-dir", "mapby", "rankby", "bindto", "display", "dvm", "pmixam",
        "forward-signals", "report-pid", "add-hostfile", "add-host", "max-vm-size",
    ], 1),
}
_HYDRA_ARITY = {
    **dict.fromkeys(["genv", "env"], 2),
    **dict.fromkeys([
        "n", "np", "f", "hostfile", "machinefile", "machine", "host", "hosts", "ppn",
        "perhost", "rr", "genvlist", "envlist", "launcher", "launcher-exec", "bootstrap",
        "bootstrap-exec", "iface", "wdir", "configfile", "rmk", "demux", "binding",
        "bind-to", "map-by", "topolib", "profile", "errfile-pattern", "outfile-pattern",
        "prepend-pattern", "gpus-per-proc", "gdb", "ilp64", "tune", "umask", "nameserver",
        "localhost", "usize", "hosts-group", "ranks-per-proc", "membind", "gtool", "tmpdir",
        "hostlist", "machines", "machinelist",
    ], 1),
}


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
        return {values[0] for name, _, values in self.options
                if name in MCA_OPTIONS and values}

    def mca_value(self, param: str) -> str | None:
        """The value the user's command gives MCA parameter `param`, if it does."""
        return next((values[1] for name, _, values in self.options
                     if name in MCA_OPTIONS and values[:1] == (param,) and len(values) > 1),
                    None)

    def values(self, name: str) -> list[str]:
        return [v[0] for n, _, v in self.options if n == name and v]


def scan_user_command(argv: Sequence[str], runtime: str) -> UserCommand:
    arity = _HYDRA_ARITY if runtime == HYDRA else _OMPI_ARITY
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
            values: tuple[str, ...] = (inline, *argv[i + 1:i + n])
            options.append((name, i, values))
            i += max(1, n)
            continue
        options.append((name, i, tuple(argv[i + 1:i + 1 + n])))
        i += 1 + n
    return UserCommand(argv=tuple(argv), options=tuple(options), program_index=i)
