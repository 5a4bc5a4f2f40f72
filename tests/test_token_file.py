"""MPI_BOOTSTRAP_TOKEN_FILE: read once, in the config step, by the launcher and the worker
only, from a Kubernetes Secret volume's layout (symlinks) on the real file system; every
bad file is a 64 naming the variable and the path, with the other config problems; who
else may read the file, or the token in the environment, is said (core/tokens.py)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from mpi_bootstrap.core import tokens
from mpi_bootstrap.core.config import Config, Machine
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.doctor import tokencheck
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.system import host
from tests.support.workers import token_volume

TOKEN = "secret-volume-token-0123456789"  # noqa: S105 - the test's own
PROG = ["--", "true"]


def secret_volume(root: Path, data: bytes, mode: int = 0o400) -> Path:
    """A Secret volume as the kubelet writes it (kubernetes pkg/volume/util/
    atomic_writer.go): `token -> ..data/token`, `..data -> ..<timestamp>`, the file
    itself in the timestamped directory."""
    stamp = root / "..2025_01_01_00_00_00.123456789"
    stamp.mkdir(parents=True)
    (stamp / "token").write_bytes(data)
    (stamp / "token").chmod(mode)
    (root / "..data").symlink_to(stamp.name)
    (root / "token").symlink_to("..data/token")
    return root / "token"


def config(env: dict[str, str], argv: list[str], facts: Machine | None = None) -> Config:
    return Config.from_env({"HOME": "/root", **env}, argv, facts or host.machine())


def problems(env: dict[str, str], argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config(env, argv)
    assert caught.value.status == 64
    assert TOKEN not in f"{caught.value.message}{caught.value.details}"
    return caught.value.problems


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    return secret_volume(tmp_path / "secret", f"{TOKEN}\n".encode())


class TestRead:
    """The launcher and the worker read the file through the Secret volume's symlinks."""

    @pytest.mark.parametrize(
        "argv", [["worker"], ["launcher", *PROG], ["launcher", "--explain", *PROG]]
    )
    def test_secret_volume(self, volume: Path, argv: list[str]) -> None:
        """The token is the file's text without its newline; `auto` picks net; a 0400 file
        read as root gives no warning; the token is in no repr."""
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": str(volume)}, argv)
        assert c.token == TOKEN
        assert (c.exchange, c.exchange_reason) == ("net", "auto: MPI_BOOTSTRAP_TOKEN_FILE is set")
        assert c.token_warnings == ()
        assert TOKEN not in repr(c)

    def test_flag(self, volume: Path) -> None:
        """--token-file names it as well, and is the source shown."""
        c = config({}, ["--token-file", str(volume), "worker"])
        assert c.token == TOKEN and str(c.source("token_file")) == "flag --token-file"

    def test_one_newline_dropped(self, tmp_path: Path) -> None:
        """One trailing newline (LF or CRLF) is dropped, not two: the rest is the token."""
        for i, (data, want) in enumerate(
            [(f"{TOKEN}\r\n", TOKEN), (f"{TOKEN}\n\n", f"{TOKEN}\n"), (f" {TOKEN} ", f" {TOKEN} ")]
        ):
            # A file of its own each (0400: only root could write one twice).
            path = tmp_path / f"t{i}"
            path.write_text(data, newline="")
            path.chmod(0o400)
            assert config({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["worker"]).token == want

    @pytest.mark.parametrize("role", ["probe", "doctor"])
    def test_probe_and_doctor_never_read_it(self, role: str) -> None:
        """The probe and the doctor never open the file (it may not even exist), never need the
        token, and still see the net exchange."""
        opened: list[str] = []

        def reader(path: str) -> tokens.TokenFile:
            opened.append(path)
            raise AssertionError("read")

        facts = dataclasses.replace(host.machine(), read_token_file=reader)
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": "/nonexistent/token"}, [role], facts)
        assert (c.token, c.exchange, opened) == (None, "net", [])
        # `net` set explicitly with no token at all is not their problem either
        c = config({"MPI_BOOTSTRAP_EXCHANGE": "net"}, [role], facts)
        assert (c.token, c.exchange) == (None, "net")


class TestRefused:
    """A file the agent must not use is a 64 naming the variable and the path, reported
    with every other config problem."""

    def test_each_bad_file(self, tmp_path: Path) -> None:
        """Missing, a directory, too long (1 MiB too), writable by group or others, too short,
        not UTF-8, a link to /dev/zero: each names MPI_BOOTSTRAP_TOKEN_FILE, the path and why
        (never the file's text)."""
        cases = {
            "missing": (None, 0, "No such file or directory"),
            "dir": (None, 0, "not a regular file"),
            "long": (b"x" * (tokens.MAX_FILE + 1), 0o400, f"longer than {tokens.MAX_FILE} bytes"),
            "writable": (TOKEN.encode(), 0o620, "group may write it (0620)"),
            "open": (TOKEN.encode(), 0o602, "others may write it (0602)"),
            "MiB": (b"x" * (1 << 20), 0o400, f"longer than {tokens.MAX_FILE} bytes"),
            "zero": (None, 0, "not a regular file"),
            "short": (b"short\n", 0o400, "must be at least 16 characters (value not shown)"),
            "binary": (b"\xff" * 20, 0o400, "is not UTF-8 text (value not shown)"),
        }
        for name, (data, mode, why) in cases.items():
            path = tmp_path / name
            if name == "dir":
                path.mkdir()
            elif name == "zero":
                path.symlink_to("/dev/zero")
            elif data is not None:
                path.write_bytes(data)
                path.chmod(mode)
            found = problems(
                {"MPI_BOOTSTRAP_TOKEN_FILE": str(path), "MPI_DNS_WAIT_SECONDS": "-1"},
                ["launcher", *PROG],
            )
            assert len(found) == 2, found  # with the other setting's problem
            mine = [p for p in found if p.startswith("MPI_BOOTSTRAP_TOKEN_FILE: ")]
            assert mine and str(path) in mine[0] and why in mine[0], (name, found)

    def test_fifo_does_not_block(self, tmp_path: Path) -> None:
        """A FIFO named as the token file is refused at once (a blocking open would wait for a
        writer forever)."""
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        box: list[list[str]] = []
        t = threading.Thread(
            target=lambda: box.append(problems({"MPI_BOOTSTRAP_TOKEN_FILE": str(fifo)}, ["worker"]))
        )
        t0 = time.monotonic()
        t.start()
        t.join(timeout=5)
        assert not t.is_alive(), "the agent blocked on a FIFO"
        assert time.monotonic() - t0 < 5
        assert "not a regular file" in box[0][0]

    def test_both_forms(self, volume: Path) -> None:
        """The file and the variable together are refused: which would win is a guess, and the
        variable keeps the token in every process's environment."""
        found = problems(
            {"MPI_BOOTSTRAP_TOKEN_FILE": str(volume), "MPI_BOOTSTRAP_TOKEN": TOKEN}, ["worker"]
        )
        assert found == [
            "MPI_BOOTSTRAP_TOKEN_FILE: set this or MPI_BOOTSTRAP_TOKEN, not both (in the "
            "environment, the token is in every process the container starts)"
        ]

    def test_net_without_any_token(self) -> None:
        """The launcher and the worker of a `net` exchange need the file (or the variable)."""
        assert problems({"MPI_BOOTSTRAP_EXCHANGE": "net"}, ["worker"]) == [
            "MPI_BOOTSTRAP_EXCHANGE: 'net' needs MPI_BOOTSTRAP_TOKEN_FILE (a key of a "
            "Kubernetes Secret volume)"
        ]


class TestForeign:
    """A file whose text another uid could have chosen is refused (64), by the launcher and
    the worker (system/host.py) and by the doctor's word (doctor/tokencheck.py), with the
    one rule (system/files.py `foreign`: its owner, and `swappable` for the directories of
    its path, as written and as resolved): security review 4, finding 3. A Secret or a
    projected volume, and a sticky directory of root's, still pass."""

    def test_another_uids_file(self, tmp_path: Path, root: None) -> None:
        """A 0600 file of uid 65534 is refused: its owner may write it whatever its mode."""
        path = tmp_path / "token"
        path.write_text(TOKEN)
        path.chmod(0o600)
        os.chown(path, 65534, 65534)
        (found,) = problems({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["worker"])
        assert found == (
            f"MPI_BOOTSTRAP_TOKEN_FILE: cannot read {path}: it belongs to uid 65534, who may "
            "write it whatever its mode"
        )

    @pytest.mark.parametrize(("mode", "who"), [(0o777, "others")])
    def test_open_directory(self, tmp_path: Path, mode: int, who: str) -> None:
        """A directory above the file that others may write without the sticky bit (an
        emptyDir) is refused, as written and behind a link, saying so; and the doctor says
        so too. (Another group's: tests/test_files.py test_own_group_may_write_above.)"""
        parent = tmp_path / "emptydir"
        parent.mkdir()
        parent.chmod(mode)
        (parent / "token").write_text(TOKEN)
        (parent / "token").chmod(0o400)
        (tmp_path / "link").symlink_to(parent / "token")
        why = f"{parent} above it is writable by {who} (mode {mode:04o}) without the sticky bit"
        for path in (parent / "token", tmp_path / "link"):
            (found,) = problems({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["worker"])
            assert found.startswith(f"MPI_BOOTSTRAP_TOKEN_FILE: cannot read {path}: {why}")
            (said,) = doctor_says(path)
            assert not said.ok and why in said.detail, said

    def test_volumes_pass(self, tmp_path: Path) -> None:
        """A Secret volume (tests/support/workers.py token_volume) and a projected volume (the
        same `..data` links, a key at a path of its own, the tmpfs 1777 as the kubelet mounts
        it) are read, and the doctor finds nothing wrong."""
        secret = token_volume(tmp_path, TOKEN)
        projected = tmp_path / "projected"
        stamp = projected / "..2025_01_01_00_00_00.000000001"
        (stamp / "mpi").mkdir(parents=True)
        (stamp / "mpi" / "token").write_text(TOKEN)
        (stamp / "mpi" / "token").chmod(0o400)
        (projected / "..data").symlink_to(stamp.name)
        (projected / "mpi").symlink_to("..data/mpi")
        projected.chmod(0o1777)
        for path in (secret, projected / "mpi" / "token"):
            assert config({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["worker"]).token == TOKEN
            (said,) = doctor_says(path)
            assert said.ok and not said.warning, said

    def test_sticky_directory_of_roots(self, tmp_path: Path, root: None) -> None:
        """A 1777 directory of root's (/tmp) is no way in: only the file's owner may rename it."""
        parent = tmp_path / "tmp"
        parent.mkdir()
        parent.chmod(0o1777)
        assert parent.stat().st_uid == 0
        (parent / "token").write_text(TOKEN)
        (parent / "token").chmod(0o400)
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": str(parent / "token")}, ["worker"])
        assert c.token == TOKEN


def doctor_says(path: Path) -> list[Finding]:
    """The doctor's findings on the token file `path` (doctor/tokencheck.py)."""
    return tokencheck.findings(config({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["doctor"]))


class TestWhoElseReads:
    """Who else may read the token is said where it is needless: the environment form
    always; a file readable by every user; a file readable by its group when the agent
    reads it as root or as its owner (not when the group is how a non-root agent reads a
    root-owned Secret file: fsGroup, 0440)."""

    @pytest.mark.parametrize(
        ("mode", "uid", "euid", "said"),
        [
            (0o400, 0, 0, None),
            (0o644, 0, 0, "is readable by every user (0644)"),
            (0o444, 0, 1000, "is readable by every user (0444)"),
            (0o440, 0, 0, "is readable by group 2000 too (0440)"),
            (0o440, 1000, 1000, "is readable by group 2000 too (0440)"),
            (0o440, 0, 1000, None),
            (0o600, 1000, 1000, None),
        ],
    )
    def test_modes(self, mode: int, uid: int, euid: int, said: str | None) -> None:
        """Each mode, owner and reader gives its warning, or none."""
        assert tokens.other_readers(tokens.TokenFile(b"", mode, uid, 2000), euid) == said

    def test_open_file_is_warned(self, tmp_path: Path) -> None:
        """A Secret volume left at Kubernetes' default 0644 is read, with a warning that says
        how to close it (and never the token)."""
        path = secret_volume(tmp_path / "s", TOKEN.encode(), 0o644)
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": str(path)}, ["worker"])
        assert c.token == TOKEN
        (warning,) = c.token_warnings
        assert warning.startswith(f"the token file {path} is readable by every user (0644)")
        assert "defaultMode 0400" in warning and TOKEN not in warning

    @pytest.mark.parametrize("role", ["worker", "probe", "doctor"])
    def test_environment_form_is_warned(self, role: str) -> None:
        """MPI_BOOTSTRAP_TOKEN still works, and every role says it is exposed and how to move."""
        c = config({"MPI_BOOTSTRAP_TOKEN": TOKEN}, [role])
        assert c.token == TOKEN and c.exchange == "net"
        (warning,) = c.token_warnings
        assert "every process the container starts holds it" in warning
        assert "MPI_BOOTSTRAP_TOKEN_FILE" in warning and TOKEN not in warning


class TestExplainDecision:
    """--explain's `token` decision (core/tokens.py) says where the token comes from, and
    carries every warning; it never shows the token."""

    def test_forms(self, tmp_path: Path) -> None:
        """The environment form is a WARNING with how to move; a 0400 file says who reads it and
        that no environment holds it; an open file adds its WARNING; no token, no decision."""
        env = config({"MPI_BOOTSTRAP_TOKEN": TOKEN}, ["launcher", *PROG]).token_decision()
        assert env is not None
        assert (env.value, env.source) == ("environment", "env MPI_BOOTSTRAP_TOKEN")
        assert env.reason.startswith("WARNING: MPI_BOOTSTRAP_TOKEN is in the container's")
        assert "MPI_BOOTSTRAP_TOKEN_FILE" in env.reason
        closed = secret_volume(tmp_path / "closed", TOKEN.encode())
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": str(closed)}, ["launcher", *PROG])
        file = c.token_decision()
        assert file is not None and file.value == f"file {closed}"
        assert "WARNING" not in file.reason and "in no process's environment" in file.reason
        opened = secret_volume(tmp_path / "open", TOKEN.encode(), 0o644)
        c = config({"MPI_BOOTSTRAP_TOKEN_FILE": str(opened)}, ["launcher", *PROG])
        warned = c.token_decision()
        assert warned is not None and "WARNING: the token file" in warned.reason
        assert all(TOKEN not in repr(d) for d in (env, file, warned))
        assert config({}, ["launcher", *PROG]).token_decision() is None
