"""MPI detection from real version output, user-command scanning, env forwarding rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.launcher import mpi

VERSIONS = Path(__file__).parent / "fixtures" / "versions"


class TestDetect:
    """Vendor, version and runtime come from what the real mpirun prints."""

    @pytest.mark.parametrize(
        ("fixture", "vendor", "version", "runtime"),
        [
            ("openmpi-4.1.4.txt", "openmpi", "4.1.4", "orte"),
            ("openmpi-5.0.11.txt", "openmpi", "5.0.11", "prrte"),
            ("mpich-5.0.2.txt", "mpich", "5.0.2", "hydra"),
            ("intel-2021.18.1.txt", "intel", "2021.18.1", "hydra"),
        ],
    )
    def test_real_output(self, fixture: str, vendor: str, version: str, runtime: str) -> None:
        """Each real mpirun --version capture is identified as its vendor, version and runtime."""
        text = (VERSIONS / fixture).read_text()
        info = mpi.identify(text, "/x/mpirun", "auto", "default", prefix="/x")
        assert (info.vendor, info.version, info.runtime.name) == (vendor, version, runtime)
        assert info.source == "detected"

    def test_unknown_output_is_a_clear_error(self) -> None:
        """Unrecognised version output is a ConfigError naming the mpirun and MPI_BOOTSTRAP_MPI."""
        with pytest.raises(
            ConfigError,
            match=r"cannot tell which MPI /x/mpirun is .*"
            r"set MPI_BOOTSTRAP_MPI",
        ):
            mpi.identify("mystery launcher 1.0\n", "/x/mpirun", "auto", "default", prefix="/x")

    def test_choice_when_output_unknown(self) -> None:
        """An explicit MPI choice is used when the version output is unrecognised."""
        info = mpi.identify("???", "/x/mpirun", "openmpi5", "env MPI_BOOTSTRAP_MPI", prefix="/x")
        assert (info.vendor, info.version, info.runtime) == ("openmpi", "unknown", mpi.PRRTE)
        info = mpi.identify("???", "/x/mpirun", "intel", "env MPI_BOOTSTRAP_MPI", prefix="/x")
        assert (info.vendor, info.runtime) == ("intel", mpi.INTEL)

    def test_openmpi_choice_needs_a_major_version(self) -> None:
        """A bare 'openmpi' choice takes its runtime from the output; without one it asks for
        openmpi4 or openmpi5."""
        with pytest.raises(ConfigError, match="use openmpi4 or openmpi5"):
            mpi.identify("???", "/x/mpirun", "openmpi", "env MPI_BOOTSTRAP_MPI", prefix="/x")
        text = (VERSIONS / "openmpi-5.0.11.txt").read_text()
        assert mpi.identify(text, "/x/mpirun", "openmpi", "env", prefix="/x").runtime is mpi.PRRTE


class TestUserCommand:
    """Wrap mode knows which tokens are mpirun options and where the program starts."""

    def test_openmpi(self) -> None:
        """An Open MPI command is split at its program, and its --mca names and option values are
        read from mpirun's part only, not from the program's arguments."""
        argv = [
            "mpirun",
            "-np",
            "4",
            "--mca",
            "btl",
            "tcp,self",
            "-x",
            "A=1",
            "--bind-to=core",
            "python",
            "train.py",
            "--mca",
            "not-an-option",
        ]
        user = mpi.scan_user_command(argv, mpi.ORTE)
        assert user.program_index == 9
        assert user.mca_names() == {"btl"}
        assert user.has("np", "n") == "-np"
        assert user.has("bind-to") == "--bind-to"
        assert user.values("x") == ["A=1"]

    def test_hydra(self) -> None:
        """A hydra command is split at its program, and its options are read from mpirun's part
        only, not from the program's own -n."""
        argv = ["mpiexec", "-n", "4", "-genv", "A", "1", "-iface", "ib0", "./a.out", "-n", "9"]
        user = mpi.scan_user_command(argv, mpi.MPICH)
        assert user.program_index == 8
        assert user.has("iface") == "-iface"
        assert user.values("n") == ["4"]

    @pytest.mark.parametrize("name", ["mpirun", "/usr/bin/mpiexec", "mpiexec.hydra", "orterun"])
    def test_is_launcher(self, name: str) -> None:
        """mpirun, mpiexec (by path too), mpiexec.hydra and orterun as first word mean wrap mode."""
        assert mpi.is_launcher([name, "a.out"])

    def test_not_launcher(self) -> None:
        """Only the first word counts: a program given 'mpirun' as an argument is not a launcher."""
        assert not mpi.is_launcher(["python3", "mpirun"])


class TestForwarding:
    """NCCL_*, UCX_*, LD_LIBRARY_PATH, PATH, OMPI_MCA_coll_* and FORWARD_ENV go; shell
    state and the agent's own (secret-bearing) settings never do."""

    def test_rules(self) -> None:
        """Forwarding takes the standard names and FORWARD_ENV patterns, refuses shell state and
        MPI_BOOTSTRAP_* even when asked, notes unset names, and records no value anywhere."""
        env = {
            "NCCL_DEBUG": "INFO",
            "UCX_TLS": "tcp",
            "LD_LIBRARY_PATH": "/l",
            "PATH": "/b",
            "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
            "OMPI_MCA_btl": "tcp",
            "HOME": "/root",
            "BASH_FUNC_x%%": "() { :; }",
            "OLDPWD": "/",
            "MPI_BOOTSTRAP_TOKEN": "s3cret",
            "PYTHONPATH": "/p",
            "HF_HOME": "/h",
            "HF_TOKEN_X": "t",
            "CUDA_VISIBLE_DEVICES": "0",
        }
        names, decisions = mpi.forwarded_names(
            env, ("PYTHONPATH", "HF_*", "MISSING", "OLDPWD", "MPI_BOOTSTRAP_*")
        )
        assert names == [
            "HF_HOME",
            "HF_TOKEN_X",
            "LD_LIBRARY_PATH",
            "NCCL_DEBUG",
            "OMPI_MCA_coll_tuned_use_dynamic_rules",
            "PATH",
            "PYTHONPATH",
            "UCX_TLS",
        ]
        said = {d.setting: d.reason for d in decisions}
        assert "not set" in said["forward MISSING"]
        assert "never forwarded" in said["forward OLDPWD"]
        assert "never forwarded" in said["forward MPI_BOOTSTRAP_TOKEN"]
        # only names are forwarded: no value appears anywhere in the decisions
        assert "s3cret" not in repr(decisions)

    def test_the_launchers_environment(self) -> None:
        """`*` (a JobSet's launcher: Trainer v2's trainer.env) forwards what the job set,
        never the pod's own, its MPI's, the agent's or a secret-looking name (said, and
        forwarded once named)."""
        job = {"MY_SETTING": "1", "MASTER_PORT": "29500", "HF_HOME": "/h", "LANG": "C"}
        pod = {
            "HOSTNAME": "pi-launcher-0-0", "HOME": "/home/mpiuser", "JOB_COMPLETION_INDEX": "0",
            "JOBSET_NAME": "pi", "REPLICATED_JOB_NAME": "launcher", "VC_W_HOSTS": "a",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1", "PI_SERVICE_PORT_SSH": "22",
            "REDIS_PORT": "tcp://10.0.0.9:6379", "REDIS_PORT_6379_TCP_ADDR": "10.0.0.9",
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile", "I_MPI_HYDRA_HOST_FILE": "h",
            "MPI_HOSTFILE": "/etc/mpi/hostfile", "K_MPI_JOB_ROLE": "launcher",
            "NVIDIA_VISIBLE_DEVICES": "all", "LD_PRELOAD": "libnss_wrapper.so",
            "MPI_BOOTSTRAP_TOKEN": "s3cret", "HF_TOKEN": "t0ken", "WANDB_API_KEY": "k3y",
        }  # fmt: skip
        names, decisions = mpi.forwarded_names({**job, **pod}, ("*",))
        assert names == sorted(job)
        said = {d.setting: d.reason for d in decisions}
        assert set(said) == {"forward HF_TOKEN", "forward WANDB_API_KEY"}
        assert "name it in MPI_BOOTSTRAP_FORWARD_ENV" in said["forward HF_TOKEN"]
        names, _ = mpi.forwarded_names({**job, **pod}, ("*", "WANDB_API_KEY"))
        assert names == sorted([*job, "WANDB_API_KEY"])
        assert "s3cret" not in repr(decisions) and "k3y" not in repr(decisions)
