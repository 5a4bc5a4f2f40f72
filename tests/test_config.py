"""Config: flag over environment over default, all errors at once, sources recorded."""

from __future__ import annotations

import dataclasses

import pytest

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.settings import Source
from tests.support.machine import HOST

PROG = ["--", "python3", "train.py"]


def cfg(env: dict[str, str] | None = None, argv: list[str] | None = None) -> Config:
    return Config.from_env(env or {}, argv if argv is not None else ["launcher", *PROG], host=HOST)


VOLCANO = {  # what Volcano's svc plugin sets in every pod of its MPI example's Job
    "VC_MPIMASTER_HOSTS": "lm-mpi-job-mpimaster-0.lm-mpi-job",
    "VC_MPIWORKER_HOSTS": "lm-mpi-job-mpiworker-0.lm-mpi-job,lm-mpi-job-mpiworker-1.lm-mpi-job",
    "VC_MPIMASTER_NUM": "1",
    "VC_MPIWORKER_NUM": "2",
}


# What Kubeflow Trainer v2 puts in a TrainJob `pi`'s pods (kubeflow/trainer 8c0f505,
# pkg/runtime/framework/plugins/mpi/mpi.go: the launcher's OMPI_MCA_*, nothing in the
# node's) beside what Kubernetes sets in an Indexed Job's pod (JOB_COMPLETION_INDEX) and
# the container runtime (HOSTNAME): JobSet sets no variable (core/operators.py).
TRAINER_LAUNCHER = {
    "HOSTNAME": "pi-launcher-0-0", "JOB_COMPLETION_INDEX": "0",
    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_set_default_slots": "1",
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
}  # fmt: skip
TRAINER_NODE = {"HOSTNAME": "pi-node-0-1", "JOB_COMPLETION_INDEX": "1"}


class TestOperatorRoles:
    """With no role given, what the pod's operator really sets says it: MPI Operator's
    K_MPI_JOB_ROLE, the Volcano task holding this pod, a JobSet's pod name (Trainer v2's
    replicated jobs `launcher` and `node`), or a manifest's REPLICATED_JOB_NAME; a name
    that says neither is refused, never guessed; a role given wins
    (docs/configuration.md, "Operators")."""

    @pytest.mark.parametrize(
        ("env", "role", "source"),
        [
            (TRAINER_LAUNCHER, "launcher", "hostname"),
            (TRAINER_NODE, "worker", "hostname"),
            ({"HOSTNAME": "my-job-worker-0-3", "JOB_COMPLETION_INDEX": "3"}, "worker", "hostname"),
            ({"REPLICATED_JOB_NAME": "launcher"}, "launcher", "env REPLICATED_JOB_NAME"),
            ({"REPLICATED_JOB_NAME": "workers"}, "worker", "env REPLICATED_JOB_NAME"),
            ({**TRAINER_NODE, "K_MPI_JOB_ROLE": "launcher"}, "launcher", "env K_MPI_JOB_ROLE"),
            ({**TRAINER_NODE, "MPI_BOOTSTRAP_ROLE": "launcher"}, "launcher",
             "env MPI_BOOTSTRAP_ROLE"),
            ({**VOLCANO, "HOSTNAME": "lm-mpi-job-mpiworker-1"}, "worker", "env VC_MPIWORKER_HOSTS"),
            ({**VOLCANO, "HOSTNAME": "lm-mpi-job-mpimaster-0"}, "launcher",
             "env VC_MPIMASTER_HOSTS"),
        ],
    )  # fmt: skip
    def test_found(self, env: dict[str, str], role: str, source: str) -> None:
        c = cfg(env, PROG)
        said = str(c.source("role"))
        assert (c.role, said if " " in source else c.source("role").kind) == (role, source)
        if source == "hostname":
            assert said.startswith(f"hostname {env['HOSTNAME']} (") and "replicated job" in said
        volcano = source == "env VC_MPIMASTER_HOSTS"
        assert c.hostfile == ("/etc/volcano/mpiworker.host" if volcano else "/etc/mpi/hostfile")

    @pytest.mark.parametrize(
        "env",
        [
            {"REPLICATED_JOB_NAME": "trainer"},
            {**VOLCANO, "HOSTNAME": "elsewhere"},
            # a JobSet's name whose replicated job says neither
            {"HOSTNAME": "pi-driver-0-0", "JOB_COMPLETION_INDEX": "0"},
            # JobSet's form without Kubernetes' index, or with another: no Indexed Job's pod
            {"HOSTNAME": "pi-node-0-1"},
            {"HOSTNAME": "pi-node-0-1", "JOB_COMPLETION_INDEX": "0"},
            # MPI Operator's worker name without its variable: one index, no JobSet
            {"HOSTNAME": "pi-worker-0", "JOB_COMPLETION_INDEX": "0"},
        ],
    )
    def test_refused(self, env: dict[str, str]) -> None:
        """Refused (64) naming what to set, and nothing else said of a role not found."""
        with pytest.raises(ConfigError, match=r"MPI_BOOTSTRAP_ROLE") as e:
            cfg(env, PROG)
        assert "no program" not in e.value.message

    def test_trainers_launcher_forwards_its_environment(self) -> None:
        """Trainer v2's launcher (its trainer.env is there only) forwards `*`, said as
        the operator's rule; MPI_BOOTSTRAP_FORWARD_ENV wins; its nodes, a plain JobSet's
        launcher and MPI Operator's forward only the table's names."""
        c = cfg(TRAINER_LAUNCHER, PROG)
        assert c.forward_env == ("*",)
        assert str(c.source("forward_env")).startswith("operator Kubeflow Trainer v2")
        assert cfg({**TRAINER_LAUNCHER, "MPI_BOOTSTRAP_FORWARD_ENV": "A"}, PROG).forward_env == (
            "A",
        )
        assert cfg({**TRAINER_LAUNCHER, "MPI_BOOTSTRAP_ROLE": "launcher"}, PROG).forward_env == (
            "*",
        )
        assert cfg(TRAINER_NODE, []).forward_env == ()
        plain = {"HOSTNAME": "pi-launcher-0-0", "JOB_COMPLETION_INDEX": "0"}
        assert cfg(plain, PROG).forward_env == ()
        assert cfg({"K_MPI_JOB_ROLE": "launcher", **TRAINER_LAUNCHER}, PROG).forward_env == ()


class TestPrecedence:
    """A flag beats its variable, which beats the default; each source is recorded."""

    def test_defaults(self) -> None:
        """With no flags or variables each setting has its documented default, sourced 'default'."""
        c = cfg()
        assert (c.hostfile, c.dns_wait_seconds, c.dns_wait_interval, c.rewrite) == (
            "/etc/mpi/hostfile",
            120.0,
            3.0,
            "none",
        )
        assert (c.cluster_domain, c.control_iface, c.data_iface, c.mpi) == (
            "cluster.local",
            "eth0",
            None,
            "auto",
        )
        assert c.output_hostfile == f"{c.state_dir}/hostfile"
        assert c.source("hostfile") == Source("default")

    @pytest.mark.parametrize(
        ("euid", "home", "hostname", "want"),
        [
            (0, "/root", "job-worker-0", "/run/mpi-bootstrap/job-worker-0"),
            (1000, "/home/mpi", "job-worker-0", "/home/mpi/.mpi-bootstrap/job-worker-0"),
            (1000, "/", "w1", "/tmp/mpi-bootstrap-1000/w1"),
            (1000, "/nonexistent", "w1", "/tmp/mpi-bootstrap-1000/w1"),  # read-only root
            (1000, "", "w1", "/tmp/mpi-bootstrap-1000/w1"),
            (0, "/root", "not a name", "/run/mpi-bootstrap"),
        ],
    )
    def test_state_dir_is_the_pods_own(
        self, euid: int, home: str, hostname: str, want: str
    ) -> None:
        """The default state directory is the pod's own, by its hostname: pods that share
        /run or a home never share one (tests/test_launch_order.py)."""
        host = dataclasses.replace(
            HOST, euid=euid, hostname=hostname, creatable=lambda p: "nonexistent" not in p
        )
        c = Config.from_env({"HOME": home}, ["launcher", *PROG], host=host)
        assert c.state_dir == want

    def test_env_then_flag(self) -> None:
        """A variable beats the default and a flag beats the variable; each source is recorded."""
        env = {"MPI_HOSTFILE": "/env/hf", "MPI_DNS_WAIT_SECONDS": "5"}
        c = cfg(env)
        assert c.hostfile == "/env/hf"
        assert str(c.source("hostfile")) == "env MPI_HOSTFILE"
        c = cfg(env, ["--hostfile", "/flag/hf", "launcher", *PROG])
        assert c.hostfile == "/flag/hf"
        assert str(c.source("hostfile")) == "flag --hostfile"
        assert c.dns_wait_seconds == 5.0

    def test_flags_after_role(self) -> None:
        """Agent flags given after the role word are read, and the program after -- is kept."""
        c = cfg(argv=["launcher", "--rewrite", "ip", "--explain", *PROG])
        assert c.rewrite == "ip"
        assert c.explain
        assert c.program == ("python3", "train.py")

    def test_legacy_fqdn_switch(self) -> None:
        """MPI Operator's REWRITE_MPI_HOSTFILE_FQDN=true selects fqdn, recorded as the source."""
        c = cfg({"REWRITE_MPI_HOSTFILE_FQDN": "true"})
        assert c.rewrite == "fqdn"
        assert str(c.source("rewrite")) == "env REWRITE_MPI_HOSTFILE_FQDN"

    def test_agent_setting_beats_legacy_switch(self) -> None:
        """MPI_BOOTSTRAP_REWRITE beats the legacy REWRITE_MPI_HOSTFILE_FQDN, and a note says so."""
        c = cfg({"REWRITE_MPI_HOSTFILE_FQDN": "true", "MPI_BOOTSTRAP_REWRITE": "ip"})
        assert c.rewrite == "ip"
        assert any("REWRITE_MPI_HOSTFILE_FQDN ignored" in n for n in c.notes)

    def test_forward_env_patterns(self) -> None:
        """MPI_BOOTSTRAP_FORWARD_ENV splits on commas, trims spaces, keeps the globs in order."""
        c = cfg({"MPI_BOOTSTRAP_FORWARD_ENV": "PYTHONPATH, HF_*,WANDB_API_BASE"})
        assert c.forward_env == ("PYTHONPATH", "HF_*", "WANDB_API_BASE")

    def test_frozen(self) -> None:
        """A Config cannot be changed once built."""
        c = cfg()
        with pytest.raises(AttributeError):
            c.rewrite = "ip"  # type: ignore[misc]


class TestRole:
    """The role comes from the command, MPI_BOOTSTRAP_ROLE or MPI Operator's K_MPI_JOB_ROLE."""

    def test_entrypoint_with_user_command(self) -> None:
        """ENTRYPOINT ["mpi-bootstrap"] + the MPIJob's command as arguments: the role comes from
        K_MPI_JOB_ROLE and the whole command, mpirun included, is the program."""
        c = Config.from_env(
            {"K_MPI_JOB_ROLE": "launcher"}, ["mpirun", "-np", "2", "a.out"], host=HOST
        )
        assert c.role == "launcher"
        assert c.program == ("mpirun", "-np", "2", "a.out")
        assert str(c.source("role")) == "env K_MPI_JOB_ROLE"

    def test_bootstrap_role_beats_operator_role(self) -> None:
        """MPI_BOOTSTRAP_ROLE beats MPI Operator's K_MPI_JOB_ROLE."""
        c = Config.from_env(
            {"K_MPI_JOB_ROLE": "worker", "MPI_BOOTSTRAP_ROLE": "launcher"},
            ["--", "a.out"],
            host=HOST,
        )
        assert c.role == "launcher"

    def test_options_before_program(self) -> None:
        """Agent options before a program given without -- are the agent's; everything from the
        program on, its own --mca included, is the program's."""
        c = Config.from_env(
            {"K_MPI_JOB_ROLE": "launcher"},
            ["--explain", "--rewrite=fqdn", "mpirun", "--mca", "x", "y"],
            host=HOST,
        )
        assert c.explain and c.rewrite == "fqdn"
        assert c.program == ("mpirun", "--mca", "x", "y")

    def test_no_role(self) -> None:
        """No role from the command or the environment is a ConfigError saying 'no role'."""
        with pytest.raises(ConfigError, match="no role"):
            Config.from_env({}, ["--", "a.out"], host=HOST)


class TestErrors:
    """Every bad setting is reported at once, each naming its flag or variable."""

    def test_all_at_once(self) -> None:
        """Eight bad variables give one ConfigError of eight problems, each led by its variable."""
        env = {
            "MPI_DNS_WAIT_SECONDS": "soon",
            "MPI_DNS_WAIT_INTERVAL": "0",
            "MPI_BOOTSTRAP_REWRITE": "dns",
            "MPI_BOOTSTRAP_CLUSTER_DOMAIN": "bad_domain",
            "MPI_BOOTSTRAP_CONTROL_IFACE": "eth0; rm",
            "MPI_BOOTSTRAP_MPI": "lam",
            "REWRITE_MPI_HOSTFILE_FQDN": "maybe",
            "MPI_BOOTSTRAP_NP": "-1",
        }
        with pytest.raises(ConfigError) as err:
            cfg(env)
        problems = err.value.problems
        assert len(problems) == 8
        for var in env:
            assert any(p.startswith(f"{var}: ") for p in problems), var

    def test_flag_named(self) -> None:
        """A bad flag value is reported under the flag's name, with the rule it broke."""
        with pytest.raises(ConfigError) as err:
            cfg(argv=["--dns-wait-seconds", "-3", "launcher", *PROG])
        assert err.value.problems == ["--dns-wait-seconds: '-3' must be a finite number ≥ 0"]

    def test_unknown_flag(self) -> None:
        """An unknown flag is a ConfigError naming it."""
        with pytest.raises(ConfigError) as err:
            cfg(argv=["--frobnicate", "launcher", *PROG])
        assert err.value.problems == ["unknown flag --frobnicate"]

    def test_did_you_mean(self) -> None:
        """A flag one typo away from a real one says which, one problem per flag."""
        with pytest.raises(ConfigError) as err:
            cfg(argv=["--dta-check", "--rewite=ip", "launcher", *PROG])
        assert err.value.problems == [
            "unknown flag --dta-check (did you mean --data-check?)",
            "unknown flag --rewite (did you mean --rewrite?)",
        ]

    def test_launcher_needs_program(self) -> None:
        """The launcher role without a program is refused with 'no program given'."""
        with pytest.raises(ConfigError, match="no program given"):
            cfg(argv=["launcher"])

    def test_output_must_differ_from_input(self) -> None:
        """An output hostfile that is the input one once the path is normalised is refused."""
        with pytest.raises(ConfigError, match="must differ from the input hostfile"):
            cfg({"MPI_HOSTFILE": "/tmp/h", "MPI_BOOTSTRAP_OUTPUT_HOSTFILE": "/tmp/./h"})

    def test_json_needs_explain(self) -> None:
        """--json is refused unless given with --explain or doctor."""
        with pytest.raises(ConfigError, match="--json: only valid with --explain or doctor"):
            cfg(argv=["--json", "launcher", *PROG])

    def test_explain_is_the_launchers(self) -> None:
        """`worker --explain` is refused: a dry run must not start a worker for real."""
        with pytest.raises(ConfigError, match="--explain: only the launcher's"):
            cfg(argv=["--explain", "worker"])


class TestHelp:
    """--help a person reads, --help-all for every setting; both print the exit codes."""

    def test_every_setting_in_one_group(self) -> None:
        from mpi_bootstrap.core import helptext
        from mpi_bootstrap.core.settings import SETTINGS

        grouped = [n for _, names in helptext.GROUPS for n in names]
        assert sorted(grouped) == sorted(s.name for s in SETTINGS)

    def test_short(self) -> None:
        """Every role, the common settings with their variables, the exit codes; short."""
        from mpi_bootstrap.core import helptext
        from mpi_bootstrap.core.errors import MEANINGS

        text = helptext.short()
        assert len(text.splitlines()) <= 45
        for role in ("launcher", "worker", "probe", "doctor"):
            assert f"\n  {role} " in text
        for word in (
            "--hostfile PATH",
            "MPI_HOSTFILE",
            "--rewrite none|fqdn|ip",
            "--help-all",
            "--explain",
        ):
            assert word in text
        for code in MEANINGS:
            assert f"\n  {code} " in text
        assert all(len(line) <= 90 for line in text.splitlines())

    def test_full(self) -> None:
        """Every flag with the form of its value, every variable, grouped."""
        from mpi_bootstrap.core import helptext
        from mpi_bootstrap.core.settings import SETTINGS

        text = helptext.full()
        for s in SETTINGS:
            if s.flag:
                assert f"  {s.flag} {helptext.form(s)} " in text, s.name
            for env in s.envs:
                assert env in text
        assert "--data-check true|false" in text and "--sshd-port PORT" in text
        for title, _ in helptext.GROUPS:
            assert f"\n{title}:\n" in text
