"""Tests that reach a resource without asking for its fixture, for tests/test_resources.py,
which runs them in a pytest session of its own (their file's name keeps the suite from
collecting them): each must fail at once, naming the fixture it should have asked for,
before it touches anything (so also as a user who could not make the resource), and the
one that asked must pass."""

from __future__ import annotations

from tests.conftest import REAL_MPIS, RealMPI
from tests.support import engines, pid1
from tests.support.cluster import Cluster
from tests.support.dnsmasq import Dnsmasq
from tests.support.netns import Netns


def test_cluster() -> None:
    Cluster(["a"])


def test_netns() -> None:
    Netns("mpib-unasked")


def test_dnsmasq() -> None:
    Dnsmasq(None)  # type: ignore[arg-type]


def test_pid_namespace() -> None:
    pid1.run("true")


def test_mpi() -> None:
    assert REAL_MPIS["openmpi4"].mpirun


def test_wheelhouse() -> None:
    engines.wheelhouse()


def test_podman() -> None:
    with engines.podman_session():
        pass


def test_mpi_asked(realmpi: dict[str, RealMPI]) -> None:
    assert realmpi["openmpi4"].mpirun == "/usr/bin/mpirun"
