"""Which MPI this is, from the real `mpirun --version`: one of the runtime descriptors
(core/runtimes/), or a ConfigError (64) naming what mpirun said. Nothing after this
module tells runtimes apart by name: it asks the descriptor.

Pure: the launcher runs `mpirun --version` and resolves mpirun's install prefix, then
passes the text and the prefix in.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.runtimes import RUNTIMES, Runtime

# argv[0] basenames that make the user's command a launcher we wrap (wrap mode).
LAUNCHER_NAMES = frozenset(
    {
        "mpirun",
        "mpiexec",
        "mpiexec.hydra",
        "orterun",
        "prterun",
        "mpirun.openmpi",
        "mpiexec.openmpi",
        "mpirun.mpich",
        "mpiexec.mpich",
    }
)

_DEVICE_RE = re.compile(r"--with-device=ch\d:([\w,]+)")


@dataclasses.dataclass(frozen=True)
class MPIInfo:
    runtime: Runtime
    version: str  # "4.1.4", "2021.18.1", or "unknown"
    mpirun: str  # the path that was asked
    version_line: str  # the first line that identified it
    source: str  # "detected" or "env MPI_BOOTSTRAP_MPI"
    prefix: str  # install prefix: mpirun's real path, two levels up (`/usr`, `/opt/ompi`)
    devices: tuple[str, ...] = ()  # MPICH: the ch4 netmods it was built with ("ucx", "ofi")

    @property
    def vendor(self) -> str:  # openmpi | mpich | intel
        return self.runtime.vendor


def _detect(text: str, runtimes: Sequence[Runtime]) -> tuple[Runtime, str] | None:
    """The runtime whose pattern finds a version it launches in the output, and the
    version."""
    for rt in sorted(runtimes, key=lambda r: not r.detected_first):
        if (m := rt.version.search(text)) and rt.versions(m.group(1)):
            return rt, m.group(1)
    return None


def _own(runtimes: Sequence[Runtime]) -> list[str]:
    """Each runtime's choice that chooses it alone (`openmpi4`, not `openmpi`)."""
    every = [c for r in runtimes for c in r.choices]
    own = (next((c for c in r.choices if every.count(c) == 1), None) for r in runtimes)
    return [c for c in own if c is not None]


def _either(words: Sequence[str]) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


def identify(
    text: str,
    mpirun: str,
    choice: str,
    choice_source: str,
    *,
    prefix: str,
    runtimes: Sequence[Runtime] = RUNTIMES,
) -> MPIInfo:
    """Decide the MPI from the version output and the MPI_BOOTSTRAP_MPI setting."""
    found = _detect(text, runtimes)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if choice == "auto":
        if found is None:
            raise ConfigError(
                [
                    f"cannot tell which MPI {mpirun} is from `mpirun --version` "
                    f"(said {first[:120]!r}); set MPI_BOOTSTRAP_MPI to "
                    f"{_either(_own(runtimes))}"
                ]
            )
        return MPIInfo(found[0], found[1], mpirun, first, "detected", prefix, _devices(text))
    chosen = [r for r in runtimes if choice in r.choices]
    if not chosen:
        raise ConfigError([f"{choice_source}: no MPI runtime is chosen by {choice!r}"])
    vendor = chosen[0].vendor
    version = found[1] if found and found[0].vendor == vendor else "unknown"
    if len(chosen) > 1 and version == "unknown":
        raise ConfigError(
            [
                f"{choice_source}: {choice!r} but {mpirun} --version does not say which "
                f"major version; use {_either(_own(chosen))}"
            ]
        )
    runtime = (
        chosen[0] if len(chosen) == 1 else next((r for r in chosen if r.versions(version)), None)
    )
    if runtime is None:
        raise ConfigError([f"{choice_source}: {choice!r} launches no version {version}"])
    return MPIInfo(runtime, version, mpirun, first, choice_source, prefix, _devices(text))


def overridden(text: str, info: MPIInfo) -> tuple[str, str] | None:
    """What `mpirun --version` named, where MPI_BOOTSTRAP_MPI chose another vendor's MPI."""
    found = _detect(text, RUNTIMES)
    return (found[0].vendor, found[1]) if found and found[0].vendor != info.vendor else None


def _devices(text: str) -> tuple[str, ...]:
    """MPICH's netmods, from `Configure options: --with-device=ch4:ucx,ofi`."""
    m = _DEVICE_RE.search(text)
    return tuple(m.group(1).split(",")) if m else ()


def is_launcher(program: Sequence[str]) -> bool:
    return bool(program) and os.path.basename(program[0]) in LAUNCHER_NAMES
