"""Container engines for the image and compose tests, each private to the test and wiped
afterwards: podman with its own storage and runtime directory, and Docker Engine (dockerd
with its own --data-root, --exec-root and socket, no iptables, stopped by its pid file).

No registry is reachable, so the base image is made with debootstrap and tagged with the
public name container/Dockerfile's FROM uses; the agent and demo images are built from
the repository the way README "Use it in your image" says.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import resources
from tests.support.interrupt import shielded

ROOT = Path(__file__).resolve().parents[2]  # the repository
BASE = "docker.io/library/debian:bookworm-slim"
AGENT = "localhost/mpi-bootstrap:latest"
DEMO = "localhost/mpi-bootstrap-demo:latest"
ROOTFS_CACHE = ROOT / ".cache" / "debian-bookworm-minbase.tar"
COMPOSE_FILE = str(ROOT / "container" / "docker-compose.yml")
PODMAN_COMPOSE = str(ROOT / ".venv" / "bin" / "podman-compose")
DOCKER = "/usr/bin/docker"  # Debian's docker.io client (its daemon's API version)
DOCKERD = "/usr/sbin/dockerd"


class Engine:
    """One engine's command line, its compose, and a project name of its own."""

    name = "engine"

    def __init__(
        self, argv: list[str], compose: list[str], env: dict[str, str], project: str
    ) -> None:
        self.argv, self.compose_argv, self.env, self.project = argv, compose, env, project

    def container(self, service: str) -> str:
        """The container compose made for `service`."""
        return f"{self.project}_{service}_1"

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 600, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.argv, *args],
            env=self.env,
            capture_output=True,
            text=input is None,
            input=input,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{self.name} {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout}\n{done.stderr}"
            )
        return done  # type: ignore[return-value]

    def compose(
        self,
        *args: str,
        files: tuple[str, ...] = (),
        timeout: float = 600,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        fs = [x for f in (COMPOSE_FILE, *files) for x in ("-f", f)]
        return subprocess.run(
            [*self.compose_argv, *fs, "-p", self.project, *args],
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def processes(self, container: str) -> str:
        """The command names of the processes in `container`."""
        return self("top", container, *self.top_args, check=False).stdout

    top_args: tuple[str, ...] = ("comm",)

    def build(self, dockerfile: str, tag: str, *build_args: str, context: str = str(ROOT)) -> None:
        self("build", "-q", "-f", dockerfile, "-t", tag, *build_args, context)

    def load_images(self) -> None:
        """The base (from debootstrap), the agent image and the demo image."""
        with open(base_rootfs(), "rb") as fh:
            self("import", "-", BASE, input=fh.read())
        self.build(str(ROOT / "container" / "Dockerfile"), AGENT)
        self.build(str(ROOT / "container" / "Dockerfile.demo"), DEMO)


class Podman(Engine):
    name = "podman"


class Docker(Engine):
    name = "docker"
    top_args = ("-o", "pid,comm")  # docker top needs the PID column

    def build(self, dockerfile: str, tag: str, *build_args: str, context: str = str(ROOT)) -> None:
        # Docker's builder reaches the package registries through the host's network.
        self("build", "-q", "--network", "host", "-f", dockerfile, "-t", tag, *build_args, context)


def base_rootfs() -> Path:
    """A Debian bookworm minbase, as the public image has it (no Python): debootstrap
    once per machine, kept in .cache/ as a tarball."""
    if ROOTFS_CACHE.exists():
        return ROOTFS_CACHE
    ROOTFS_CACHE.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpib-deboot-") as d:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "bookworm",
                f"{d}/root",
                "http://deb.debian.org/debian",
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        tmp = ROOTFS_CACHE.with_suffix(".tmp")
        subprocess.run(["tar", "-C", f"{d}/root", "-cf", str(tmp), "."], check=True)
        tmp.rename(ROOTFS_CACHE)
    return ROOTFS_CACHE


_WHEELHOUSE_MADE = False


def wheelhouse() -> None:
    """The agent and its dependencies as wheels for every supported CPython, for
    container/Dockerfile's offline install: `make wheelhouse`'s own script, once a session
    (it also checks that each Python resolves from it alone)."""
    global _WHEELHOUSE_MADE  # noqa: PLW0603 - once per test session
    resources.need("container", "the wheelhouse")
    if _WHEELHOUSE_MADE:
        return
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "container" / "wheelhouse.py")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _WHEELHOUSE_MADE = True


def _project(store: Path) -> str:
    # A project of its own per session: podman's DNS (aardvark) keeps its records outside
    # our private storage, by network name, so a reused name could answer with an
    # address of an earlier run.
    return f"mpibt{store.name[-8:].lower().replace('_', '')}"


def _unmount_below(root: Path) -> None:
    """Every mount below `root` (an engine's layers), deepest first."""
    mounts = [
        ln.split()[1]
        for ln in Path("/proc/mounts").read_text().splitlines()
        if ln.split()[1].startswith(str(root))
    ]
    for mount in sorted(mounts, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)


@contextlib.contextmanager
def podman_session() -> Iterator[Podman]:
    """A private podman storage and runtime directory with the base, agent and demo
    images; wiped on exit."""
    resources.need("container", "podman")
    store = Path(tempfile.mkdtemp(prefix="mpib-podman-"))
    (store / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/root"\nrunroot = "{store}/run"\n'
    )
    # libpod's runtime directory (tmp_dir: /run/libpod, the machine's, by default) of its
    # own too, so that another session's podman, or the machine's, shares nothing with it.
    conf = (ROOT / "tests" / "support" / "podman" / "containers.conf").read_text()
    (store / "containers.conf").write_text(
        conf.replace("[engine]\n", f'[engine]\ntmp_dir = "{store}/tmp"\n', 1)
    )
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(store / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(store / "storage.conf"),
    }
    pm = Podman(["podman"], [PODMAN_COMPOSE], env, _project(store))
    try:
        wheelhouse()
        pm.load_images()
        yield pm
    finally:
        with shielded():  # a second signal must not leave the storage half-removed
            _podman_down(pm, store)


def _podman_down(pm: Podman, store: Path) -> None:
    """What the session made, removed by name. Not `podman system reset`: that removes
    every network of the network directory, which is the machine's (/etc/containers/
    networks: podman picks a free subnet and bridge among all of them), and so another
    session's compose network while its job runs."""
    pm.compose("down", "-v", timeout=120)
    pm("pod", "rm", "--all", "--force", check=False, timeout=300)
    pm("rm", "--all", "--force", check=False, timeout=300)
    pm("volume", "rm", "--all", "--force", check=False, timeout=120)
    for net in pm("network", "ls", "--format", "{{.Name}}", check=False).stdout.split():
        if net.startswith(pm.project):
            pm("network", "rm", "--force", net, check=False, timeout=120)
    pm("rmi", "--all", "--force", check=False, timeout=300)
    _unmount_below(store)
    shutil.rmtree(store, ignore_errors=True)


@contextlib.contextmanager
def docker_session() -> Iterator[Docker]:
    """A dockerd private to the test — its own data root, exec root and socket, no
    iptables rules, no default bridge — with the base, agent and demo images; on exit
    the project is taken down, dockerd is stopped by its pid file, and its directory
    (mounts included) is removed."""
    resources.need("container", "Docker Engine")
    root = Path(tempfile.mkdtemp(prefix="mpib-docker-"))
    sock = root / "docker.sock"
    pidfile = root / "dockerd.pid"
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}"}
    env.pop("DOCKER_CONFIG", None)
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - closed in the finally below
    daemon = subprocess.Popen(
        [
            DOCKERD,
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "-H",
            f"unix://{sock}",
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
            "--pidfile",
            str(pidfile),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    dk = Docker([DOCKER], ["docker-compose"], env, _project(root))
    try:
        deadline = time.monotonic() + 60
        while dk("info", check=False, timeout=30).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "dockerd did not start:\n" + (root / "dockerd.log").read_text()[-3000:]
                )
            time.sleep(0.2)
        wheelhouse()
        dk.load_images()
        yield dk
    finally:
        with shielded():  # a second signal must not leave dockerd or its mounts behind
            with contextlib.suppress(Exception):
                dk.compose("down", "-v", timeout=120)
                dk("system", "prune", "-af", "--volumes", check=False, timeout=300)
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)  # our dockerd, by the PID we started
                try:
                    daemon.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
            log.close()
            _unmount_below(root)
            shutil.rmtree(root, ignore_errors=True)
