"""What a test may use beyond plain Python, and the tier it is in, derived from its fixtures.

Each privileged resource is a fixture of its own name (tests/conftest.py), and a test's
marker of that name comes from its fixtures alone (`markers`, called by conftest's
`pytest_collection_modifyitems`): a test that uses none is `unit`, and `make test-unit`
runs those as an unprivileged user. No marker is kept by hand, so none can disagree with
what the test does: the helpers that make a resource (`Netns`, `Cluster`, `Dnsmasq`,
tests/support/pid1.py's PID namespace, the container engines, a real MPI's programs) call
`need`, which fails a test that did not ask for its fixture, naming the fixture.
Outside a test (the benchmarks, `make demo`) everything is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable

# The resources, each a fixture and a marker of this name (pytest --markers lists them).
# A fixture that needs another asks for it: `netns` asks for `root`, so a netns test is
# also a root test, and `unit` is what asks for none of these.
RESOURCES = {
    "root": "needs root: PID namespaces, sshd, other users (uid 1000), directories under /run",
    "netns": "builds network namespaces (root and iproute2): the `pod` and `cluster` fixtures",
    "dnsmasq": "starts a real dnsmasq in a private network namespace (a cluster with DNS)",
    "realmpi": "runs or builds for a real MPI of tests/conftest.py REAL_MPIS (Debian's Open MPI"
    " 4, the venvs of `make mpi-venvs`)",
    "container": "builds images or runs containers (podman, Docker Engine), or the wheelhouse",
}
# Two tiers need none of them, and so no root: the fuzzers (tests/support/strategies.py
# `fuzz`, ~40 s of hypothesis examples in all), and the rest, `unit`.
FUZZ = "fuzz"
FUZZ_HELP = "a hypothesis fuzzer (tests/support/strategies.py `fuzz`): no resource, any user"
FUZZER = "mpib_fuzzer"  # the attribute `fuzz` sets on the test function
UNIT = "unit"
UNIT_HELP = "no resource and no fuzzer: runs as any user, in seconds (`make test-unit`)"
TIERS = {**RESOURCES, FUZZ: FUZZ_HELP, UNIT: UNIT_HELP}


class Unasked(AssertionError):
    """A test reached a resource whose fixture it did not ask for."""


_granted: frozenset[str] | None = None  # None: not inside a test


def markers(fixturenames: Iterable[str], fuzzer: bool) -> list[str]:
    """The markers of a test that uses the fixtures `fixturenames` (their closure), and is
    a fuzzer or not."""
    names = set(fixturenames)
    found = [r for r in RESOURCES if r in names] + ([FUZZ] if fuzzer else [])
    return found or [UNIT]


def grant(resources: Iterable[str] | None) -> None:
    """The resources the running test asked for (None once no test runs)."""
    global _granted  # noqa: PLW0603 - one test runs at a time
    _granted = None if resources is None else frozenset(resources)


def need(resource: str, what: str) -> None:
    """Fail the running test if it did not ask for `resource`: it would be marked wrong
    (`make test-unit` would run a test that needs root, or `-m netns` would miss it)."""
    assert resource in RESOURCES, resource
    if _granted is not None and resource not in _granted:
        raise Unasked(
            f"{what} needs the `{resource}` fixture, which this test did not ask for: take it "
            f"as an argument (or `@pytest.mark.usefixtures({resource!r})`), so that the test "
            f"is marked `{resource}` ({RESOURCES[resource]})"
        )


# Under pytest-xdist (`make test`: two workers, `--dist loadgroup`), the tests of a group
# run on one worker, one after the other: the container tier (its images are built once
# per session of a worker), and the modules whose tests share an expensive fixture of
# module or class scope, built once there instead of on each worker.
SHARED = ("tests/test_datacheck_attacks.py", "tests/test_realmpi.py", "tests/test_mpi.py")
# Tests that measure time against a bound (a lost worker named within it, a silent
# launcher after it, launches in a row): one after another on one worker, never two of
# them beside each other on this 2-core machine's two workers.
TIMING = ("tests/test_liveness.py", "tests/test_soak.py")


def group(nodeid: str, container: object) -> str | None:
    """The xdist group of a test (None: any worker)."""
    if container is not None:
        return "container"
    module = nodeid.split("::", 1)[0]
    if module in TIMING:
        return "timing"
    return module if module in SHARED else None
