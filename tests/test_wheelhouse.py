"""container/wheelhouse.py (`make wheelhouse`) and the image's offline install from it:
wheels for every supported Python, and nothing installed that the lock does not list.

The third outside review's finding 6, made for real: the image's offline install verified
nothing. `container/Dockerfile` ran `pip install --no-index --find-links
container/wheelhouse` with no hashes and sdists allowed: a `structlog-99.0` wheel planted
in the wheelhouse was installed, its `.pth` ran at every agent start; a planted sdist's
build backend ran as root at build time; and `wheelhouse.py --check` passed the doctored
wheelhouse.

Now `make wheelhouse` writes container/wheelhouse.lock (every wheel's sha256, one version
per package and Python), `--check` refuses every file that is not a wheel the lock lists,
naming it, and the Dockerfile installs with hashes required and wheels only. The install
is exercised with the Dockerfile's own command (read from the Dockerfile) in a fresh venv
of this machine's Python, offline, from a doctored copy of the real wheelhouse — the step
the image build runs, without the image (tests/test_container.py builds that). SECURITY.md
cites these classes.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.engines import wheelhouse

pytestmark = [pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "container" / "Dockerfile"
SCRIPT = ROOT / "container" / "wheelhouse.py"
IMAGE_HOUSE, IMAGE_LOCK = "/tmp/mpi-bootstrap-wheels", "/tmp/mpi-bootstrap-wheels.lock"
REAL = "structlog-26.1.0-py3-none-any.whl"  # the agent needs structlog: a target worth it


def dockerfile_install() -> list[str]:
    """The arguments of the Dockerfile's `pip install`, as the image build passes them."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    run = next(line for line in text.splitlines() if "/bin/pip install" in line)
    return shlex.split(run.split("/bin/pip install", 1)[1].split("&&", 1)[0])


def wheel(path: Path, files: dict[str, str]) -> Path:
    """A wheel at `path` (its name says what it is) holding `files` and its dist-info."""
    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


def pth(proof: Path) -> str:
    """A .pth line: Python runs it at every start of the venv's interpreter."""
    return f"import os; open({str(proof)!r}, 'w').write('owned')\n"


def plant_newer_wheel(house: Path, proof: Path) -> Path:
    return wheel(
        house / "structlog-99.0-py3-none-any.whl",
        {"structlog/__init__.py": "__version__ = '99.0'\n", "zz_owned.pth": pth(proof)},
    )


def plant_sdist(house: Path, proof: Path) -> Path:
    """An sdist whose in-tree build backend (no requirements: it builds offline) writes the
    proof as soon as pip imports it."""
    path = house / "structlog-99.0.tar.gz"
    members = {
        "PKG-INFO": "Metadata-Version: 2.1\nName: structlog\nVersion: 99.0\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "owned"\n'
        'backend-path = ["."]\n',
        "owned.py": f"open({str(proof)!r}, 'w').write('owned')\n",
    }
    with tarfile.open(path, "w:gz") as tf:
        for member, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"structlog-99.0/{member}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def plant_changed_wheel(house: Path, proof: Path) -> Path:
    """The real structlog wheel, same name, with a .pth added."""
    path = house / REAL
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("zz_owned.pth", pth(proof))
    return path


def plant_stray_file(house: Path, proof: Path) -> Path:
    path = house / "zz_owned.pth"
    path.write_text(pth(proof))
    return path


def plant_directory(house: Path, _proof: Path) -> Path:
    path = house / "more"
    path.mkdir()
    wheel(path / "extra-1.0-py3-none-any.whl", {})
    return path


PLANTS: dict[str, Callable[[Path, Path], Path]] = {
    "newer-wheel": plant_newer_wheel,
    "sdist": plant_sdist,
    "changed-wheel": plant_changed_wheel,
    "stray-file": plant_stray_file,
    "directory": plant_directory,
}


def agent_version(venv: Path) -> str:
    """What the agent installed in `venv` says to --version (its stderr, if it fails)."""
    done = subprocess.run(
        [str(venv / "bin" / "mpi-bootstrap"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout or done.stderr


@pytest.fixture
def house(tmp_path: Path, container: None) -> tuple[Path, Path]:
    """A copy of the real wheelhouse and its lock (`make wheelhouse`'s, once a session)."""
    wheelhouse()
    copy = tmp_path / "wheelhouse"
    shutil.copytree(ROOT / "container" / "wheelhouse", copy)
    lock = tmp_path / "wheelhouse.lock"
    shutil.copy(ROOT / "container" / "wheelhouse.lock", lock)
    return copy, lock


def check(house: Path, lock: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--house", str(house), "--lock", str(lock)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


class TestCheck:
    """`wheelhouse.py --check` on a doctored wheelhouse."""

    @pytest.mark.parametrize("plant", sorted(PLANTS))
    def test_refuses_naming_the_file(
        self, house: tuple[Path, Path], tmp_path: Path, plant: str
    ) -> None:
        path = PLANTS[plant](house[0], tmp_path / "proof")
        done = check(*house)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{path}: " in done.stderr, done.stderr

    def test_control(self, house: tuple[Path, Path]) -> None:
        """The wheelhouse as `make wheelhouse` left it passes, for every Python and
        architecture."""
        done = check(*house)
        assert done.returncode == 0, done.stderr
        assert "resolves offline for CPython 3.10, 3.11, 3.12, 3.13 on x86_64 and aarch64" in (
            done.stdout
        )

    def test_lock_pins_what_python_3_10_needs(self, house: tuple[Path, Path]) -> None:
        """structlog and cryptography need typing-extensions on 3.10 only (a marker pip
        evaluated for the Python that filled the wheelhouse): the lock pins it there."""
        text = house[1].read_text()
        assert "typing-extensions==" in text and '; python_version == "3.10"' in text


class TestInstall:
    """The Dockerfile's own `pip install`, offline, into a fresh venv."""

    @staticmethod
    def install(house: tuple[Path, Path], venv: Path) -> subprocess.CompletedProcess[str]:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        args = [
            a.replace(IMAGE_LOCK, str(house[1])).replace(IMAGE_HOUSE, str(house[0]))
            for a in dockerfile_install()
        ]
        # As in an image build: no pip configuration of this machine's.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        return subprocess.run(
            [str(venv / "bin" / "pip"), "install", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )

    def test_flags(self) -> None:
        args = dockerfile_install()
        assert {"--no-index", "--require-hashes", "--only-binary=:all:"} <= set(args)
        assert args[args.index("-r") + 1] == IMAGE_LOCK

    @pytest.mark.parametrize("plant", ["newer-wheel", "sdist"])
    def test_planted_is_neither_installed_nor_built(
        self, house: tuple[Path, Path], tmp_path: Path, plant: str
    ) -> None:
        """A newer structlog, wheel or sdist: the install takes the locked one, runs no
        build backend, installs no .pth; the agent starts."""
        proof = tmp_path / "proof"
        PLANTS[plant](house[0], proof)
        venv = tmp_path / "venv"
        done = self.install(house, venv)
        assert not proof.exists(), "the planted package's code ran"
        assert done.returncode == 0, done.stderr
        version = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import structlog; print(structlog.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert version.strip() == "26.1.0"
        assert agent_version(venv).startswith("mpi-bootstrap ")
        assert not proof.exists()
        assert not list(venv.rglob("zz_owned.pth"))

    def test_changed_wheel_fails_the_build(self, house: tuple[Path, Path], tmp_path: Path) -> None:
        """The locked version's wheel changed: pip's hash check stops the install, nothing
        of it runs."""
        proof = tmp_path / "proof"
        plant_changed_wheel(house[0], proof)
        venv = tmp_path / "venv"
        done = self.install(house, venv)
        assert done.returncode != 0
        assert "DO NOT MATCH THE HASHES" in done.stderr, done.stderr
        assert not (venv / "bin" / "mpi-bootstrap").exists()
        subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], check=True)
        assert not proof.exists()

    def test_control(self, house: tuple[Path, Path], tmp_path: Path) -> None:
        venv = tmp_path / "venv"
        done = self.install(house, venv)
        assert done.returncode == 0, done.stderr
        assert agent_version(venv).startswith("mpi-bootstrap ")


def test_wheelhouse_serves_every_python(container: None) -> None:
    """`make wheelhouse` holds wheels for CPython 3.10-3.13 on x86-64 and aarch64: for each,
    pip resolves `mpi-bootstrap` from it alone (no index), as an offline image build does."""
    wheelhouse()  # made (and checked) once a session
    done = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "python"),
            str(ROOT / "container" / "wheelhouse.py"),
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "resolves offline for CPython 3.10, 3.11, 3.12, 3.13 on x86_64 and aarch64" in (
        done.stdout
    )
    names = {p.name for p in (ROOT / "container" / "wheelhouse").glob("*.whl")}
    for arch in ("x86_64", "aarch64"):
        assert any("cryptography" in n and arch in n and "manylinux_2_17" in n for n in names)
        assert not any("manylinux_2_34" in n for n in names)
