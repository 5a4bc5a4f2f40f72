"""Fill container/wheelhouse/ for container/Dockerfile's offline install (`make wheelhouse`).

    python container/wheelhouse.py [--check]

The agent's wheel (built here), and its dependencies as wheels for every CPython the agent
supports (3.10-3.13) on x86-64 and aarch64, manylinux2014 (glibc 2.17 and later): one
wheelhouse serves any glibc base image, whatever its Python, with no network at build
time. Then, for each Python and architecture, `pip install --dry-run --no-index` must
resolve `mpi-bootstrap` from the wheelhouse alone; `--check` runs only that. Needs pip
and, to fill it, the network (PyPI).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOUSE = ROOT / "container" / "wheelhouse"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ARCHS = ("x86_64", "aarch64")


def platforms(arch: str) -> list[str]:
    """The manylinux tags a glibc 2.17+ base takes (not 2_28/2_34: a wheel for a newer
    glibc does not install on an older base)."""
    return [x for tag in (f"manylinux2014_{arch}", f"manylinux_2_17_{arch}")
            for x in ("--platform", tag)]


def target(py: str, arch: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", py, "--implementation", "cp",
            *platforms(arch)]


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True,
                          text=True, check=False)


def fill(house: Path) -> None:
    done = pip("wheel", "-q", "--no-deps", "--wheel-dir", str(house), str(ROOT))
    if done.returncode != 0:
        raise SystemExit(f"building the agent's wheel failed:\n{done.stderr}")
    agent = next(house.glob("mpi_bootstrap-*.whl"))
    for py, arch in itertools.product(PYTHONS, ARCHS):
        done = pip("download", "-q", "--dest", str(house), *target(py, arch), str(agent))
        if done.returncode != 0:
            raise SystemExit(f"no wheels for CPython {py} on {arch}:\n{done.stderr}")


def check(house: Path) -> list[str]:
    """What does not resolve from the wheelhouse alone, per Python and architecture."""
    problems = []
    for py, arch in itertools.product(PYTHONS, ARCHS):
        with tempfile.TemporaryDirectory() as t:
            done = pip("install", "--dry-run", "-q", "--no-index", "--find-links", str(house),
                       "--target", t, *target(py, arch), "mpi-bootstrap")
        if done.returncode != 0:
            problems.append(f"CPython {py} {arch}: {done.stderr.strip()[-500:]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only check what is there")
    args = ap.parse_args()
    if not args.check:
        tmp = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=HOUSE.parent))
        try:
            fill(tmp)
            shutil.rmtree(HOUSE, ignore_errors=True)
            tmp.rename(HOUSE)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    problems = check(HOUSE)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{HOUSE}: mpi-bootstrap resolves offline for CPython {', '.join(PYTHONS)} on "
              f"{' and '.join(ARCHS)} ({len(list(HOUSE.glob('*.whl')))} wheels)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
