"""Which MPI this is, from the real `mpirun --version`, and what runtime launches it.

Pure: the launcher runs `mpirun --version` and resolves mpirun's install prefix, then
passes the text and the prefix in.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

from mpi_bootstrap.core.errors import ConfigError

OPENMPI, MPICH, INTEL = "openmpi", "mpich", "intel"
ORTE, PRRTE, HYDRA = "orte", "prrte", "hydra"

# argv[0] basenames that make the user's command a launcher we wrap (wrap mode).
LAUNCHER_NAMES = frozenset({
    "mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prterun", "mpirun.openmpi",
    "mpiexec.openmpi", "mpirun.mpich", "mpiexec.mpich",
})

_OMPI_RE = re.compile(r"\((?:Open MPI|OpenRTE)\)\s+(\d+\.\d+(?:\.\d+)?\S*)")
_HYDRA_RE = re.compile(r"HYDRA build details:.*?Version:\s+(\S+)", re.S)
_INTEL_RE = re.compile(r"Intel\(R\) MPI Library.*?Version\s+(\S+)")
_DEVICE_RE = re.compile(r"--with-device=ch\d:([\w,]+)")


@dataclasses.dataclass(frozen=True)
class MPIInfo:
    vendor: str  # openmpi | mpich | intel
    version: str  # "4.1.4", "2021.18.1", or "unknown"
    runtime: str  # orte | prrte | hydra
    mpirun: str  # the path that was asked
    version_line: str  # the first line that identified it
    source: str  # "detected" or "env MPI_BOOTSTRAP_MPI"
    prefix: str  # install prefix: mpirun's real path, two levels up (`/usr`, `/opt/ompi`)
    devices: tuple[str, ...] = ()  # MPICH: the ch4 netmods it was built with ("ucx", "ofi")


def parse_version(text: str) -> tuple[str, str] | None:
    """(vendor, version) from `mpirun --version` output, or None if unknown."""
    if m := _INTEL_RE.search(text):
        return INTEL, m.group(1).rstrip(",")
    if m := _OMPI_RE.search(text):
        return OPENMPI, m.group(1)
    if m := _HYDRA_RE.search(text):
        return MPICH, m.group(1)
    return None


def _runtime(vendor: str, version: str) -> str:
    if vendor == OPENMPI:
        major = version.split(".", 1)[0]
        return PRRTE if major.isdigit() and int(major) >= 5 else ORTE
    return HYDRA


def identify(text: str, mpirun: str, choice: str, choice_source: str, *, prefix: str
             ) -> MPIInfo:
    """Decide the MPI from the version output and the MPI_BOOTSTRAP_MPI setting."""
    found = parse_version(text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if choice == "auto":
        if found is None:
            raise ConfigError([
                f"cannot tell which MPI {mpirun} is from `mpirun --version` "
                f"(said {first[:120]!r}); set MPI_BOOTSTRAP_MPI to openmpi4, openmpi5, "
                "mpich or intel"])
        vendor, version = found
        return MPIInfo(vendor, version, _runtime(vendor, version), mpirun, first, "detected",
                       prefix, _devices(text))
    vendor = OPENMPI if choice.startswith(OPENMPI) else choice
    version = found[1] if found and found[0] == vendor else "unknown"
    if choice == "openmpi4":
        runtime = ORTE
    elif choice == "openmpi5":
        runtime = PRRTE
    elif vendor == OPENMPI:
        if version == "unknown":
            raise ConfigError([
                f"{choice_source}: 'openmpi' but {mpirun} --version does not say which "
                "major version; use openmpi4 or openmpi5"])
        runtime = _runtime(vendor, version)
    else:
        runtime = HYDRA
    return MPIInfo(vendor, version, runtime, mpirun, first, choice_source, prefix,
                   _devices(text))


def _devices(text: str) -> tuple[str, ...]:
    """MPICH's netmods, from `Configure options: --with-device=ch4:ucx,ofi`."""
    m = _DEVICE_RE.search(text)
    return tuple(m.group(1).split(",")) if m else ()


def is_launcher(program: Sequence[str]) -> bool:
    return bool(program) and os.path.basename(program[0]) in LAUNCHER_NAMES
