"""Against the real programs: Debian Open MPI 4.1, and PyPI Open MPI 5, MPICH and Intel MPI,
each from its own venv. The agent detects each from its actual `--version` output and
runs the argv it built on one node inside a private pod namespace.

Ranks on mpirun's own node inherit its whole environment, so a forwarding test there
could not fail. The run therefore targets `node-a`, which the MPI treats as remote: the
agent's unmodified ssh command reaches tests/support/fake-ssh (first on PATH), which runs
the daemon locally in a scrubbed environment, like a fresh ssh session. A rank then has
only what the agent forwarded — and a variable it must not forward is checked absent."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import Pod, RealMPI

pytestmark = [pytest.mark.timeout(180)]


def probes(stdout: str) -> list[dict[str, object]]:
    return [
        json.loads(line[len("PROBE ") :])
        for line in stdout.splitlines()
        if line.startswith("PROBE ")
    ]


def user_env(m: RealMPI, tmp: Path) -> dict[str, str]:
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0",
        "UCX_TLS": "tcp",
        "LD_LIBRARY_PATH": "/opt/probe-lib",
        "FOO_SETTING": "forwarded-by-FORWARD_ENV",
        "OLDPWD": "/must-not-travel",
        "MPI_BOOTSTRAP_FORWARD_ENV": "FOO_*",
        "MPI_BOOTSTRAP_TOKEN": "never-forwarded-token-0123456789",
        # One node through the fake ssh: no key exchange (the cluster tests do that).
        "MPI_BOOTSTRAP_EXCHANGE": "none",
        "HOME": str(tmp),
    }


class TestDetection:
    """--explain --json names the vendor and version each real mpirun reports."""

    def test_detect(self, real_mpi: RealMPI, pod: Pod, tmp_path: Path) -> None:
        """--explain --json reports each real mpirun's vendor and version as detected, and writes no
        hostfile or state directory."""
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("localhost slots=2\n")
        code, out, err = pod.agent(
            "--explain",
            "--json",
            "--hostfile",
            str(hostfile),
            "--output-hostfile",
            str(tmp_path / "out"),
            "--mpirun",
            real_mpi.mpirun,
            "launcher",
            "--",
            "true",
        )
        assert code == 0, err
        plan = json.loads(out)
        assert plan["mpi"]["vendor"] == real_mpi.vendor
        assert plan["mpi"]["version"] == real_mpi.version
        assert plan["mpi"]["source"] == "detected"
        # --explain writes nothing
        assert not (tmp_path / "out").exists()
        assert not (tmp_path / "state").exists()


class TestOneNodeRun:
    """The generated argv is accepted by each MPI and the environment reaches every rank."""

    def _check_ranks(self, out: str, expect_ld: str, *, remote: bool) -> None:
        seen = probes(out)
        assert len(seen) == 2, out
        assert sorted(str(p["rank"]) for p in seen) == ["0", "1"]
        for p in seen:
            env = p["env"]
            assert isinstance(env, dict)
            assert env.get("NCCL_DEBUG") == "INFO"
            assert env.get("NCCL_IB_HCA") == "mlx5_0"
            assert env.get("UCX_TLS") == "tcp"
            assert env.get("NCCL_SOCKET_IFNAME") == "=net1"  # defaulted to exactly the data NIC
            assert env.get("FOO_SETTING") == "forwarded-by-FORWARD_ENV"
            assert expect_ld in env.get("LD_LIBRARY_PATH", "")
            if remote:
                assert "OLDPWD" not in env
                assert "MPI_BOOTSTRAP_TOKEN" not in env
                assert "MPI_BOOTSTRAP_FORWARD_ENV" not in env

    def test_agent_builds_mpirun(
        self, real_mpi: RealMPI, pod: Pod, tmp_path: Path, probe: list[str], fake_ssh_path: str
    ) -> None:
        """Each real MPI accepts the agent's argv: ranks on a 'remote' node get the forwarded
        variables but not OLDPWD or the token, and the hostfile is written in the MPI's form."""
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("# one node\nnode-a slots=2\n")
        env = user_env(real_mpi, tmp_path)
        env["PATH"] = f"{fake_ssh_path}:/usr/local/bin:/usr/bin:/bin"
        if real_mpi.vendor == "openmpi":
            # As MPI Operator sets it: a default hostfile naming the *input* file.
            env["OMPI_MCA_orte_default_hostfile"] = str(hostfile)
        output = tmp_path / "mpi-hostfile"
        code, out, err = pod.agent(
            "--hostfile",
            str(hostfile),
            "--output-hostfile",
            str(output),
            "--mpirun",
            real_mpi.mpirun,
            "--log-format",
            "json",
            "launcher",
            "--",
            *probe,
            env=env,
        )
        assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
        self._check_ranks(out, "/opt/probe-lib", remote=True)
        if real_mpi.vendor in ("mpich", "intel"):  # hydra reads the address (SECURITY.md 32)
            assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+:2\n", output.read_text()), output.read_text()
        else:
            assert output.read_text() == "node-a slots=2\n"
        assert (tmp_path / "mpi-hostfile.orig").read_text() == hostfile.read_text()
        assert hostfile.read_text() == "# one node\nnode-a slots=2\n"  # input untouched
        assert "never-forwarded-token" not in err

    def test_wrap_user_mpirun(
        self, real_mpi: RealMPI, pod: Pod, tmp_path: Path, probe: list[str]
    ) -> None:
        """An existing MPIJob command adopts the agent by changing only the entrypoint."""
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("localhost slots=2\n")
        env = user_env(real_mpi, tmp_path)
        env["PATH"] = f"{real_mpi.bindir}:/usr/local/bin:/usr/bin:/bin"
        env["K_MPI_JOB_ROLE"] = "launcher"
        env["MPI_HOSTFILE"] = str(hostfile)
        env["MPI_BOOTSTRAP_OUTPUT_HOSTFILE"] = str(tmp_path / "out")
        np_flag = "-np" if real_mpi.vendor == "openmpi" else "-n"
        code, out, err = pod.agent("mpirun", np_flag, "2", *probe, env=env)
        assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
        self._check_ranks(out, "/opt/probe-lib", remote=False)

    def test_exit_code_passes_through(self, real_mpi: RealMPI, pod: Pod, tmp_path: Path) -> None:
        """The program's exit status comes back as the agent's through each real mpirun."""
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        code, out, err = pod.agent(
            "--hostfile",
            str(hostfile),
            "--output-hostfile",
            str(tmp_path / "out"),
            "--mpirun",
            real_mpi.mpirun,
            "launcher",
            "--",
            "sh",
            "-c",
            "exit 3",
        )
        assert code == 3, f"stdout:\n{out}\nstderr:\n{err}"


def test_no_traceback_anywhere(pod: Pod, tmp_path: Path) -> None:
    """A missing mpirun is exit 127 with one line naming it."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost\n")
    code, _, err = pod.agent(
        "--hostfile",
        str(hostfile),
        "--mpirun",
        os.path.join(str(tmp_path), "no-mpirun"),
        "launcher",
        "--",
        "x",
    )
    assert code == 127
    assert "no-mpirun: command not found" in err
    assert "Traceback" not in err
