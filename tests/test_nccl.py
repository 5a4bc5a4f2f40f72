"""NCCL's interface lists (core/nccl.py) against interface sets, form by form, as NCCL's
own code reads them (the module's docstring cites it): exclusion, exact names, prefixes,
lists, ports, unset with and without ib*, and the values the agent refuses (64)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mpi_bootstrap.core import nccl
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError
from tests.support.machine import HOST

POD = ("lo", "eth0", "net1")  # the test cluster's pods, in NCCL's order
MULTI = ("lo", "eth0", "docker0", "net1", "net10", "net2", "virbr0")
IB = ("lo", "eth0", "ib0", "ib1", "net1")


class TestSocketIfname:
    """Which interfaces NCCL takes for each form of NCCL_SOCKET_IFNAME."""

    @pytest.mark.parametrize(
        ("value", "names", "taken"),
        [
            ("^lo,docker0", POD, ("eth0", "net1")),
            ("^lo,docker", MULTI, ("eth0", "net1", "net10", "net2", "virbr0")),
            ("^lo,eth", POD, ("net1",)),
            ("^=lo,eth0", MULTI, ("docker0", "net1", "net10", "net2", "virbr0")),
            ("=net1", POD, ("net1",)),
            ("=net1", MULTI, ("net1",)),  # exact: not net10
            ("net1", MULTI, ("net1", "net10")),  # a prefix takes net10 too
            ("net", POD, ("net1",)),
            ("net", MULTI, ("net1", "net10", "net2")),
            ("net2,eth", MULTI, ("eth0", "net2")),  # NCCL's order, not the list's
            ("=net2,net1", MULTI, ("net1", "net2")),
            ("eth0:1", POD, ("eth0",)),  # a port means nothing for interfaces
            ("=net1:7", POD, ("net1",)),
            ("ib", POD, ()),
            ("=net", POD, ()),
            ("^lo,eth0,net1", POD, ()),
        ],
    )
    def test_forms(self, value: str, names: tuple[str, ...], taken: tuple[str, ...]) -> None:
        """Exclusion, exact, prefixes, lists and ports select what NCCL selects."""
        assert nccl.Rule(value, "test").select(names)[0] == taken

    def test_at_most_sixteen(self) -> None:
        """NCCL's socket transport takes at most MAX_IFS (16) interfaces, the first ones."""
        names = tuple(f"net{i}" for i in range(20))
        assert nccl.parse("net").select(names) == names[:16]

    @pytest.mark.parametrize(
        ("names", "taken", "step"),
        [
            (IB, ("ib0", "ib1"), "ib* first"),
            (POD, ("eth0", "net1"), "every interface but docker*, lo*, virbr*"),
            (MULTI, ("eth0", "net1", "net10", "net2"), "every interface but"),
            (("lo", "docker0"), ("docker0",), "docker*"),
            (("lo",), ("lo",), "lo*"),
            ((), (), "no interface at all"),
        ],
    )
    def test_unset(self, names: tuple[str, ...], taken: tuple[str, ...], step: str) -> None:
        """Unset, NCCL takes ib*, else any but docker*/lo*/virbr*, else docker*, else lo*."""
        got, why = nccl.unset_rule(names)
        assert got == taken
        assert step in why and "unset" in why

    @pytest.mark.parametrize("value", ["", "x", "^"])
    def test_one_character_is_unset(self, value: str) -> None:
        """NCCL reads NCCL_SOCKET_IFNAME only when longer than one character."""
        assert nccl.given({"NCCL_SOCKET_IFNAME": value}) is None
        assert nccl.problems({"NCCL_SOCKET_IFNAME": value}) == []

    def test_described(self) -> None:
        """--explain says the form in words."""
        assert nccl.parse("^lo,docker0").describe() == "every one but lo*, docker0*"
        assert nccl.parse("=net1").describe() == "exactly net1"
        assert nccl.parse("net").describe() == "those named net*"


class TestMalformed:
    """A value NCCL would read otherwise than written is refused, naming the variable."""

    @pytest.mark.parametrize(
        ("value", "why"),
        [
            ("net1,,net2", "empty entry"),
            ("net1,", "empty entry"),
            (",net1", "empty entry"),
            (":1", "empty entry"),
            ("^=", "no name"),
            ("^,", "empty entry"),
            ("averyveryverylongname0", "longer than any interface name"),
            ("net1:x", "port"),
            ("net 1", "not an interface name"),
            (" net1", "not an interface name"),
            ("net1;id", "not an interface name"),
        ],
    )
    def test_refused(self, value: str, why: str) -> None:
        """Empty entries, over-long names, bad ports, other characters: a ValueError."""
        with pytest.raises(ValueError, match=why) as info:
            nccl.parse(value)
        assert str(info.value).startswith(f"NCCL_SOCKET_IFNAME={value!r}")

    @pytest.mark.parametrize(
        ("variable", "value"), [("NCCL_SOCKET_IFNAME", "net1,,net2"), ("NCCL_IB_HCA", "mlx5_0,")]
    )
    def test_config_exits_64(self, variable: str, value: str) -> None:
        """Config refuses the value (exit 64), naming the variable."""
        env = {"MPI_BOOTSTRAP_EXCHANGE": "none", variable: value}
        with pytest.raises(ConfigError) as info:
            Config.from_env(env, ["launcher", "--", "true"], host=HOST)
        assert any(p.startswith(f"{variable}=") for p in info.value.problems)

    def test_hca_names_may_be_long(self) -> None:
        """An RDMA device name may be longer than an interface name (63 characters)."""
        assert nccl.parse("=" + "m" * 63, nccl.IB_HCA).entries == (("m" * 63, None),)
        with pytest.raises(ValueError, match="RDMA device"):
            nccl.parse("m" * 64, nccl.IB_HCA)


class TestIbHca:
    """NCCL_IB_HCA's forms map to RDMA devices as NCCL maps them."""

    DEVICES = ("mlx5_0", "mlx5_1", "mlx5_10", "mlx5_3")

    @pytest.mark.parametrize(
        ("value", "taken"),
        [
            ("mlx5_1", ("mlx5_1", "mlx5_10")),
            ("=mlx5_1", ("mlx5_1",)),
            ("mlx5_0:1,mlx5_3:2", ("mlx5_0", "mlx5_3")),
            ("=mlx5_0:1", ("mlx5_0",)),
            ("^mlx5_1", ("mlx5_0", "mlx5_3")),
            ("^=mlx5_1", ("mlx5_0", "mlx5_10", "mlx5_3")),
            ("mlx4", ()),
            ("", DEVICES),
        ],
    )
    def test_forms(self, value: str, taken: tuple[str, ...]) -> None:
        """Prefix, exact, ports, exclusion, none, and the empty list (every device)."""
        assert nccl.hca_select(value, self.DEVICES) == taken

    def test_ports(self) -> None:
        """A port in the list must be the device's port, when both are known."""
        spec = nccl.parse("mlx5_0:1", nccl.IB_HCA)
        assert spec.matches("mlx5_0", 1) and not spec.matches("mlx5_0", 2)
        assert spec.matches("mlx5_0")

    def test_written_form_round_trips(self) -> None:
        """What the agent writes selects exactly the devices it names, and no neighbour."""
        value = nccl.ib_hca(["mlx5_1", "mlx5_0", "mlx5_1"])
        assert value == "=mlx5_0,mlx5_1"
        assert nccl.hca_select(value, self.DEVICES) == ("mlx5_0", "mlx5_1")


class TestRule:
    """What the ranks are told: the user's value, else the agent's data NIC, else unset."""

    def test_users_value_wins(self) -> None:
        """The user's NCCL_SOCKET_IFNAME is what NCCL reads, whatever else is set."""
        r = nccl.rule("net1", {"NCCL_SOCKET_IFNAME": "^lo,docker0"}, POD, ("net1",))
        assert (r.value, r.by_agent) == ("^lo,docker0", False)
        assert "MPI_BOOTSTRAP_DATA_IFACE=net1 is not what NCCL reads" in r.why

    def test_agent_pins_the_data_nic_exactly(self) -> None:
        """Unset, the agent names the first data NIC present, exactly (not net10)."""
        r = nccl.rule(None, {}, MULTI, ("net1", "dranet0"))
        assert (r.value, r.by_agent) == ("=net1", True)
        assert r.select(MULTI)[0] == ("net1",)
        assert nccl.rule("net2", {}, MULTI, ("net1",)).value == "=net2"

    def test_unset_without_a_data_nic(self) -> None:
        """Neither set nor a data NIC present: NCCL's own rule, and --explain says so."""
        r = nccl.rule(None, {}, IB, ("net2", "dranet0"))
        assert r.value is None
        assert r.select(IB) == (
            ("ib0", "ib1"),
            "NCCL_SOCKET_IFNAME unset: NCCL's own rule, ib* first",
        )


PACKAGE = Path(__file__).parent.parent / "mpi_bootstrap"


def test_only_the_chooser_reads_the_nccl_lists() -> None:
    """No module but core/nccl.py names NCCL_SOCKET_IFNAME or NCCL_IB_HCA as a string of
    its own (a key to read or set): the others use nccl.SOCKET_IFNAME / nccl.IB_HCA."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "core" / "nccl.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in (nccl.SOCKET_IFNAME, nccl.IB_HCA):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
