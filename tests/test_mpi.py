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


# Credentials a launcher's environment holds, as the fifth security review tried them
# (27 of 27 passed the name rule then and reached every rank under `*`).
CREDENTIALS = {
    "DATABASE_URL": "postgresql://app:PASSWORD@db/prod",
    "MONGO_URI": "mongodb://u:p4ss@mongo:27017/x",
    "REDIS_URI": "redis://:hunter2@redis:6379/0",
    "SENTRY_DSN": "https://abc@o1.ingest.sentry.io/1",
    "HTTPS_PROXY": "http://user:pass@proxy:3128",
    "http_proxy": "http://user:pass@proxy:3128",
    "PIP_INDEX_URL": "https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.example/simple",
    "DB_PASS": "s3cret", "MYSQL_PWD": "s3cret", "PGPASSWORD": "s3cret",
    "GITHUB_PAT": "ghp_0123456789abcdefghij", "GH_PAT": "x",
    "DOCKER_AUTH_CONFIG": '{"auths": {}}', "AUTHORIZATION": "Bearer abc.def",
    "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountKey=abc==",
    "SAS_URL": "https://acct.blob.core.windows.net/c?sv=2022&sig=abc%3D",
    "hf_token": "hf_abcdefghijklmnopqrstuvwxyz", "HF_HUB_TOKEN": "x",
    "WANDB_API_KEY": "k3y", "OPENAI_API_KEY": "sk-abcdefghijklmnopqrstu",
    "AWS_ACCESS_KEY_ID": "AKIAABCDEFGHIJKLMNOP", "AWS_SECRET_ACCESS_KEY": "x",
    "AWS_SESSION_TOKEN": "x", "SSH_PRIVATE_KEY": "x",
    "TLS_CERT": "-----BEGIN CERTIFICATE-----\nMIIB", "ID_JWT": "eyJhbGciOi.eyJzdWIiOi.sig",
    "SESSION_COOKIE": "x", "MY_CREDENTIALS": "x", "UPSTREAM_HEADER": "Basic dXNlcjpwYXNz",
}  # fmt: skip


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

    def test_credentials_are_held_back_by_name_or_value(self) -> None:
        """`*` forwards no variable whose name or value looks like a credential (any
        case; the value's kind named: "a URL with a password"), says each, and never a
        value; named, one is forwarded with a warning that the MPI carries it in clear
        text; a job's ordinary variables and a public key's path still go."""
        job = {"MY_SETTING": "1", "HF_HOME": "/h", "DATA_URL": "https://host/data",
               "SSH_HOST_KEY_PATH": "/etc/ssh/k.pub", "AUTHORIZED_KEYS": "/x"}  # fmt: skip
        names, decisions = mpi.forwarded_names({**job, **CREDENTIALS}, ("*",))
        assert names == sorted(job)
        said = {d.setting: d.reason for d in decisions}
        assert set(said) == {f"forward {n}" for n in CREDENTIALS}
        assert "a URL with a password" in said["forward DATABASE_URL"]
        assert "a connection string" in said["forward SAS_URL"]
        assert all(v not in repr(decisions) for v in CREDENTIALS.values() if len(v) > 1)
        names, decisions = mpi.forwarded_names(CREDENTIALS, ("*", "DATABASE_URL"))
        assert names == ["DATABASE_URL"]
        (warned,) = (d for d in decisions if d.setting == "forward DATABASE_URL")
        assert warned.value == "yes (warning)" and "unencrypted" in warned.reason

    def test_one_rule_for_forwarding_and_logs(self) -> None:
        """A log line hides the same: a key whose name looks secret, a value that looks
        like a credential (core/env.py serves both)."""
        from mpi_bootstrap.core.log import redact

        keys = {"hf_token": "x", "url": CREDENTIALS["DATABASE_URL"], "host_key": "ssh-ed25519",
                "authorized_keys": "/x", "path": "/etc/mpi/hostfile", "event": "token exposed",
                "reason": "MPI_BOOTSTRAP_TOKEN is in the environment: use a file"}  # fmt: skip
        assert redact(dict(keys)) == {**keys, "hf_token": "[redacted]", "url": "[redacted]"}
