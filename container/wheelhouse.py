"""Fill container/wheelhouse/ and write its lock for container/Dockerfile's offline install
(`make wheelhouse`), or check both.

    python container/wheelhouse.py [--check] [--house DIR] [--lock FILE]

The agent's wheel (built here), and its dependencies as wheels for every CPython the agent
supports (3.10-3.13) on x86-64 and aarch64, manylinux2014 (glibc 2.17 and later): one
wheelhouse serves any glibc base image, whatever its Python, with no network at build
time. The lock (container/wheelhouse.lock, beside the wheelhouse, not in it) pins every
package to one version per Python and lists the sha256 of each of its wheels; the
Dockerfile installs with `--require-hashes --only-binary=:all: -r` the lock, so a wheel
that someone planted or changed in the wheelhouse afterwards is never installed, and no
sdist is ever built (its build backend would run as root in the image build).

`--check` recomputes every file's sha256 against the lock and refuses anything that is
not a wheel the lock lists (an sdist, another version, a `.pth`, a changed wheel), naming
the file; then, for each Python and architecture, that every dependency the lock's
packages declare for it (their markers evaluated for that Python, not this one) is
pinned, and that pip resolves the lock from the wheelhouse alone with the Dockerfile's
flags. Needs pip and `packaging`; to fill, the network (PyPI).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
HOUSE = ROOT / "container" / "wheelhouse"
LOCK = ROOT / "container" / "wheelhouse.lock"
AGENT = "mpi-bootstrap"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ARCHS = ("x86_64", "aarch64")
TARGETS = tuple(itertools.product(PYTHONS, ARCHS))


def platforms(arch: str) -> list[str]:
    """The manylinux tags a glibc 2.17+ base takes (not 2_28/2_34: a wheel for a newer
    glibc does not install on an older base)."""
    return [x for tag in (f"manylinux2014_{arch}", f"manylinux_2_17_{arch}")
            for x in ("--platform", tag)]


def target(py: str, arch: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", py, "--implementation", "cp",
            *platforms(arch)]


@functools.cache
def supported(py: str, arch: str) -> frozenset[Tag]:
    """The wheel tags pip takes for `target(py, arch)` (it adds the older manylinux)."""
    version = tuple(int(x) for x in py.split("."))
    plats = [f"manylinux_2_{m}_{arch}" for m in range(17, 4, -1)]
    plats += [f"manylinux{y}_{arch}" for y in ("2014", "2010", "1")]
    return frozenset({*cpython_tags(version, platforms=plats),
                      *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms=plats)})


def environment(py: str, arch: str) -> dict[str, str]:
    """Marker values of CPython `py` on Linux `arch` — not of the Python running this: pip
    evaluates markers for its own interpreter even with --python-version, and so missed
    typing-extensions, which structlog and cryptography need on 3.10 only."""
    return {"implementation_name": "cpython", "implementation_version": f"{py}.0",
            "os_name": "posix", "platform_machine": arch, "platform_release": "",
            "platform_system": "Linux", "platform_version": "",
            "python_full_version": f"{py}.0", "platform_python_implementation": "CPython",
            "python_version": py, "sys_platform": "linux", "extra": ""}


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True,
                          text=True, check=False)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- wheels


@dataclasses.dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: Version
    tags: frozenset[Tag]

    @classmethod
    def of(cls, path: Path) -> Wheel:
        name, version, _, tags = parse_wheel_filename(path.name)
        return cls(path, str(name), version, frozenset(tags))

    @functools.cache  # noqa: B019 - a few dozen wheels, each read once
    def metadata(self) -> tuple[SpecifierSet, list[Requirement]]:
        """(Requires-Python, Requires-Dist) from the wheel's METADATA."""
        with zipfile.ZipFile(self.path) as zf:
            meta = next(n for n in zf.namelist()
                        if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            headers = HeaderParser().parsestr(zf.read(meta).decode("utf-8", "replace"))
        return (SpecifierSet(headers.get("Requires-Python") or ""),
                [Requirement(r) for r in headers.get_all("Requires-Dist") or []])

    def fits(self, py: str, arch: str) -> bool:
        return bool(self.tags & supported(py, arch)) and \
            self.metadata()[0].contains(f"{py}.0", prereleases=True)

    def needs(self, py: str, arch: str) -> list[Requirement]:
        env = environment(py, arch)
        return [r for r in self.metadata()[1] if r.marker is None or r.marker.evaluate(env)]


def wheels(house: Path) -> list[Wheel]:
    return [Wheel.of(p) for p in sorted(house.glob("*.whl"))]


class Missing(Exception):
    """No wheel in the wheelhouse fits this requirement for this Python."""

    def __init__(self, name: str, spec: SpecifierSet) -> None:
        super().__init__(f"{name}{spec}")
        self.name, self.spec = name, spec


def resolve(found: list[Wheel], py: str, arch: str) -> dict[str, Wheel]:
    """For CPython `py` on `arch`: the agent and everything it needs there, each the newest
    version in the wheelhouse that fits every requirement on it (no backtracking: the
    agent's few dependencies have never needed it; a conflict is reported)."""
    specs: dict[str, SpecifierSet] = {AGENT: SpecifierSet()}
    for _ in range(50):
        chosen = {}
        for name, spec in specs.items():
            fit = [w for w in found if w.name == name and w.version in spec
                   and w.fits(py, arch)]
            if not fit:
                raise Missing(name, spec)
            chosen[name] = max(fit, key=lambda w: w.version)
        wanted: dict[str, SpecifierSet] = {AGENT: SpecifierSet()}
        for w in chosen.values():
            for req in w.needs(py, arch):
                name = canonicalize_name(req.name)
                wanted[name] = wanted.get(name, SpecifierSet()) & req.specifier
        if wanted == specs:
            return chosen
        specs = wanted
    raise SystemExit(f"CPython {py} {arch}: the requirements do not settle: {specs}")


# ---------------------------------------------------------------- the lock


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str
    version: Version
    marker: Marker | None
    hashes: frozenset[str]

    def line(self) -> str:
        marker = f" ; {self.marker}" if self.marker else ""
        return " \\\n".join([f"{self.name}=={self.version}{marker}",
                             *(f"    --hash=sha256:{h}" for h in sorted(self.hashes))])

    def applies(self, py: str, arch: str) -> bool:
        return self.marker is None or self.marker.evaluate(environment(py, arch))


def marker(targets: set[tuple[str, str]]) -> Marker | None:
    """Where a pin applies, when not everywhere: by Python, and by machine where only some
    architectures of a Python take it."""
    if targets == set(TARGETS):
        return None
    terms = []
    for py in PYTHONS:
        archs = [a for a in ARCHS if (py, a) in targets]
        if len(archs) == len(ARCHS):
            terms.append(f'python_version == "{py}"')
        terms += [f'(python_version == "{py}" and platform_machine == "{a}")'
                  for a in archs if len(archs) < len(ARCHS)]
    return Marker(" or ".join(terms))


def pins(found: list[Wheel], chosen: Mapping[tuple[str, str], Mapping[str, Wheel]]
         ) -> list[Pin]:
    """One pin per package and version any Python chose, with the hashes of all its wheels
    in the wheelhouse (pip picks the one whose tags fit best)."""
    where: dict[tuple[str, Version], set[tuple[str, str]]] = {}
    for t, picked in chosen.items():
        for w in picked.values():
            where.setdefault((w.name, w.version), set()).add(t)
    return [Pin(name, version, marker(targets),
                frozenset(sha256(w.path) for w in found
                          if (w.name, w.version) == (name, version)))
            for (name, version), targets in sorted(where.items(), key=lambda kv: kv[0])]


HEADER = """\
# The wheels of container/wheelhouse/, one version per package and Python, each with the
# sha256 of its files. Written by `make wheelhouse` (container/wheelhouse.py) and checked
# by its --check; container/Dockerfile installs with --require-hashes from it. Whoever
# can change this file decides what the image runs: keep it where only you write.
"""


def read_lock(path: Path) -> list[Pin]:
    """The lock as written by `write_lock` (anything else is an error naming the line)."""
    text = path.read_text().replace("\\\n", " ")
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req, *hashes = line.split(" --hash=sha256:")
        try:
            parsed = Requirement(req)
            (spec,) = parsed.specifier
        except Exception:
            spec = None
        if spec is None or spec.operator != "==" or not hashes:
            raise SystemExit(f"{path}:{n}: not a pinned, hashed requirement: {raw}")
        out.append(Pin(canonicalize_name(parsed.name), Version(spec.version), parsed.marker,
                       frozenset(h.strip() for h in hashes)))
    return out


def write_lock(path: Path, lock: Iterable[Pin]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(HEADER + "".join(p.line() + "\n" for p in lock))
    tmp.rename(path)


# ---------------------------------------------------------------- fill


def fill(house: Path) -> list[Pin]:
    """The wheels for every Python and architecture, and their lock."""
    # Built from a copy: setuptools builds in the tree's own build/, where two builds at
    # once (two workers of the suite) or one cut short leave each other a broken tree.
    with tempfile.TemporaryDirectory(prefix="mpib-wheel-") as d:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "mpi_bootstrap", Path(d) / "mpi_bootstrap", ignore=skip)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, d)
        done = pip("wheel", "-q", "--no-deps", "--wheel-dir", str(house), d)
    if done.returncode != 0:
        raise SystemExit(f"building the agent's wheel failed:\n{done.stderr}")
    agent = next(house.glob("mpi_bootstrap-*.whl"))
    for py, arch in TARGETS:
        download(house, py, arch, str(agent))
    chosen = {}
    for py, arch in TARGETS:
        for _ in range(20):
            try:
                chosen[py, arch] = resolve(wheels(house), py, arch)
                break
            except Missing as gap:  # one pip missed: a marker true there, not here
                download(house, py, arch, "--no-deps", f"{gap.name}{gap.spec}")
        else:
            raise SystemExit(f"CPython {py} {arch}: the wheelhouse does not settle")
    lock = pins(wheels(house), chosen)
    for w in wheels(house):  # what no Python takes is not kept (nor trusted)
        if not any((w.name, w.version) == (p.name, p.version) for p in lock):
            w.path.unlink()
    return lock


def download(house: Path, py: str, arch: str, *what: str) -> None:
    done = pip("download", "-q", "--dest", str(house), *target(py, arch), *what)
    if done.returncode != 0:
        raise SystemExit(f"no wheels for CPython {py} on {arch}:\n{done.stderr}")


# ---------------------------------------------------------------- check


def check_files(house: Path, lock: list[Pin]) -> list[str]:
    """Every file in the wheelhouse is a wheel the lock lists, with the lock's hash; every
    hash the lock lists has its wheel."""
    problems, seen = [], set()
    by_release = {(p.name, p.version): p for p in lock}
    for entry in sorted(os.scandir(house), key=lambda e: e.name):
        path = Path(entry.path)
        if not entry.is_file(follow_symlinks=False):
            problems.append(f"{path}: not a plain file: refused")
            continue
        try:
            wheel = Wheel.of(path)
        except InvalidWheelFilename:
            problems.append(f"{path}: not a wheel (an sdist, a .pth, anything but a wheel "
                            "the lock lists is refused: the image installs wheels only)")
            continue
        pin = by_release.get((wheel.name, wheel.version))
        digest = sha256(path)
        if pin is None:
            problems.append(f"{path}: {wheel.name} {wheel.version} is not in the lock")
        elif digest not in pin.hashes:
            problems.append(f"{path}: its sha256 {digest} is none the lock lists for "
                            f"{pin.name}=={pin.version} (changed since `make wheelhouse`?)")
        seen.add(digest)
    problems += [f"the lock's {p.name}=={p.version} lists sha256:{h}, which no wheel in "
                 f"{house} has" for p in lock for h in sorted(p.hashes - seen)]
    return problems


def check_target(house: Path, lock: list[Pin], py: str, arch: str) -> list[str]:
    """For CPython `py` on `arch`: every dependency of what the lock installs there is
    pinned there, and pip installs it from the wheelhouse alone, hashes checked."""
    where = f"CPython {py} {arch}"
    taken = {p.name: p for p in lock if p.applies(py, arch)}
    if AGENT not in taken:
        return [f"{where}: the lock does not install {AGENT}"]
    problems = []
    found = wheels(house)
    for pin in taken.values():
        fit = [w for w in found if (w.name, w.version) == (pin.name, pin.version)
               and w.fits(py, arch)]
        if not fit:
            problems.append(f"{where}: no wheel of {pin.name}=={pin.version} fits")
            continue
        for req in fit[0].needs(py, arch):
            have = taken.get(canonicalize_name(req.name))
            if have is None or have.version not in req.specifier:
                problems.append(f"{where}: {pin.name} needs {req}, which the lock does "
                                "not pin there")
    if problems:
        return problems
    with tempfile.TemporaryDirectory() as t:
        reqs = Path(t) / "requirements.txt"
        reqs.write_text("".join(dataclasses.replace(p, marker=None).line() + "\n"
                                for p in taken.values()))
        done = pip("install", "--dry-run", "-q", "--no-index", "--find-links", str(house),
                   "--target", str(Path(t) / "target"), *target(py, arch),
                   "--require-hashes", "--no-deps", "-r", str(reqs))
    return [f"{where}: {done.stderr.strip()[-500:]}"] if done.returncode != 0 else []


def check(house: Path, lock_path: Path) -> list[str]:
    if not lock_path.is_file():
        return [f"{lock_path}: no lock (`make wheelhouse` writes it)"]
    lock = read_lock(lock_path)
    problems = check_files(house, lock)
    if problems:  # a refused file is the finding: pip's view of it would only repeat it
        return problems
    return [p for py, arch in TARGETS for p in check_target(house, lock, py, arch)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only check what is there")
    ap.add_argument("--house", type=Path, default=HOUSE, help="the wheelhouse")
    ap.add_argument("--lock", type=Path, default=LOCK, help="its lock")
    args = ap.parse_args()
    house, lock = args.house.resolve(), args.lock.resolve()
    if not args.check:
        tmp = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=house.parent))
        try:
            pinned = fill(tmp)
            shutil.rmtree(house, ignore_errors=True)
            tmp.rename(house)
            write_lock(lock, pinned)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    problems = check(house, lock)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{house}: mpi-bootstrap resolves offline for CPython {', '.join(PYTHONS)} on "
              f"{' and '.join(ARCHS)} ({len(list(house.glob('*.whl')))} wheels, each hashed "
              f"in {lock})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
