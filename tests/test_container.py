"""Container images and the compose simulation, built and run here with podman (`make
compose-test`; part of `make test`).

No registry is reachable, so the base image is made with debootstrap and tagged with the
public name container/Dockerfile's FROM uses. Everything runs in a private podman
storage (CONTAINERS_STORAGE_CONF → a temporary graphroot), which is wiped at the end:
no image, container, volume or network of this test outlives it, and nothing of the
machine's own podman storage is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
BASE = "docker.io/library/debian:bookworm-slim"
USERBASE = "localhost/mpib-test-userbase:latest"  # "your MPI image": python3 and a package
AGENT = "localhost/mpi-bootstrap:latest"
DEMO = "localhost/mpi-bootstrap-demo:latest"
ROOTFS_CACHE = ROOT / ".cache" / "debian-bookworm-minbase.tar"
COMPOSE = str(ROOT / ".venv" / "bin" / "podman-compose")
COMPOSE_FILE = str(ROOT / "container" / "docker-compose.yml")


class Podman:
    def __init__(self, env: dict[str, str], project: str) -> None:
        self.env = env
        # A project of its own per session: podman's DNS (aardvark) keeps its records
        # outside our private storage, by network name, so a reused name could answer
        # with an address of an earlier run.
        self.project = project

    def container(self, service: str) -> str:
        """The container podman-compose made for `service`."""
        return f"{self.project}_{service}_1"

    def __call__(self, *args: str, check: bool = True, timeout: float = 600,
                 input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True,
                              text=input is None, input=input, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done  # type: ignore[return-value]

    def compose(self, *args: str, timeout: float = 600, extra_env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([COMPOSE, "-f", COMPOSE_FILE, "-p", self.project, *args],
                              env={**self.env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=timeout, check=False)


def base_rootfs() -> Path:
    """A Debian bookworm minbase, as the public image has it (no Python): debootstrap
    once per machine, kept in .cache/ as a tarball."""
    if ROOTFS_CACHE.exists():
        return ROOTFS_CACHE
    ROOTFS_CACHE.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpib-deboot-") as d:
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", f"{d}/root",
                        "http://deb.debian.org/debian"], check=True, capture_output=True,
                       timeout=900)
        tmp = ROOTFS_CACHE.with_suffix(".tmp")
        subprocess.run(["tar", "-C", f"{d}/root", "-cf", str(tmp), "."], check=True)
        tmp.rename(ROOTFS_CACHE)
    return ROOTFS_CACHE


@contextlib.contextmanager
def session() -> Iterator[Podman]:
    """A private podman storage with the base, agent and demo images; wiped on exit."""
    store = Path(tempfile.mkdtemp(prefix="mpib-podman-"))
    (store / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/root"\n'
        f'runroot = "{store}/run"\n')
    env = {**os.environ,
           "CONTAINERS_CONF": str(ROOT / "tests" / "support" / "podman" / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(store / "storage.conf")}
    pm = Podman(env, f"mpibt{store.name[-8:].lower().replace('_', '')}")
    try:
        with open(base_rootfs(), "rb") as fh:
            pm("import", "-", BASE, input=fh.read())
        subprocess.run([str(ROOT / ".venv" / "bin" / "pip"), "wheel", "-q", "--wheel-dir",
                        str(ROOT / "container" / "wheelhouse"), str(ROOT)], check=True,
                       capture_output=True, timeout=600)
        pm("build", "-q", "-f", str(ROOT / "container" / "Dockerfile"), "-t", AGENT, str(ROOT))
        pm("build", "-q", "-f", str(ROOT / "container" / "Dockerfile.demo"), "-t", DEMO,
           str(ROOT))
        yield pm
    finally:
        pm.compose("down", "-v", timeout=120)
        pm("system", "reset", "--force", check=False, timeout=300)
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    if shutil.which("podman") is None or not os.access(COMPOSE, os.X_OK):
        pytest.fail("podman / podman-compose missing: `make system-deps install` installs them")
    with session() as pm:
        yield pm


def worker_ready(pm: Podman, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while pm("exec", name, "mpi-bootstrap", "probe", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{name} never became ready"
        time.sleep(0.2)


class TestCompose:
    """`compose up` runs a real MPI job; the launcher's exit code is the job's."""

    def test_job_completes_with_agent_as_pid1(self, podman: Podman) -> None:
        done = podman.compose("up", "--exit-code-from", "launcher")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        oks = [ln for ln in out.splitlines() if "allreduce sum 10 (expected 10) OK" in ln]
        assert len(oks) == 4, out[-4000:]
        assert {h for h in ("demo-worker-0", "demo-worker-1") if any(h in ln for ln in oks)} \
            == {"demo-worker-0", "demo-worker-1"}
        # the agent, not a shell, was PID 1 of every container: the supervisor says so by
        # never logging "subreaper" (it only does that when it is not PID 1)
        assert '"event": "subreaper"' not in out
        for c in map(podman.container, ("launcher", "worker-0", "worker-1")):
            state = json.loads(podman("inspect", c).stdout)[0]["State"]
            assert state["ExitCode"] == 0, (c, state)
        # A second job on the same `exchange` volume (`down` keeps volumes): it must not
        # adopt the first job's key nor stop on its job-done (SECURITY.md promise 19).
        first = podman("run", "--rm", "-v", f"{podman.project}_exchange:/x",
                       "--entrypoint", "cat", DEMO, "/x/job-done").stdout
        podman.compose("down", timeout=120)
        again = podman.compose("up", "--exit-code-from", "launcher")
        out = again.stdout + again.stderr
        assert again.returncode == 0, out[-4000:]
        assert out.count("allreduce sum 10 (expected 10) OK") == 4, out[-4000:]
        second = podman("run", "--rm", "-v", f"{podman.project}_exchange:/x",
                        "--entrypoint", "cat", DEMO, "/x/job-done").stdout
        assert first.startswith("done SHA256:") and second.startswith("done SHA256:")
        assert first != second  # a new job, a new key
        podman.compose("down", "-v", timeout=120)

    def test_stop_launcher_mid_job(self, podman: Podman) -> None:
        """`podman stop` of the launcher ends the job: 143; the workers then exit 0."""
        env = {"DEMO_PROGRAM": "/opt/demo/sleep-job"}
        up = podman.compose("up", "-d", extra_env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        for w in (podman.container("worker-0"), podman.container("worker-1")):
            worker_ready(podman, w)
            assert "mpi_bootstrap" in podman("exec", w, "cat", "/proc/1/cmdline").stdout
        deadline = time.monotonic() + 120
        while not all("sleep" in podman("top", w, "comm", check=False).stdout
                      for w in (podman.container("worker-0"), podman.container("worker-1"))):
            assert time.monotonic() < deadline, podman("logs", podman.container("launcher")).stderr
            time.sleep(0.5)
        assert "mpi_bootstrap" in podman("exec", podman.container("launcher"), "cat",
                                         "/proc/1/cmdline").stdout
        podman("stop", "-t", "30", podman.container("launcher"))
        launcher = json.loads(podman("inspect", podman.container("launcher")).stdout)[0]["State"]
        assert launcher["ExitCode"] == 143, launcher
        for w in (podman.container("worker-0"), podman.container("worker-1")):
            assert "sleep" not in podman("top", w, "comm", check=False).stdout
            podman("stop", "-t", "30", w)
            state = json.loads(podman("inspect", w).stdout)[0]["State"]
            assert state["ExitCode"] == 0, (w, state)
        podman.compose("down", "-v", timeout=120)


def test_agent_venv_leaves_the_image_python_alone(podman: Podman) -> None:
    """Layered on an image with its own Python, the agent changes neither its sys.path
    nor its importable packages."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "Dockerfile").write_text(
            f"FROM {BASE}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get "
            "install -y --no-install-recommends python3 python3-venv python3-yaml && "
            "rm -rf /var/lib/apt/lists/*\n")
        podman("build", "-q", "-t", USERBASE, d)
    podman("build", "-q", "-f", str(ROOT / "container" / "Dockerfile"), "--build-arg",
           f"BASE_IMAGE={USERBASE}", "-t", "localhost/mpib-test-layered:latest", str(ROOT))
    probe = ("import sys, pkgutil; print(sys.path); "
             "print(sorted(m.name for m in pkgutil.iter_modules()))")
    before = podman("run", "--rm", "--entrypoint", "python3", USERBASE, "-c", probe).stdout
    after = podman("run", "--rm", "--entrypoint", "python3",
                   "localhost/mpib-test-layered:latest", "-c", probe).stdout
    assert before == after
    assert "yaml" in before
    version = podman("run", "--rm", "localhost/mpib-test-layered:latest", "--version").stdout
    assert version.startswith("mpi-bootstrap ")
