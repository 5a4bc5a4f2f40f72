"""Container images and the compose simulation, built and run here with podman and with
Docker Engine, from the same compose file (`make compose-test`; part of `make test`).

Each engine is private to the test and wiped at the end (tests/support/engines.py): no
image, container, volume or network of this test outlives it, and nothing of the
machine's own podman storage or Docker installation is touched.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engines import (
    BASE,
    DEMO,
    DOCKER,
    DOCKERD,
    PODMAN_COMPOSE,
    ROOT,
    Engine,
    docker_session,
    podman_session,
)
from tests.support.wait import wait_until

pytestmark = [pytest.mark.timeout(900)]

USERBASE = "localhost/mpib-test-userbase:latest"  # "your MPI image": python3 and a package
FOREIGN = "localhost/mpib-test-foreign:latest"


@pytest.fixture(scope="module", params=["podman", "docker"])
def engine(request: pytest.FixtureRequest, container: None) -> Iterator[Engine]:
    """Each engine in turn, with the base, agent and demo images built."""
    import shutil

    if request.param == "podman":
        if shutil.which("podman") is None or not Path(PODMAN_COMPOSE).exists():
            pytest.fail("podman / podman-compose missing: `make system-deps install` installs them")
        with podman_session() as pm:
            yield pm
    else:
        if not (
            Path(DOCKER).exists() and Path(DOCKERD).exists() and shutil.which("docker-compose")
        ):
            pytest.fail(
                "Docker Engine missing: `make system-deps` installs docker.io and docker-compose"
            )
        with docker_session() as dk:
            yield dk


# Each look is an `exec` into a container, a process of its own in the engine: they are
# spaced out this much (not POLL_S) on this 2-core machine.
EXEC_POLL_S = 0.2


def worker_ready(engine: Engine, name: str, timeout: float = 60) -> None:
    wait_until(
        lambda: engine("exec", name, "mpi-bootstrap", "probe", check=False).returncode == 0,
        timeout,
        f"{name} to be ready (its probe to pass)",
        interval=EXEC_POLL_S,
    )


class TestCompose:
    """`compose up` runs a real MPI job; the launcher's exit code is the job's."""

    def test_job_completes_with_agent_as_pid1(self, engine: Engine) -> None:
        """`compose up` runs the job on both workers with the agent as PID 1 and every container
        exiting 0; a second job on the kept volume gets a new key, not the first's job-done."""
        done = engine.compose("up", "--exit-code-from", "launcher")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        oks = [ln for ln in out.splitlines() if "allreduce sum 10 (expected 10) OK" in ln]
        assert len(oks) == 4, out[-4000:]
        assert {h for h in ("demo-worker-0", "demo-worker-1") if any(h in ln for ln in oks)} == {
            "demo-worker-0",
            "demo-worker-1",
        }
        # the agent, not a shell, was PID 1 of every container: the supervisor says so by
        # never logging "subreaper" (it only does that when it is not PID 1)
        assert '"event": "subreaper"' not in out
        for c in map(engine.container, ("launcher", "worker-0", "worker-1")):
            state = json.loads(engine("inspect", c).stdout)[0]["State"]
            assert state["ExitCode"] == 0, (c, state)
        # A second job on the same `exchange` volume (`down` keeps volumes): it must not
        # adopt the first job's key nor stop on its job-done (SECURITY.md promise 19).
        first = job_done(engine)
        engine.compose("down", timeout=120)
        again = engine.compose("up", "--exit-code-from", "launcher")
        out = again.stdout + again.stderr
        assert again.returncode == 0, out[-4000:]
        assert out.count("allreduce sum 10 (expected 10) OK") == 4, out[-4000:]
        second = job_done(engine)
        assert first.startswith("done SHA256:") and second.startswith("done SHA256:")
        assert first != second  # a new job, a new key
        engine.compose("down", "-v", timeout=120)

    def test_stop_launcher_mid_job(self, engine: Engine) -> None:
        """`stop` of the launcher ends the job: 143; the workers then exit 0."""
        env = {"DEMO_PROGRAM": "/opt/demo/sleep-job"}
        up = engine.compose("up", "-d", extra_env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        workers = [engine.container("worker-0"), engine.container("worker-1")]
        for w in workers:
            worker_ready(engine, w)
            assert "mpi_bootstrap" in engine("exec", w, "cat", "/proc/1/cmdline").stdout
        launcher = engine.container("launcher")
        wait_until(
            lambda: all("sleep" in engine.processes(w) for w in workers),
            120,
            lambda: f"the ranks to start: {engine('logs', launcher).stderr}",
            interval=EXEC_POLL_S,
        )
        assert "mpi_bootstrap" in engine("exec", launcher, "cat", "/proc/1/cmdline").stdout
        engine("stop", "-t", "30", launcher)
        state = json.loads(engine("inspect", launcher).stdout)[0]["State"]
        assert state["ExitCode"] == 143, state
        for w in workers:
            assert "sleep" not in engine.processes(w)
            engine("stop", "-t", "30", w)
            state = json.loads(engine("inspect", w).stdout)[0]["State"]
            assert state["ExitCode"] == 0, (w, state)
        engine.compose("down", "-v", timeout=120)


def job_done(engine: Engine) -> str:
    """What the last job wrote to `job-done` in the compose project's exchange volume."""
    return engine(
        "run",
        "--rm",
        "-v",
        f"{engine.project}_exchange:/x",
        "--entrypoint",
        "cat",
        DEMO,
        "/x/job-done",
    ).stdout


# An image built the way ML images are: single-node Open MPI settings in its environment
# (what an Ubuntu 24.04 CUDA/PyTorch image sets), the program only in a venv that ENV PATH
# puts first, and a non-root user.
FOREIGN_DOCKERFILE = f"""FROM {DEMO}
ENV OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none PMIX_MCA_gds=hash
RUN python3 -m venv /opt/venv && useradd -m -u 1000 mluser
ENV PATH=/opt/venv/bin:$PATH
USER mluser
"""
# Each rank says where `python3` took it: the venv's, on every pod.
RANK = (
    "import os, sys; print('RANK', os.environ['OMPI_COMM_WORLD_RANK'], "
    "os.uname().nodename, sys.prefix, flush=True)"
)


def test_foreign_image_job_passes_unchanged(engine: Engine) -> None:
    """The image, unchanged, runs a job across its containers: the agent overrides
    OMPI_MCA_plm=isolated, keeps the ranks on the venv's python3, and runs as the image's
    user (the `net` exchange: no volume the user could not write)."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "Dockerfile").write_text(FOREIGN_DOCKERFILE)
        engine.build(str(Path(d, "Dockerfile")), FOREIGN, context=d)
        token = "tok-" + secrets.token_hex(16)
        env = {"MPI_BOOTSTRAP_EXCHANGE": "net", "MPI_BOOTSTRAP_TOKEN": token}
        services = {
            name: {"image": FOREIGN, "environment": env}
            for name in ("worker-0", "worker-1", "launcher")
        }
        services["launcher"]["command"] = ["mpirun", "-np", "4", "python3", "-c", RANK]
        override = Path(d, "foreign.yml")
        override.write_text(json.dumps({"services": services}))  # JSON is YAML
        done = engine.compose("up", "--exit-code-from", "launcher", files=(str(override),))
        out = done.stdout + done.stderr
        engine.compose("down", "-v", files=(str(override),), timeout=120)
    assert done.returncode == 0, out[-4000:]
    ranks = sorted(
        ln.split("RANK ", 1)[1].split()
        for ln in out.splitlines()
        if "RANK " in ln and "/opt/venv" in ln
    )
    assert [r[0] for r in ranks] == ["0", "1", "2", "3"], out[-4000:]
    assert {r[1] for r in ranks} == {"demo-worker-0", "demo-worker-1"}
    assert {r[2] for r in ranks} == {"/opt/venv"}
    assert '"--mca", "plm", "rsh"' in out  # the image's plm=isolated, overridden


def test_agent_venv_leaves_the_image_python_alone(engine: Engine) -> None:
    """Layered on an image with its own Python, the agent changes neither its sys.path
    nor its importable packages."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "Dockerfile").write_text(
            f"FROM {BASE}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get "
            "install -y --no-install-recommends python3 python3-venv python3-yaml && "
            "rm -rf /var/lib/apt/lists/*\n"
        )
        engine.build(str(Path(d, "Dockerfile")), USERBASE, context=d)
    engine.build(
        str(ROOT / "container" / "Dockerfile"),
        "localhost/mpib-test-layered:latest",
        "--build-arg",
        f"BASE_IMAGE={USERBASE}",
    )
    probe = (
        "import sys, pkgutil; print(sys.path); "
        "print(sorted(m.name for m in pkgutil.iter_modules()))"
    )
    before = engine("run", "--rm", "--entrypoint", "python3", USERBASE, "-c", probe).stdout
    after = engine(
        "run", "--rm", "--entrypoint", "python3", "localhost/mpib-test-layered:latest", "-c", probe
    ).stdout
    assert before == after
    assert "yaml" in before
    version = engine("run", "--rm", "localhost/mpib-test-layered:latest", "--version").stdout
    assert version.startswith("mpi-bootstrap ")
