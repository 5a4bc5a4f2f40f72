"""The MPI test program (allreduce.c beside this file), built for each real MPI."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REAL_MPIS, RealMPI

SOURCE = Path(__file__).resolve().parent / "allreduce.c"
DISTGRAPH = Path(__file__).resolve().parent / "distgraph.c"
TICKER = Path(__file__).resolve().parent / "ticker.c"  # ranks that run for a while
# What each rank prints: rank, size, host, sum, expected, verdict (and its start time).
LINE = re.compile(r"rank (\d+)/(\d+) on (\S+): allreduce sum (\d+) \(expected (\d+)\) (OK|WRONG)")


def compile_allreduce(m: RealMPI, out: Path) -> Path:
    """The allreduce program for `m`."""
    return compile_program(m, out, SOURCE)


def compile_program(m: RealMPI, out: Path, source: Path) -> Path:
    """An MPI program (tests/support/*.c) built for `m`. impi-rt ships no compiler: Intel
    MPI keeps the MPICH ABI (libmpi.so.12), so MPICH's header and Intel's library make
    the binary."""
    exe = out / f"{source.stem}-{m.kind}"
    if m.kind == "intel":
        mpich = REAL_MPIS["mpich"].bindir.rsplit("/", 1)[0]
        lib = m.bindir.rsplit("/", 1)[0] + "/lib"
        argv = [
            "gcc",
            "-O1",
            "-o",
            str(exe),
            str(source),
            f"-I{mpich}/include",
            f"-L{lib}",
            "-lmpi",
            f"-Wl,-rpath,{lib}",
        ]
    else:
        argv = [f"{m.bindir}/mpicc", "-O1", "-o", str(exe), str(source)]
    subprocess.run(argv, check=True, capture_output=True)
    return exe
