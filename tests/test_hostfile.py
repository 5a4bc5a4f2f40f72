"""Hostfile parsing, validation, rewriting and writing."""

from __future__ import annotations

import os

import pytest
from pytest_mock import MockerFixture

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.errors import HostfileError
from mpi_bootstrap.system import hostfile_reader


def names_slots(text: str) -> list[tuple[str, int, int | None]]:
    return [(h.name, h.slots, h.max_slots) for h in hf.parse(text, "hf").hosts]


class TestForms:
    """Every form users and operators write is read the same way."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            # MPI Operator, Open MPI launcher
            ("pi-worker-0.pi.default.svc slots=1\n", [("pi-worker-0.pi.default.svc", 1, None)]),
            # MPI Operator, Intel MPI / MPICH launcher
            ("pi-worker-0.pi.default.svc:1\n", [("pi-worker-0.pi.default.svc", 1, None)]),
            # bare hosts (Volcano, discover_hosts.sh) are one slot each
            ("a\nb\n", [("a", 1, None), ("b", 1, None)]),
            ("a slots=4 max_slots=8\n", [("a", 4, 8)]),
            ("a slots=4 max-slots=4\n", [("a", 4, 4)]),
            ("a count=3\n", [("a", 3, None)]),
            ("a    slots=2\t\n", [("a", 2, None)]),
            # comments, blank lines, CRLF, trailing comments, a BOM
            (
                "# header\n\n  a slots=2  # two GPUs\r\nb:3\r\n\r\n",
                [("a", 2, None), ("b", 3, None)],
            ),
            ("\ufeffa slots=1\n", [("a", 1, None)]),
            # IP literals
            ("10.0.0.5 slots=2\n", [("10.0.0.5", 2, None)]),
            ("10.0.0.5:2\n", [("10.0.0.5", 2, None)]),
            ("fd00::5 slots=2\n", [("fd00::5", 2, None)]),
            ("[fd00::5]:2\n", [("fd00::5", 2, None)]),
            ("fd00::5\n", [("fd00::5", 1, None)]),
            # Kubeflow Trainer v2 short names
            ("tj-node-0-0.tj slots=8\n", [("tj-node-0-0.tj", 8, None)]),
            # mixed forms in one file
            ("a slots=2\nb:2\nc\n", [("a", 2, None), ("b", 2, None), ("c", 1, None)]),
        ],
    )
    def test_reads(self, text: str, expected: list[tuple[str, int, int | None]]) -> None:
        """Every hostfile form in use (slots=, host:N, bare, max_slots, count=, comments, CRLF, BOM,
        IP literals, short names, mixed) parses to the same names and slots."""
        assert names_slots(text) == expected

    def test_total_slots(self) -> None:
        """total_slots adds up the slots of every form, a bare host counting one."""
        assert hf.parse("a slots=2\nb:3\nc\n").total_slots == 6

    def test_line_numbers_count_comments_and_blanks(self) -> None:
        """A host's line number counts comment and blank lines, so errors name the real line."""
        hosts = hf.parse("# c\n\na\n\nb\n").hosts
        assert [h.line for h in hosts] == [3, 5]


class TestErrors:
    """Each bad line is named by file:line with the reason, as a HostfileError."""

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("a slots=0\n", "hf:1: slots must be ≥ 1, not '0'"),
            ("a slots=-1\n", "hf:1: slots must be a whole number ≥ 1, not '-1'"),
            ("a slots=x\n", "hf:1: slots must be a whole number ≥ 1, not 'x'"),
            ("a:0\n", "hf:1: slots must be ≥ 1, not '0'"),
            ("a:\n", "hf:1: slots must be a whole number ≥ 1, not ''"),
            ("\n\na:x\n", "hf:3: slots must be a whole number ≥ 1, not 'x'"),
            ("a slots=2 max_slots=1\n", "hf:1: max_slots=1 is less than slots=2"),
            ("a slots\n", "hf:1: unexpected 'slots'"),
            ("a cores=2\n", "hf:1: unknown option 'cores'"),
            ("a:2 slots=2\n", "hf:1: unexpected 'slots=2' after 'a:2'"),
            ("a;rm -rf /\n", "hf:1: 'a;rm' is not a valid hostname"),
            ("$(x) slots=1\n", "hf:1: '$(x)' is not a valid hostname"),
            ("`id`\n", "hf:1: '`id`' is not a valid hostname"),
            ("a b\n", "hf:1: unexpected 'b'"),
            ("-rf slots=1\n", "hf:1: '-rf' is not a valid hostname"),
            ("bad_name slots=1\n", "hf:1: 'bad_name' is not a valid hostname"),
            ("a..b\n", "hf:1: 'a..b' is not a valid hostname"),
            ("x" * 64 + "\n", "is not a valid hostname"),
            ("a\nb\na slots=2\n", "hf:3: duplicate host 'a' (first at line 1)"),
            ("A\nb\na\n", "hf:3: duplicate host 'a' (first at line 1)"),
            ("", "hf: no hosts"),
            ("# only\n\n", "hf: no hosts"),
        ],
    )
    def test_rejects(self, text: str, message: str) -> None:
        """Each malformed line (bad slots, unknown option, shell characters, bad or duplicate name)
        and a file without hosts give a one-line HostfileError naming file:line and the reason."""
        with pytest.raises(HostfileError) as err:
            hf.parse(text, "hf")
        assert message in err.value.message
        assert "\n" not in err.value.message

    def test_binary(self) -> None:
        """A NUL byte is refused as binary data, naming the line it is on."""
        with pytest.raises(HostfileError, match=r"hf:2: binary data"):
            hf.parse(b"a\nb\x00c\n", "hf")

    def test_not_utf8(self) -> None:
        """Text that is not UTF-8 is refused, naming the line and the offending byte."""
        with pytest.raises(HostfileError, match=r"hf:1: not UTF-8 text \(byte 0xff\)"):
            hf.parse(b"a\xff\n", "hf")

    def test_missing(self, tmp_path: os.PathLike[str]) -> None:
        """A missing hostfile is a HostfileError '<path>: hostfile not found'."""
        path = os.path.join(tmp_path, "nope")
        with pytest.raises(HostfileError, match=f"{path}: hostfile not found"):
            hostfile_reader.read(path)

    def test_directory(self, tmp_path: os.PathLike[str]) -> None:
        """A hostfile path that is a directory is a HostfileError saying so."""
        with pytest.raises(HostfileError, match="is a directory"):
            hostfile_reader.read(str(tmp_path))

    def test_unreadable(self, tmp_path: os.PathLike[str], mocker: MockerFixture) -> None:
        """A hostfile that cannot be opened is a 'not readable' HostfileError. Root (as in CI)
        reads a mode-000 file anyway, so the refusal is injected."""
        path = os.path.join(tmp_path, "hf")
        mocker.patch("builtins.open", side_effect=PermissionError(13, "Permission denied"))
        with pytest.raises(HostfileError, match="not readable"):
            hostfile_reader.read(path)


class TestRewrite:
    """fqdn is idempotent and touches only `.svc` names; renames never merge hosts."""

    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            ("pi-worker-0.pi.default.svc", "pi-worker-0.pi.default.svc.cluster.local"),
            (
                "pi-worker-0.pi.default.svc.cluster.local",
                "pi-worker-0.pi.default.svc.cluster.local",
            ),
            ("PI.default.SVC", "PI.default.SVC.cluster.local"),
            ("tj-node-0-0.tj", "tj-node-0-0.tj"),
            ("localhost", "localhost"),
            ("10.0.0.1", "10.0.0.1"),
            ("fd00::1", "fd00::1"),
            ("a.svc.", "a.svc."),
        ],
    )
    def test_fqdn(self, name: str, expected: str) -> None:
        """fqdn appends the cluster domain only to names ending in .svc (any case), idempotently;
        short names, localhost, IPs and absolute names stay as they are."""
        assert hf.fqdn(name, "cluster.local") == expected
        assert hf.fqdn(hf.fqdn(name, "cluster.local"), "cluster.local") == expected

    def test_fqdn_other_domain(self) -> None:
        """fqdn appends the configured cluster domain, not a fixed cluster.local."""
        assert hf.fqdn("a.ns.svc", "corp.example") == "a.ns.svc.corp.example"

    def test_rename_collision(self) -> None:
        """A rename mapping two hosts to one name is refused, naming both hosts and their lines."""
        parsed = hf.parse("a slots=1\nb slots=1\n", "hf")
        with pytest.raises(
            HostfileError,
            match=r"hf:2: 'b' becomes '10.0.0.1', the same as "
            r"'a' \(line 1\)",
        ):
            hf.rename(parsed, {"a": "10.0.0.1", "b": "10.0.0.1"})


class TestRender:
    """Written hostfiles are in the form the detected MPI reads, converting between forms."""

    def test_openmpi(self) -> None:
        """Open MPI output is `host slots=N`, keeping max_slots, whatever form the input used."""
        hosts = hf.parse("a:2\nb slots=1 max_slots=4\nc\n").hosts
        assert hf.render(hosts, hf.OPENMPI) == "a slots=2\nb slots=1 max_slots=4\nc slots=1\n"

    def test_hydra(self) -> None:
        """Hydra output is `host:N`, IPv6 in brackets, whatever form the input used."""
        hosts = hf.parse("a slots=2\nb:3\nc\nfd00::1 slots=2\n").hosts
        assert hf.render(hosts, hf.HYDRA) == "a:2\nb:3\nc:1\n[fd00::1]:2\n"

    @pytest.mark.parametrize("form", [hf.OPENMPI, hf.HYDRA])
    def test_round_trip(self, form: str) -> None:
        """A hostfile rendered in either form parses back to the same hosts and slots."""
        hosts = hf.parse("a slots=2\nb:3\n10.0.0.1\n").hosts
        again = hf.parse(hf.render(hosts, form)).hosts
        assert [(h.name, h.slots) for h in again] == [(h.name, h.slots) for h in hosts]


class TestFastPath:
    """The fast path for MPI Operator's shapes agrees with the careful one."""

    @pytest.mark.parametrize(
        "line",
        [
            "a slots=00",
            "a:00",
            "a:0",
            "a slots=0",
            "-a slots=1",
            "a- slots=1",
            "a..b:1",
            "a slots=1 max_slots=2",
            "a\tslots=3",
            "a:7",
            "a",
            "10.0.0.1:2",
            "x" * 64 + ":1",
        ],
    )
    def test_same_as_careful(self, line: str) -> None:
        """For each MPI Operator-shaped line, valid or not, the fast parser gives the same host or
        error message as the careful per-line parser."""
        try:
            fast: object = hf.parse(line + "\n", "hf").hosts[0]
        except HostfileError as exc:
            fast = exc.message
        try:
            careful: object = hf._parse_line(line, "hf", 1)
        except HostfileError as exc:
            careful = exc.message
        assert fast == careful
