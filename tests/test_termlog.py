"""system/termlog.py, the termination message's writer: its rules on real files, and the
attack the third outside review made for real (its finding 4): an unprivileged user
(uid 1000) who may write a directory above `MPI_BOOTSTRAP_TERMINATION_LOG` (an emptyDir:
0777 without the sticky bit) swaps a directory on that path for a symlink into a
root-owned 0700 directory; the agent, as root, then failed and wrote its termination
message through the link — truncating a root file of that name, or creating one there.
Now no link is followed at any component of the path: the agent writes nothing and its
exit is unchanged. SECURITY.md cites these classes. (The message's text and the agent's
exits: tests/test_termination.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mpi_bootstrap.core import termination
from mpi_bootstrap.system import termlog
from tests.conftest import Pod
from tests.support.attacker import as_attacker
from tests.support.onepod import launcher

# How the agent fails, and so who writes the message: the CLI (a bad hostfile: 65), or
# the resident PID 1 after mpirun (Debian's Open MPI 4, one node) ran `exit 3`.
FAILURES = {
    "cli": ("bad host line x=1\n", ("true",), 65),
    "resident": ("localhost\n", ("sh", "-c", "exit 3"), 3),
}


def fail(pod: Pod, log: Path, writer: str) -> tuple[int, int]:
    """Run the launcher, as root, failing the way `writer` names; (its code, the wanted)."""
    text, program, wanted = FAILURES[writer]
    hostfile = pod.tmp / "hostfile"
    hostfile.write_text(text)
    code, _, err = launcher(
        pod, hostfile, env={"MPI_BOOTSTRAP_TERMINATION_LOG": str(log)}, program=program
    )
    assert code == wanted, err
    return code, wanted


class TestSwappedDirectory:
    """A directory above the message's path swapped for a symlink by uid 1000."""

    @pytest.fixture
    def layout(self, base: Path) -> tuple[Path, Path, Path]:
        """(the configured path, in a 0777 emptyDir; the root-owned 0700 directory the
        attacker points at; the emptyDir)."""
        secret = base / "secret"
        secret.mkdir(mode=0o700)
        emptydir = base / "emptydir"
        emptydir.mkdir()
        emptydir.chmod(0o777)
        (emptydir / "logs").mkdir()  # the pod spec's directory, root's
        return emptydir / "logs" / "term", secret, emptydir

    @pytest.mark.parametrize("writer", sorted(FAILURES))
    @pytest.mark.parametrize("victim_exists", [True, False], ids=["truncate", "create"])
    def test_no_link_is_followed(
        self, pod: Pod, layout: tuple[Path, Path, Path], writer: str, victim_exists: bool
    ) -> None:
        """The root file of that name in the 0700 directory is untouched (or, where there
        was none, none is created), and the agent exits as it would have."""
        log, secret, emptydir = layout
        victim = secret / "term"
        if victim_exists:
            victim.write_text("root's own\n")
            victim.chmod(0o600)
            before = victim.stat()
        as_attacker(f"mv {emptydir}/logs {emptydir}/old && ln -s {secret} {emptydir}/logs")
        fail(pod, log, writer)
        if victim_exists:
            after = victim.stat()
            assert victim.read_text() == "root's own\n"
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert sorted(os.listdir(secret)) == (["term"] if victim_exists else [])
        assert os.listdir(emptydir / "old") == []

    @pytest.mark.parametrize("writer", sorted(FAILURES))
    def test_control(self, pod: Pod, layout: tuple[Path, Path, Path], writer: str) -> None:
        """Nobody swapped anything: the message is written at the configured path."""
        log, secret, _ = layout
        code, _ = fail(pod, log, writer)
        assert log.read_text().startswith(f"mpi-bootstrap launcher: exit {code} (")
        assert os.listdir(secret) == []


class TestWriter:
    """system/termlog.py on real files: in place, created, refused, never blocking; a link
    anywhere on the path, a hard link."""

    def test_in_place(self, tmp_path: Path) -> None:
        """An existing file (the kubelet's bind mount) is rewritten in place: same inode, the
        old longer text gone."""
        path = tmp_path / "termination-log"
        path.write_text("x" * 10_000)
        inode = path.stat().st_ino
        assert termlog.write(str(path), "short\n", create=False)
        assert path.read_text() == "short\n" and path.stat().st_ino == inode

    def test_created_only_when_set(self, tmp_path: Path) -> None:
        """A missing file is created (atomically: no temporary file left) only when the path
        was set; the default path is used only where it exists."""
        path = tmp_path / "log"
        assert not termlog.write(str(path), "a\n", create=False)
        assert not path.exists()
        assert termlog.write(str(path), "a\n", create=True)
        assert path.read_text() == "a\n" and os.listdir(tmp_path) == ["log"]

    def test_cut_to_4k(self, tmp_path: Path) -> None:
        path = tmp_path / "log"
        assert termlog.write(str(path), "y" * 10_000, create=True)
        assert path.stat().st_size == termination.LIMIT

    @pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "off", "no-directory"])
    def test_refused(self, tmp_path: Path, kind: str) -> None:
        """A FIFO (no reader: it must not wait), a symlink, a directory, an empty path or a
        missing directory: nothing written, at once, no error."""
        path = tmp_path / "log"
        target = tmp_path / "elsewhere"
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            target.write_text("keep\n")
            path.symlink_to(target)
        elif kind == "directory":
            path.mkdir()
        elif kind == "no-directory":
            path = tmp_path / "missing" / "log"
        t0 = time.monotonic()
        assert not termlog.write("" if kind == "off" else str(path), "a\n", create=True)
        assert time.monotonic() - t0 < 1
        if kind == "symlink":
            assert target.read_text() == "keep\n"

    @pytest.mark.parametrize("depth", [1, 2, 3])
    def test_link_at_any_component(self, tmp_path: Path, depth: int) -> None:
        """A symlinked directory at any depth above the file: nothing written, either in
        place or created."""
        names = ["real", "a", "b"]
        (tmp_path.joinpath(*names) / "log").parent.mkdir(parents=True)
        (tmp_path.joinpath(*names) / "log").write_text("keep\n")
        parent = tmp_path.joinpath(*names[: depth - 1])
        (parent / f"{names[depth - 1]}-via").symlink_to(parent / names[depth - 1])
        via = parent.joinpath(f"{names[depth - 1]}-via", *names[depth:])
        real = tmp_path / "real"
        for create in (False, True):
            assert not termlog.write(str(via / "log"), "a\n", create=create)
            assert not termlog.write(str(via / "new"), "a\n", create=create)
        assert (real / "a" / "b" / "log").read_text() == "keep\n"
        assert sorted(os.listdir(real / "a" / "b")) == ["log"]
        # Control: the same file by its real path.
        assert termlog.write(str(real / "a" / "b" / "log"), "a\n", create=False)

    def test_hard_link(self, tmp_path: Path) -> None:
        """A file with a second name (a hard link to another file, as a user could plant
        where fs.protected_hardlinks is off): not written."""
        other = tmp_path / "other"
        other.write_text("keep\n")
        os.link(other, tmp_path / "log")
        assert not termlog.write(str(tmp_path / "log"), "a\n", create=True)
        assert other.read_text() == "keep\n"

    @pytest.mark.parametrize("path", ["relative/log", "/", "/a/..", "/a/.", "/x\0y/log"])
    def test_odd_paths(self, path: str) -> None:
        """No absolute file name: nothing written, no error."""
        assert not termlog.write(path, "a\n", create=True)
