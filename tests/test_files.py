"""system/files.py against the real file system: a file written atomically under a
failure or a signal (the old one whole, no temporary file), and the state directory's
checks (made private, or refused with 64, or 73 when it cannot be made). No namespaces;
each runs in milliseconds."""

from __future__ import annotations

import errno
import os
import signal
import stat
from pathlib import Path

import pytest

from mpi_bootstrap.core.errors import ConfigError, WriteError
from mpi_bootstrap.core.names import is_plain_path
from mpi_bootstrap.proc import children
from mpi_bootstrap.system import files

pytestmark = pytest.mark.timeout(60)


class TestAtomicWrite:
    """A failed or interrupted write leaves the old file whole and no temporary file."""

    def test_interrupted_mid_write(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A signal mid-write leaves the old ssh_config whole and no temporary file beside it."""
        target = tmp_path / "ssh_config"
        target.write_text("old\n")

        def interrupted(_fd: int) -> None:
            raise children.Interrupted(signal.SIGTERM)

        monkeypatch.setattr(os, "fsync", interrupted)
        with pytest.raises(children.Interrupted):
            files.atomic_write(str(target), "new\n" * 1000, 0o600)
        assert target.read_text() == "old\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ssh_config"]

    def test_disk_full_is_73_naming_the_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A full disk is exit 73 naming the file, still an OSError, and leaves no temp file."""

        def full(_fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(WriteError) as exc:
            files.atomic_write(str(tmp_path / "known_hosts"), "x\n")
        assert exc.value.status == 73
        assert f"cannot write {tmp_path}/known_hosts: No space left on device" in str(exc.value)
        assert isinstance(exc.value, OSError)  # the supervisor's `except OSError` still holds
        assert list(tmp_path.iterdir()) == []


class TestHeld:
    """The state directory is one agent's: a second one (another pod on a shared /run or
    volume) is refused, naming the directory and the holder; one in a place others could
    rename it from is held open."""

    def test_a_second_agent_is_refused(self, tmp_path: Path) -> None:
        """While another process holds it, `hold` raises ConfigError (64) naming the
        directory and who holds it; once that one is gone, it is taken."""
        import subprocess
        import sys

        state = tmp_path / "state"
        files.state_dir(str(state))
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from mpi_bootstrap.system import files; "
                f"files.hold({str(state)!r}); print('held', flush=True); sys.stdin.read()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(ConfigError, match=f"{state} is in use by another agent .pod "):
                files.hold(str(state))
        finally:
            holder.communicate("")
        files.hold(str(state))  # the holder has exited: its lock is gone
        assert files._held

    def test_a_swapped_directory_is_not_followed(self, tmp_path: Path) -> None:
        """Held open, the directory checked is the one reached, whatever is renamed: its
        path renamed away and another put there (by someone who may write the parent)."""
        open_dir = tmp_path / "emptydir"
        open_dir.mkdir()
        open_dir.chmod(0o777)  # kubelet's emptyDir (kubernetes#110835)
        held = files.state_dir(str(open_dir / "state"), lock=True)
        assert held is not None and held.startswith("/proc/")
        assert files.state_dir(held) == held
        (open_dir / "state").rename(open_dir / "taken")
        (open_dir / "state").mkdir()
        Path(held, "authorized_keys").write_text("ours\n")
        assert (open_dir / "taken" / "authorized_keys").read_text() == "ours\n"
        assert not (open_dir / "state" / "authorized_keys").exists()
        assert stat.S_IMODE((open_dir / "taken").stat().st_mode) == 0o700


class TestStateDir:
    """The state directory is ours and private, or the agent refuses it (64) or says it
    cannot make it (73)."""

    def test_created_private(self, tmp_path: Path) -> None:
        """A new state directory is created 0700, so no other user can read the keys kept in it."""
        files.state_dir(str(tmp_path / "a" / "state"))
        assert (tmp_path / "a" / "state").stat().st_mode & 0o777 == 0o700

    def test_existing_open_one_made_private(self, tmp_path: Path) -> None:
        """An existing 0755 state directory of ours is narrowed to 0700 before keys go into it."""
        d = tmp_path / "state"
        d.mkdir(mode=0o755)
        files.state_dir(str(d))
        assert d.stat().st_mode & 0o777 == 0o700

    @pytest.mark.parametrize("kind", ["file", "symlink"])
    def test_refused(self, tmp_path: Path, kind: str) -> None:
        """A state dir that is a file or a symlink is refused (64), naming it, so nobody else
        decides where the agent's keys and ssh config land."""
        d = tmp_path / "state"
        if kind == "file":
            d.write_text("")
        else:
            (tmp_path / "elsewhere").mkdir()
            d.symlink_to(tmp_path / "elsewhere")
        self.assert_refused(d)

    def test_other_owners_refused(self, tmp_path: Path, root: None) -> None:
        """Another user's directory is refused (64), naming it (only root can make one)."""
        d = tmp_path / "state"
        d.mkdir(mode=0o777)
        os.chown(d, 1000, 1000)
        self.assert_refused(d)

    @staticmethod
    def assert_refused(d: Path) -> None:
        with pytest.raises(ConfigError) as exc:
            files.state_dir(str(d))
        assert exc.value.status == 64
        assert str(d) in exc.value.message

    def test_own_group_may_write_above(self, tmp_path: Path) -> None:
        """A directory above it that the agent's own group may write (OpenShift's g=u
        images, gid 0) is the pod's own: no reason to hold it open; others' is."""
        parent = tmp_path / "home"
        parent.mkdir()
        os.chown(parent, -1, os.getegid())
        parent.chmod(0o775)
        assert files.swappable(str(parent / "state"), os.geteuid()) is None
        parent.chmod(0o777)
        assert "writable by others (mode 0777)" in str(
            files.swappable(str(parent / "state"), os.geteuid())
        )
        theirs = os.stat_result((0o40770, 0, 0, 0, 0, os.getegid() + 1, 0, 0, 0, 0))
        assert files._open_bits(theirs) == 0o022  # another group's: its members may write

    def test_cannot_create_is_73(self, tmp_path: Path) -> None:
        """A state directory that cannot be created (a file in its path) is exit 73, not a crash."""
        (tmp_path / "file").write_text("")
        with pytest.raises(WriteError) as exc:
            files.state_dir(str(tmp_path / "file" / "state"))
        assert exc.value.status == 73

    @pytest.mark.parametrize(
        "path", ["/tmp/a b", "relative/dir", "/x\nPasswordAuthentication", "/x'y", ""]
    )
    def test_unsafe_paths_are_not_plain(self, path: str) -> None:
        """Relative, empty, spaced, quoted or multi-line paths are not plain, so none can smuggle a
        directive (e.g. PasswordAuthentication) into the ssh or sshd config written from it."""
        assert not is_plain_path(path)
