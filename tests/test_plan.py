"""Plan snapshots for each MPI × rewrite mode × user override, plus the rules behind them.

Snapshots live in tests/snapshots/. After an intended change, regenerate them with
`UPDATE_SNAPSHOTS=1 make test-fast` and review the diff like code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from mpi_bootstrap.core import failures, gate, records
from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError, HostfileError
from mpi_bootstrap.core.runtimes.schema import (
    Default,
    EnvDefault,
    Gate,
    Hostfile,
    LaunchExec,
    NameList,
    Ranks,
    Row,
    Runtime,
)
from mpi_bootstrap.core.settings import MPI_CHOICES
from mpi_bootstrap.launcher import mpi, remotecheck, render
from mpi_bootstrap.launcher.mpi.resolve import READERS
from mpi_bootstrap.launcher.plan import Gathered, Plan, build_plan, changes
from mpi_bootstrap.ssh import sshconfig
from mpi_bootstrap.ssh.sshconfig import UnsafeValue
from mpi_bootstrap.system.dns import Answer
from tests.support.machine import HOST, MPIS

SNAPSHOTS = Path(__file__).parent / "snapshots"

BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_DISABLE": "1",
    "UCX_TLS": "tcp",
    "HOME": "/root",
    "OLDPWD": "/",
    "BASH_FUNC_module%%": "() { eval; }",
    "MPI_BOOTSTRAP_TOKEN": "never-shown-token",
    # What MPI Operator sets on every launcher
    "K_MPI_JOB_ROLE": "launcher",
    "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
}

HOSTFILE = "pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n"
ADDRESSES = {"pi-worker-0.pi.default.svc": "10.1.0.10", "pi-worker-1.pi.default.svc": "10.1.0.11"}

# User overrides: in wrap mode (their own mpirun flags) or through the MPI's variables.
USER_FLAGS = {
    "openmpi4": [
        "mpirun",
        "-np",
        "2",
        "--bind-to",
        "core",
        "--mca",
        "btl_tcp_if_include",
        "eth1",
        "-x",
        "NCCL_DEBUG=WARN",
        "--hostfile",
        "/etc/mpi/hostfile",
        "python3",
        "train.py",
        "--mca",
        "inner",
    ],
    "openmpi5": [
        "mpirun",
        "-np",
        "2",
        "--bind-to",
        "core",
        "--prtemca",
        "plm_ssh_agent",
        "ssh -p 2222",
        "--mca",
        "btl_tcp_if_include",
        "eth1",
        "python3",
        "train.py",
    ],
    "mpich": [
        "mpiexec",
        "-n",
        "2",
        "-iface",
        "eth1",
        "-genvall",
        "-f",
        "/etc/mpi/hostfile",
        "./a.out",
    ],
    "intel": ["mpirun", "-n", "2", "-bootstrap", "rsh", "-iface", "eth1", "IMB-MPI1"],
}
USER_ENV = {
    "openmpi4": {
        "OMPI_MCA_btl": "tcp,self,vader",
        "OMPI_MCA_routed": "radix",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    },
    "openmpi5": {
        "PRTE_MCA_prte_keep_fqdn_hostnames": "1",
        "OMPI_MCA_pml": "ucx",
        "OMPI_MCA_plm_rsh_agent": "ssh -p 2222",
        "NCCL_SOCKET_IFNAME": "eth9",
    },
    "mpich": {"HYDRA_IFACE": "eth1", "HYDRA_LAUNCHER": "rsh", "HYDRA_HOST_FILE": "/etc/mpi/h"},
    "intel": {
        "I_MPI_HYDRA_IFACE": "eth1",
        "I_MPI_HYDRA_ENV": "all",
        "FI_TCP_IFACE": "eth1",
        "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
    },
}


def make_plan(
    kind: str,
    rewrite: str,
    override: str,
    *,
    env_extra: dict[str, str] | None = None,
    hostfile_text: str = HOSTFILE,
    interfaces: frozenset[str] | None = None,
    is_root: bool = True,
    remote: bool = False,
    program: list[str] | None = None,
    mpi_info: mpi.MPIInfo | None = None,
) -> Plan:
    env = dict(BASE_ENV)
    program = program or ["python3", "train.py"]
    if override == "flags":
        program = USER_FLAGS[kind]
    elif override == "env":
        env.update(USER_ENV[kind])
    env.update(env_extra or {})
    argv = ["--rewrite", rewrite, "--state-dir", "/run/mpi-bootstrap", "launcher", "--", *program]
    config = Config.from_env(env, argv, host=HOST)
    parsed = hf.parse(hostfile_text, "/etc/mpi/hostfile")
    answers = {}
    for host in parsed.hosts:
        name = hf.lookup_name(host.name, rewrite, "cluster.local")
        addr = ADDRESSES.get(host.name, "10.1.0.99")
        answers[name] = Answer(name, addresses=(addr,))
    facts = Gathered(
        environ=env,
        hostfile=parsed,
        answers=answers,
        mpi=mpi_info or MPIS[kind],
        interfaces=interfaces or frozenset({"lo", "eth0", "net1"}),
        is_root=is_root,
        is_pid1=True,
        remote=tuple(h.name for h in parsed.hosts) if remote else (),
    )
    return build_plan(config, facts)


def check_snapshot(name: str, data: dict[str, Any]) -> None:
    path = SNAPSHOTS / f"{name}.json"
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no snapshot {path}; run with UPDATE_SNAPSHOTS=1 and review it"
    assert json.loads(path.read_text()) == json.loads(text), f"plan changed: {path}"


class TestSnapshots:
    """Each MPI × rewrite × override produces exactly the reviewed plan."""

    @pytest.mark.parametrize("kind", sorted(MPIS))
    @pytest.mark.parametrize("rewrite", ["none", "fqdn", "ip"])
    @pytest.mark.parametrize("override", ["none", "flags", "env"])
    def test_plan(self, kind: str, rewrite: str, override: str) -> None:
        """Each MPI × rewrite × user-override plan equals its reviewed snapshot, --explain --json
        writes it as json.dumps(indent=2) would, and neither render shows the token's value nor
        lists MPI_BOOTSTRAP_TOKEN among the plan's variables."""
        plan = make_plan(kind, rewrite, override)
        data = render.as_dict(plan)
        check_snapshot(f"{kind}-{rewrite}-{override}", data)
        assert render.as_json(plan) == json.dumps(data, indent=2) + "\n"
        # never a secret, never a value of a forwarded variable
        text = json.dumps(data) + render.as_text(plan)
        assert "never-shown-token" not in text
        assert "MPI_BOOTSTRAP_TOKEN" not in json.dumps(data["env"])


def argv_of(plan: Plan) -> list[str]:
    return list(plan.argv)


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


class TestRules:
    """The rules the snapshots encode, spelled out so a careless update cannot hide them."""

    def test_openmpi4_flags(self) -> None:
        """Open MPI 4 gets the agent's --mca set, --prefix, --allow-run-as-root and -np from the
        hostfile's slots, but no keep_fqdn (the operator's variable does it) nor any --prtemca."""
        argv = argv_of(make_plan("openmpi4", "none", "none"))
        mcas = pairs(argv, "--mca")
        for name in (
            "btl",
            "btl_tcp_if_include",
            "oob_tcp_if_include",
            "pml",
            "routed",
            "plm_rsh_agent",
            "coll_ucc_enable",
            "coll_hcoll_enable",
            "orte_startup_timeout",
        ):
            assert name in mcas, name
        # MPI Operator's OMPI_MCA_orte_keep_fqdn_hostnames already does it on 4.x
        assert "orte_keep_fqdn_hostnames" not in mcas
        assert "--prtemca" not in argv
        assert argv[argv.index("--prefix") + 1] == "/opt/ompi4"
        assert "--allow-run-as-root" in argv
        assert argv[argv.index("-np") + 1] == "4"
        assert argv[-2:] == ["python3", "train.py"]

    def test_openmpi5_uses_prrte_names(self) -> None:
        """Open MPI 5 gets daemon settings as --prtemca, not the 4.x --mca names, and the plan says
        the operator's OMPI_MCA_orte_keep_fqdn_hostnames is ignored there."""
        plan = make_plan("openmpi5", "none", "none")
        argv = argv_of(plan)
        prte = pairs(argv, "--prtemca")
        assert {"oob_tcp_if_include", "plm_ssh_agent", "prte_keep_fqdn_hostnames"} <= set(prte)
        assert "routed" not in pairs(argv, "--mca")
        assert "plm_rsh_agent" not in pairs(argv, "--mca")
        # the operator's 4.x variable is ignored by Open MPI 5, and the plan says so
        keep = next(d for d in plan.decisions if d.setting == "--prtemca prte_keep_fqdn_hostnames")
        assert "OMPI_MCA_orte_keep_fqdn_hostnames is set but ignored" in keep.reason

    def test_default_hostfile_variable_points_at_rewrite(self) -> None:
        """With a rewrite, the operator's OMPI_MCA_orte_default_hostfile names the rewritten one."""
        plan = make_plan("openmpi4", "fqdn", "none")
        assert plan.env_set["OMPI_MCA_orte_default_hostfile"] == "/run/mpi-bootstrap/hostfile"

    @pytest.mark.parametrize("kind", ["mpich", "intel"])
    def test_hydra(self, kind: str) -> None:
        """MPICH and Intel MPI launch over ssh through the agent's 0755 ssh-launcher wrapper, with
        -iface on the control NIC, a -genvlist of forwarded names and a host:slots hostfile."""
        plan = make_plan(kind, "none", "none")
        argv = argv_of(plan)
        launch, exec_flag = (
            ("-bootstrap", "-bootstrap-exec")
            if kind == "intel"
            else ("-launcher", "-launcher-exec")
        )
        assert argv[argv.index(launch) + 1] == "ssh"
        wrapper = argv[argv.index(exec_flag) + 1]
        assert wrapper == "/run/mpi-bootstrap/ssh-launcher"
        script = next(f for f in plan.files if f.path == wrapper)
        assert script.mode == 0o755
        assert "exec ssh -o BatchMode=yes" in script.text and '"$@"' in script.text
        assert argv[argv.index("-iface") + 1] == "eth0"
        genv = argv[argv.index("-genvlist") + 1].split(",")
        assert {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "LD_LIBRARY_PATH", "PATH"} <= set(genv)
        assert plan.hostfile_text == "pi-worker-0.pi.default.svc:2\npi-worker-1.pi.default.svc:2\n"

    @pytest.mark.parametrize("kind", sorted(MPIS))
    def test_env_forwarding(self, kind: str) -> None:
        """Every MPI forwards NCCL_*, UCX_*, PATH and LD_LIBRARY_PATH (NCCL_SOCKET_IFNAME set to
        exactly the data NIC), never shell state, HOME or the token; Open MPI's -x carry no
        values."""
        plan = make_plan(kind, "none", "none")
        assert plan.env_set["NCCL_SOCKET_IFNAME"] == "=net1"
        assert {
            "NCCL_DEBUG",
            "NCCL_IB_DISABLE",
            "NCCL_SOCKET_IFNAME",
            "UCX_TLS",
            "LD_LIBRARY_PATH",
            "PATH",
        } <= set(plan.forwarded)
        for never in ("OLDPWD", "BASH_FUNC_module%%", "MPI_BOOTSTRAP_TOKEN", "HOME"):
            assert never not in plan.forwarded
        if kind.startswith("openmpi"):
            xs = pairs(argv_of(plan), "-x")
            assert sorted(xs) == sorted(plan.forwarded)
            assert all("=" not in x for x in xs)  # value-less: values never in argv

    def test_rewrite_modes(self) -> None:
        """--rewrite none keeps the names, fqdn appends .cluster.local, and ip writes each host's
        resolved address and records it on the host."""
        assert make_plan("openmpi4", "none", "none").hostfile_text.startswith(
            "pi-worker-0.pi.default.svc slots=2"
        )
        fq = make_plan("openmpi4", "fqdn", "none")
        assert fq.hostfile_text.startswith("pi-worker-0.pi.default.svc.cluster.local slots=2")
        ip = make_plan("openmpi4", "ip", "none")
        assert ip.hostfile_text == "10.1.0.10 slots=2\n10.1.0.11 slots=2\n"
        assert [h.rewritten_to for h in ip.hosts] == ["10.1.0.10", "10.1.0.11"]

    def test_ip_rewrite_merging_hosts_is_an_error(self) -> None:
        """--rewrite ip mapping two hosts to one address is a HostfileError, never a merged host."""
        with pytest.raises(HostfileError, match="the same as"):
            make_plan("openmpi4", "ip", "none", hostfile_text="a.svc slots=1\nb.svc slots=1\n")

    def test_user_wins_in_wrap_mode(self) -> None:
        """In wrap mode the user's own -np, --bind-to, --mca and -x win without duplicates, their
        --hostfile names the rewritten copy, the program's arguments stay untouched, and each
        user win is recorded as a decision."""
        plan = make_plan("openmpi4", "fqdn", "flags")
        argv = argv_of(plan)
        assert plan.wrap
        assert argv.count("-np") == 1 and argv[argv.index("-np") + 1] == "2"
        assert "none" not in pairs(argv, "--bind-to")
        assert pairs(argv, "--mca").count("btl_tcp_if_include") == 1
        assert "NCCL_DEBUG" not in pairs(argv, "-x")  # the user's -x NCCL_DEBUG=WARN stays
        # the user's --hostfile now names the rewritten copy, once
        assert pairs(argv, "--hostfile") == ["/run/mpi-bootstrap/hostfile"]
        # the program's own arguments are untouched
        assert argv[-4:] == ["python3", "train.py", "--mca", "inner"]
        reasons = [d for d in plan.decisions if d.source.startswith("user flag")]
        assert {d.setting for d in reasons} >= {"ranks", "--bind-to", "--mca btl_tcp_if_include"}

    def test_mpich_environment_ends_with_sentinel(self) -> None:
        """MPICH hydra drops the last variable from -genvlist; ours is last, unforwarded."""
        plan = make_plan("mpich", "none", "none")
        env = plan.environment(BASE_ENV)
        assert list(env)[-1] == mpi.ENV_END
        assert mpi.ENV_END not in plan.forwarded
        assert mpi.ENV_END not in make_plan("intel", "none", "none").env_set

    def test_user_env_wins(self) -> None:
        """Intel MPI variables the user set (I_MPI_HYDRA_IFACE, I_MPI_HYDRA_ENV, FI_TCP_IFACE) keep
        the agent from adding -iface, -genvlist or FI_TCP_IFACE."""
        plan = make_plan("intel", "none", "env")
        argv = argv_of(plan)
        assert "-iface" not in argv
        assert "-genvlist" not in argv  # I_MPI_HYDRA_ENV=all chosen by the user
        assert "FI_TCP_IFACE" not in plan.env_set

    def test_not_root_no_allow_run_as_root(self) -> None:
        """--allow-run-as-root is added only when the agent runs as root."""
        assert (
            "--allow-run-as-root" not in make_plan("openmpi4", "none", "none", is_root=False).argv
        )

    def test_no_data_interface(self) -> None:
        """With no net1 or dranet0 the agent leaves NCCL_SOCKET_IFNAME unset: NCCL picks its own."""
        plan = make_plan("openmpi4", "none", "none", interfaces=frozenset({"lo", "eth0"}))
        assert "NCCL_SOCKET_IFNAME" not in plan.env_set

    def test_dranet(self) -> None:
        """A DraNet dranet0 interface becomes NCCL_SOCKET_IFNAME when there is no net1."""
        plan = make_plan(
            "openmpi4", "none", "none", interfaces=frozenset({"lo", "eth0", "dranet0"})
        )
        assert plan.env_set["NCCL_SOCKET_IFNAME"] == "=dranet0"

    def test_text_render_mentions_every_decision(self) -> None:
        """The --explain text names every decision and says nothing was written or started."""
        plan = make_plan("openmpi5", "fqdn", "env")
        text = render.as_text(plan)
        for d in plan.decisions:
            assert d.setting in text
        assert "--explain: nothing was written or started" in text


class TestRender:
    """The human command is copy-pasteable and puts the user's program on its own line."""

    def test_a_newline_starts_no_line(self) -> None:
        """A newline in what others said (here an environment value) is escaped: it
        starts no line of its own that could read as the agent's; the Command block
        keeps its own line breaks (tests/test_printable.py)."""
        plan = make_plan("openmpi4", "none", "none")
        forged = "x\n  forward (none)"
        plan = dataclasses.replace(plan, env_set={**plan.env_set, "X": forged})
        text = render.as_text(plan)
        assert "  set     X=x\\n  forward (none)" in text and text.count("\n  forward ") == 1

    @pytest.mark.parametrize("override", ["none", "flags"])
    def test_command_round_trips(self, override: str) -> None:
        """The Command block shell-splits back to the exact argv, with the user's program alone on
        its last line, whether or not the user gave their own mpirun flags."""
        import shlex

        plan = make_plan("openmpi4", "none", override)
        text = render.as_text(plan)
        block = text.split("Command:\n", 1)[1].split("\n\n", 1)[0]
        assert shlex.split(block.replace("\\\n", " ")) == list(plan.argv)
        program = shlex.join(plan.argv[plan.program_index :])
        assert block.rstrip().splitlines()[-1].strip() == program


class TestSSHTrust:
    """With an exchange, mpirun's ssh is pinned; key material never reaches --explain."""

    PRIVATE = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )

    def plan(
        self,
        kind: str,
        exchange_mode: str,
        *flags: str,
        state: str = "/run/mpi-bootstrap",
        program: tuple[str, ...] = ("python3", "train.py"),
        env_extra: dict[str, str] | None = None,
        local: str | None = None,
        own_kex: tuple[str, ...] = (),
        openssh: str | None = None,
        unresolved: tuple[str, ...] = (),
    ) -> Plan:
        """The two workers' plan; `local`: a host of the hostfile, first, that is this pod
        (mpirun runs its ranks without ssh: no record, no check); `own_kex`: what the
        launcher's ssh takes (`ssh -Q kex`); `openssh`: worker 1's sshd's version;
        `unresolved`: names with no answer yet (a pipelined launch's first Plan)."""

        env = {
            **BASE_ENV,
            "MPI_BOOTSTRAP_EXCHANGE": exchange_mode,
            "MPI_BOOTSTRAP_EXCHANGE_DIR": "/shared/x",
            **(env_extra or {}),
        }
        config = Config.from_env(
            env, ["--state-dir", state, *flags, "launcher", "--", *program], host=HOST
        )
        return TestSSHTrust.plan_with(  # (other classes borrow `plan`)
            self,
            config,
            env,
            kind,
            local=local,
            own_kex=own_kex,
            openssh=openssh,
            unresolved=unresolved,
        )

    def plan_with(
        self,
        config: Config,
        env: dict[str, str],
        kind: str = "openmpi4",
        *,
        local: str | None = None,
        own_kex: tuple[str, ...] = (),
        openssh: str | None = None,
        unresolved: tuple[str, ...] = (),
        v6: tuple[str, ...] = (),
    ) -> Plan:
        """The two workers' plan with `config` and its environment `env` (see `plan`);
        `v6`: names that answer with an IPv6 address only."""
        from mpi_bootstrap.core.model import ClientKey, PlannedFile

        exchange_mode = config.exchange
        text = f"{local} slots=2\n{HOSTFILE}" if local else HOSTFILE
        parsed = hf.parse(text, "/etc/mpi/hostfile")
        answers = {
            n: Answer(n, addresses=(f"fd00::{a.rsplit('.', 1)[1]}" if n in v6 else a,))
            for n, a in ADDRESSES.items()
            if n not in unresolved
        }
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL4FbUREZCX4XJ0cFCw6lRx4ehfW10t1GxS1s/M0/Gl2"
        file = (
            PlannedFile("/run/mpi-bootstrap/id_job", self.PRIVATE, 0o600, "the job's key")
            if exchange_mode == "secret"
            else None
        )
        client = ClientKey("/run/mpi-bootstrap/id_job", key, file)
        recs = {
            n: records.Record(
                n.split(".")[0], (a,), 2222, key, "root", openssh=openssh if "-1." in n else None
            )
            for n, a in ADDRESSES.items()
        }
        facts = Gathered(
            environ=env,
            hostfile=parsed,
            answers=answers,
            mpi=MPIS[kind],
            interfaces=frozenset({"lo", "eth0", "net1"}),
            is_root=True,
            is_pid1=True,
            client=client,
            records=recs,
            remote=tuple(ADDRESSES),
            ssh_kex=own_kex,
        )
        return build_plan(config, facts)

    @pytest.mark.parametrize("kind", sorted(MPIS))
    @pytest.mark.parametrize("mode", ["secret", "dir"])
    def test_pinned(self, kind: str, mode: str) -> None:
        """With a secret or dir exchange, every MPI's ssh uses the agent's 0600 ssh_config (strict
        host keys, BatchMode) and known_hosts from the records: through the launch gate (Open
        MPI's rsh agent, hydra's launcher-exec), with published targets and a preflight."""
        plan = self.plan(kind, mode)
        cfg = next(f for f in plan.files if f.path.endswith("/ssh_config"))
        assert cfg.mode == 0o600
        assert "StrictHostKeyChecking yes" in cfg.text and "BatchMode yes" in cfg.text
        assert "Host pi-worker-0.pi.default.svc 10.1.0.10" in cfg.text
        kh = next(f for f in plan.files if f.path.endswith("/known_hosts"))
        assert kh.text.startswith("pi-worker-0.pi.default.svc ssh-ed25519 ")
        assert plan.ssh_command == ("ssh", "-F", "/run/mpi-bootstrap/ssh_config")
        assert plan.ssh_targets["pi-worker-1.pi.default.svc"] == ("10.1.0.11", 2222)
        assert plan.preflight
        gate = next(f for f in plan.files if f.path == "/run/mpi-bootstrap/ssh-gate")
        assert gate.mode == 0o700 and gate.shown
        assert gate.text.endswith('exec ssh -F /run/mpi-bootstrap/ssh_config "$@"\n')
        assert not any(f.path.endswith("ssh-launcher") for f in plan.files)
        if kind.startswith("openmpi"):
            assert "no_tree_spawn" in " ".join(plan.argv)
            # Every daemon looks the agent's first word up on its own host, where the
            # gate is not (in a container, orted failed and mpirun waited): a shell.
            assert "/bin/sh /run/mpi-bootstrap/ssh-gate" in plan.argv
        else:  # hydra's proxies are given no launcher to look up
            assert "/run/mpi-bootstrap/ssh-gate" in plan.argv

    @pytest.mark.parametrize("kind", sorted(MPIS))
    @pytest.mark.parametrize("flags", [("--exec", "true"), ("--preflight", "off")])
    def test_without_the_gate(self, kind: str, flags: tuple[str, ...]) -> None:
        """Without the gate (--exec, or no preflight), mpirun's ssh is the agent's ssh itself:
        -F for Open MPI, the wrapper for hydra."""
        plan = self.plan(kind, "dir", *flags)
        assert plan.gate is None
        assert not any(f.path.endswith("ssh-gate") for f in plan.files)
        if kind.startswith("openmpi"):
            assert "ssh -F /run/mpi-bootstrap/ssh_config" in plan.argv
        else:
            wrapper = next(f for f in plan.files if f.path.endswith("ssh-launcher"))
            assert "exec ssh -F /run/mpi-bootstrap/ssh_config" in wrapper.text

    def test_ssh_reuse(self, tmp_path: Path) -> None:
        """Preflight's connection is kept for mpirun's ssh: a ControlMaster whose socket lives
        in the private state directory (a socket there is a shell on the worker), for every
        host as real ssh reads the config, and the plan names the directory so it is made
        0700 before any ssh runs."""
        plan = self.plan("openmpi4", "dir")
        for shown in ssh_settings(plan, tmp_path):
            assert "controlmaster auto" in shown
            assert any(s.startswith("controlpath /run/mpi-bootstrap/cm/") for s in shown)
            assert "controlpersist 60" in shown
            assert "stricthostkeychecking true" in shown  # the pinning, for every worker
        assert plan.control_dir == "/run/mpi-bootstrap/cm"
        assert next(d for d in plan.decisions if d.setting == "ssh reuse").value == "on"

    @pytest.mark.parametrize(
        ("flags", "state", "why"),
        [
            (("--ssh-reuse", "off"), "/run/mpi-bootstrap", "disabled"),
            (("--preflight", "off"), "/run/mpi-bootstrap", "no preflight"),
            ((), "/run/" + "d" * 60, "too long for a socket path"),
        ],
    )
    def test_no_ssh_reuse(self, flags: tuple[str, ...], state: str, why: str) -> None:
        """No connection is kept where it is switched off, where there is no preflight to make
        it, or where the socket's path would not fit (ssh would fail every connection)."""
        plan = self.plan("openmpi4", "dir", *flags, state=state)
        cfg = next(f for f in plan.files if f.path.endswith("/ssh_config")).text
        assert "Control" not in cfg
        assert plan.control_dir is None
        decision = next(d for d in plan.decisions if d.setting == "ssh reuse")
        assert decision.value == "off" and why in decision.reason

    NEW_SSH = ("curve25519-sha256", "sntrup761x25519-sha512", "mlkem768x25519-sha256")
    OLD_SSH = ("curve25519-sha256", "sntrup761x25519-sha512@openssh.com", "ecdh-sha2-nistp256")

    @pytest.mark.parametrize(
        ("own", "openssh", "offered", "worker_1"),
        [
            # post-quantum and cheap where both ends take it; an older sshd gets its own
            (NEW_SSH, "9.9", "mlkem768x25519-sha256,curve25519-sha256", None),
            (NEW_SSH, "9.2", "mlkem768x25519-sha256,curve25519-sha256", "curve25519-sha256"),
            (NEW_SSH, None, "mlkem768x25519-sha256,curve25519-sha256", None),  # unknown
            # an sshd that takes neither (before 7.4): ssh's own list there
            (NEW_SSH, "7.2", "mlkem768x25519-sha256,curve25519-sha256", "+curve25519-sha256"),
            # a launcher's ssh before 9.9 offers no name it does not know (ssh would refuse
            # its own config)
            (OLD_SSH, "9.9", "curve25519-sha256", None),
        ],
    )
    def test_kex_the_agents_choice(
        self,
        tmp_path: Path,
        own: tuple[str, ...],
        openssh: str | None,
        offered: str,
        worker_1: str | None,
    ) -> None:
        """Unset, the agent offers mlkem768x25519-sha256 where both ends take it, else
        curve25519-sha256 — never sntrup761x25519 (six times the CPU per handshake) — and
        --explain says why; a worker whose record names an older sshd is offered only what
        it takes, in its own block. Real ssh reads the config back (`ssh -G`)."""
        plan = self.plan("openmpi4", "dir", own_kex=own, openssh=openssh)
        decision = next(d for d in plan.decisions if d.setting == "ssh key exchange")
        assert (decision.value, decision.source) == (offered, "agent default")
        assert "sntrup761x25519" in decision.reason and "SECURITY.md" in decision.reason
        cfg = next(f for f in plan.files if f.path.endswith("/ssh_config")).text
        assert f"KexAlgorithms {offered}" in cfg
        assert (f"KexAlgorithms {worker_1}" in cfg) is (worker_1 is not None)
        if "mlkem" not in "".join(own):  # this machine's ssh (9.2) reads only its names
            for shown in ssh_settings(plan, tmp_path):
                assert f"kexalgorithms {offered}" in shown

    def test_kex_an_sshd_that_takes_neither(self, tmp_path: Path) -> None:
        """A worker whose record names an sshd older than 7.4 (no curve25519-sha256, no
        ML-KEM) is offered ssh's own list, as real ssh reads it back; the others, the
        agent's choice."""
        plan = self.plan("openmpi4", "dir", own_kex=self.OLD_SSH, openssh="7.2")
        own = subprocess.run(
            ["ssh", "-G", "-F", "/dev/null", "x"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        default = next(line for line in own if line.startswith("kexalgorithms "))
        shown = {
            next(line for line in settings if line.startswith("hostkeyalias ")): next(
                line for line in settings if line.startswith("kexalgorithms ")
            )
            for settings in ssh_settings(plan, tmp_path)
        }
        assert shown["hostkeyalias pi-worker-0.pi.default.svc"] == "kexalgorithms curve25519-sha256"
        assert shown["hostkeyalias pi-worker-1.pi.default.svc"] == default
        assert "pi-worker-1.pi.default.svc: its sshd is older" in next(
            d.reason for d in plan.decisions if d.setting == "ssh key exchange"
        )

    def test_kex_default_is_ssh_own(self) -> None:
        """MPI_BOOTSTRAP_SSH_KEX=default keeps ssh's own choice: no KexAlgorithms line; and
        a launcher whose ssh takes none of the agent's (or was not asked) writes none."""
        plan = self.plan("openmpi4", "dir", "--ssh-kex", "default", own_kex=self.NEW_SSH)
        cfg = next(f for f in plan.files if f.path.endswith("/ssh_config")).text
        assert "KexAlgorithms" not in cfg
        decision = next(d for d in plan.decisions if d.setting == "ssh key exchange")
        assert decision.value == "ssh's default" and "sntrup761x25519" in decision.reason
        plan = self.plan("openmpi4", "dir", own_kex=("diffie-hellman-group14-sha256",))
        assert (
            "KexAlgorithms"
            not in next(f for f in plan.files if f.path.endswith("/ssh_config")).text
        )

    def test_kex_set(self, tmp_path: Path) -> None:
        """--ssh-kex applies to every host of the config as real ssh reads it back (ssh -G
        rejects a config whose KexAlgorithms it cannot parse)."""
        plan = self.plan("openmpi4", "dir", "--ssh-kex", "curve25519-sha256")
        decision = next(d for d in plan.decisions if d.setting == "ssh key exchange")
        assert (decision.value, decision.source) == ("curve25519-sha256", "flag --ssh-kex")
        for shown in ssh_settings(plan, tmp_path):
            assert "kexalgorithms curve25519-sha256" in shown

    @pytest.mark.parametrize("bad", ["a b", "curve25519-sha256\nProxyCommand x", "x,,y", ""])
    def test_kex_refused(self, bad: str) -> None:
        """A value that is not a plain list of names (a second config line, spaces) is a
        configuration error naming the variable, never written to the config."""
        env = {"MPI_BOOTSTRAP_ROLE": "launcher", "MPI_BOOTSTRAP_SSH_KEX": bad}
        with pytest.raises(ConfigError) as err:
            Config.from_env(env, [], HOST)
        assert [p for p in err.value.problems if p.startswith("MPI_BOOTSTRAP_SSH_KEX: ")]
        if bad:  # the config writer refuses it too, whoever calls it
            with pytest.raises(UnsafeValue):
                sshconfig.client_config(
                    [], identity="/k", known_hosts="/h", connect_timeout=5, kex=bad
                )

    def test_private_key_never_explained(self) -> None:
        """The job's private key is planned as a 0600 file but appears in neither --explain text nor
        JSON, while the ssh config itself is shown."""
        plan = self.plan("openmpi4", "secret")
        assert any(f.text == self.PRIVATE and f.mode == 0o600 for f in plan.files)
        shown = render.as_json(plan) + render.as_text(plan)
        assert "c2VjcmV0LWtleS1ieXRlcw" not in shown
        assert "PRIVATE KEY" not in shown
        assert "StrictHostKeyChecking yes" in shown  # the config itself is shown


def ssh_settings(plan: Plan, tmp_path: Path) -> list[list[str]]:
    """What real ssh makes of the plan's config (`ssh -G`) for every name a block names,
    one list of lines per name: the options a block leaves out come from `Host *`."""
    cfg = next(f for f in plan.files if f.path.endswith("/ssh_config")).text
    path = tmp_path / "ssh_config"
    path.write_text(cfg)
    hosts = [n for line in cfg.splitlines() if line.startswith("Host ") for n in line.split()[1:]]
    hosts = [h for h in hosts if h != "*"]
    assert hosts
    return [
        subprocess.run(
            ["ssh", "-G", "-F", str(path), host], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for host in hosts
    ]


def test_ssh_goes_to_the_published_address_when_dns_is_stale() -> None:
    """DNS still names an earlier pod: ssh and the sshd wait use the worker's record."""
    from mpi_bootstrap.core.model import ClientKey

    env = {**BASE_ENV, "MPI_BOOTSTRAP_EXCHANGE": "dir", "MPI_BOOTSTRAP_EXCHANGE_DIR": "/x"}
    config = Config.from_env(
        env, ["--state-dir", "/run/mpi-bootstrap", "launcher", "--", "a.out"], host=HOST
    )
    parsed = hf.parse(HOSTFILE, "/etc/mpi/hostfile")
    answers = {n: Answer(n, addresses=(a,)) for n, a in ADDRESSES.items()}
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL4FbUREZCX4XJ0cFCw6lRx4ehfW10t1GxS1s/M0/Gl2"
    recs = {
        n: records.Record(n.split(".")[0], ("10.1.0.99",) if i == 0 else (a,), 2222, key, "root")
        for i, (n, a) in enumerate(ADDRESSES.items())
    }
    facts = Gathered(
        environ=env,
        hostfile=parsed,
        answers=answers,
        mpi=MPIS["openmpi4"],
        interfaces=frozenset({"lo", "eth0"}),
        is_root=True,
        is_pid1=True,
        client=ClientKey("/x/job-key/id", key, None),
        records=recs,
        remote=tuple(ADDRESSES),
    )
    plan = build_plan(config, facts)
    assert plan.ssh_targets["pi-worker-0.pi.default.svc"] == ("10.1.0.99", 2222)
    cfg = next(f for f in plan.files if f.path.endswith("/ssh_config")).text
    assert "  HostName 10.1.0.99\n" in cfg
    warn = next(d for d in plan.decisions if d.setting == "ssh endpoint pi-worker-0.pi.default.svc")
    assert "DNS says 10.1.0.10, the worker published 10.1.0.99" in warn.reason


def params(argv: list[str], flag: str) -> dict[str, str]:
    """{name: value} of `flag NAME VALUE` triples (--mca, --prtemca)."""
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv[:-2]) if a == flag}


def decision(plan: Plan, setting: str) -> Any:
    return next(d for d in plan.decisions if d.setting == setting)


# What CUDA/PyTorch images carry for single-node runs (an Ubuntu 24.04 one, measured).
CUDA_IMAGE_ENV = {
    "OMPI_MCA_plm": "isolated",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "PMIX_MCA_gds": "hash",
}


class TestImageSettings:
    """Settings an image brings that make a multi-host launch impossible are overridden
    for a job with remote hosts (and --explain says so), or stop it with 64 naming the
    variable; a flag in the user's own command still wins; a single-host job keeps them."""

    def test_plm_isolated_is_overridden(self) -> None:
        """An image's OMPI_MCA_plm=isolated becomes --mca plm rsh for a multi-host job, and the
        decision names the variable and the value it overrides."""
        plan = make_plan("openmpi4", "none", "none", env_extra=CUDA_IMAGE_ENV, remote=True)
        assert params(argv_of(plan), "--mca")["plm"] == "rsh"
        d = decision(plan, "--mca plm")
        assert d.source == "env OMPI_MCA_plm"
        assert "overrides OMPI_MCA_plm='isolated'" in d.reason

    def test_plm_kept_on_one_host_and_when_harmless(self) -> None:
        """No --mca plm is added for a single-host job, nor when the image's plm (rsh, ^slurm, none)
        already reaches other hosts; with the launch gate and no plm named anywhere, the
        agent's is pinned (an MCA parameter file may name another: launcher/mpi/gating.py)."""
        for env, remote in (
            (CUDA_IMAGE_ENV, False),
            ({"OMPI_MCA_plm": "rsh"}, True),
            ({"OMPI_MCA_plm": "^slurm"}, True),
            ({}, False),
        ):
            plan = make_plan("openmpi4", "none", "none", env_extra=env, remote=remote)
            assert "plm" not in params(argv_of(plan), "--mca"), (env, remote)
        plan = make_plan("openmpi4", "none", "none", remote=True)
        assert plan.gate == gate.EACH and params(argv_of(plan), "--mca")["plm"] == "rsh"

    def test_users_own_plm_flag_wins(self) -> None:
        """A --mca plm in the user's own mpirun command is kept once as given, even isolated."""
        plan = make_plan(
            "openmpi4",
            "none",
            "none",
            env_extra=CUDA_IMAGE_ENV,
            remote=True,
            program=["mpirun", "--mca", "plm", "isolated", "./a.out"],
        )
        argv = argv_of(plan)
        assert argv.count("plm") == 1 and argv[argv.index("plm") + 1] == "isolated"
        assert decision(plan, "--mca plm").source == "user flag --mca plm"

    def test_openmpi5_prte_plm(self) -> None:
        """Open MPI 5 overrides PRTE_MCA_plm=isolated with --prtemca plm ssh, and notes that
        OMPI_MCA_plm is ignored there."""
        plan = make_plan(
            "openmpi5",
            "none",
            "none",
            remote=True,
            env_extra={"PRTE_MCA_plm": "isolated", "OMPI_MCA_plm": "isolated"},
        )
        assert params(argv_of(plan), "--prtemca")["plm"] == "ssh"
        assert "ignored by Open MPI 5" in decision(plan, "env OMPI_MCA_plm").reason

    @pytest.mark.parametrize(
        ("value", "overridden"),
        [
            ("self,vader", True),
            ("self,sm", True),
            ("vader,self,tcp", False),
            ("^openib", False),
            ("^tcp", True),
        ],
    )
    def test_on_node_btl(self, value: str, overridden: bool) -> None:
        """An OMPI_MCA_btl of on-node transports only (self, vader, sm, or ^tcp) becomes self,tcp
        for a multi-host job; a list that reaches other hosts is kept."""
        plan = make_plan("openmpi4", "none", "none", env_extra={"OMPI_MCA_btl": value}, remote=True)
        assert (params(argv_of(plan), "--mca").get("btl") == "self,tcp") == overridden

    @pytest.mark.parametrize(
        ("kind", "var", "flag"),
        [
            ("mpich", "HYDRA_LAUNCHER", "-launcher"),
            ("intel", "I_MPI_HYDRA_BOOTSTRAP", "-bootstrap"),
        ],
    )
    def test_hydra_fork_launcher(self, kind: str, var: str, flag: str) -> None:
        """An image's hydra fork launcher (HYDRA_LAUNCHER, I_MPI_HYDRA_BOOTSTRAP) is overridden with
        ssh for a multi-host job, saying so; a user's ssh choice gets no agent flag."""
        plan = make_plan(kind, "none", "none", env_extra={var: "fork"}, remote=True)
        argv = argv_of(plan)
        assert argv[argv.index(flag) + 1] == "ssh"
        assert f"overrides {var}='fork'" in decision(plan, flag).reason
        plan = make_plan(kind, "none", "none", env_extra={var: "ssh"}, remote=True)
        assert flag not in argv_of(plan)  # the user's ssh: theirs

    @pytest.mark.parametrize("kind", ["intel", "mpich"])
    def test_fi_provider_shm_stops_a_multi_host_job(self, kind: str) -> None:
        """FI_PROVIDER=shm stops a multi-host OFI job with a ConfigError naming the variable; a
        single-host job with it still plans."""
        from mpi_bootstrap.core.errors import ConfigError

        info = dataclasses.replace(MPIS[kind], devices=("ucx", "ofi"))
        with pytest.raises(ConfigError) as err:
            make_plan(
                kind, "none", "none", env_extra={"FI_PROVIDER": "shm"}, remote=True, mpi_info=info
            )
        assert "FI_PROVIDER='shm'" in err.value.message
        make_plan(kind, "none", "none", env_extra={"FI_PROVIDER": "shm"}, mpi_info=info)

    def test_noprefix_when_mpirun_is_in_usr(self) -> None:
        """Open MPI installed in /usr gets --noprefix instead of --prefix, so ranks keep the
        forwarded PATH; a --prefix of the user's own wins."""
        info = dataclasses.replace(MPIS["openmpi4"], mpirun="/usr/bin/mpirun", prefix="/usr")
        plan = make_plan("openmpi4", "none", "none", mpi_info=info)
        argv = argv_of(plan)
        assert "--noprefix" in argv and "--prefix" not in argv
        plan = make_plan(
            "openmpi4",
            "none",
            "none",
            mpi_info=info,
            program=["mpirun", "--prefix", "/usr", "./a.out"],
        )
        assert "--noprefix" not in argv_of(plan)  # the user's --prefix wins


class TestMPICHNetmod:
    """MPICH built with both netmods gets OFI (tcp provider, control interface): its UCX
    netmod hung across pods; a user's MPIR_CVAR_CH4_NETMOD wins; a UCX-only build keeps
    UCX, TCP only."""

    def test_ofi_by_default(self) -> None:
        """MPICH built with ucx and ofi gets the OFI netmod, FI_PROVIDER=tcp and FI_TCP_IFACE on the
        control NIC, all forwarded, and no UCX_NET_DEVICES."""
        info = dataclasses.replace(MPIS["mpich"], devices=("ucx", "ofi"))
        plan = make_plan("mpich", "none", "none", mpi_info=info, env_extra={"UCX_TLS": "x"})
        assert {
            k: plan.env_set.get(k)
            for k in ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_NET_DEVICES")
        } == {
            "MPIR_CVAR_CH4_NETMOD": "ofi",
            "FI_PROVIDER": "tcp",
            "FI_TCP_IFACE": "eth0",
            "UCX_NET_DEVICES": None,
        }
        assert "MPIR_CVAR_CH4_NETMOD" in plan.forwarded and "FI_PROVIDER" in plan.forwarded

    def test_user_ucx_wins(self) -> None:
        """A user's MPIR_CVAR_CH4_NETMOD=ucx is kept, and UCX is pinned to the control NIC."""
        info = dataclasses.replace(MPIS["mpich"], devices=("ucx", "ofi"))
        plan = make_plan(
            "mpich", "none", "none", mpi_info=info, env_extra={"MPIR_CVAR_CH4_NETMOD": "ucx"}
        )
        assert "MPIR_CVAR_CH4_NETMOD" not in plan.env_set
        assert plan.env_set["UCX_NET_DEVICES"] == "eth0"

    def test_ucx_only_build(self) -> None:
        """A UCX-only MPICH build gets no netmod setting, and UCX is pinned to the control NIC."""
        info = dataclasses.replace(MPIS["mpich"], devices=("ucx",))
        plan = make_plan("mpich", "none", "none", mpi_info=info)
        assert "MPIR_CVAR_CH4_NETMOD" not in plan.env_set
        assert plan.env_set["UCX_NET_DEVICES"] == "eth0"

    def test_devices_parsed(self) -> None:
        """MPICH's netmods are read from the --with-device=ch4:... line of its version output."""
        text = (
            "HYDRA build details:\n    Version:  5.0.2\n    Configure options: "
            "--with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
        )
        info = mpi.identify(text, "/x/mpirun", "auto", "default", prefix="/x")
        assert info.devices == ("ucx", "ofi")


class TestLaunchGate:
    """Whether mpirun starts beside the checks, and what its ssh to each worker waits for
    (core/gate.py); `--explain` says so in the `launch gate` decision."""

    PRIVATE = TestSSHTrust.PRIVATE
    plan = TestSSHTrust.plan  # the same workers, records and key

    @staticmethod
    def decision(plan: Plan) -> tuple[str, str]:
        d = next(d for d in plan.decisions if d.setting == "launch gate")
        return d.value, d.reason

    @pytest.mark.parametrize("kind", ["openmpi4", "openmpi5"])
    def test_open_mpi_each_worker_and_the_last_for_all(self, kind: str) -> None:
        """Open MPI: each worker's ssh waits for its own check, the last worker's for every
        check and the data check (no rank before every daemon reported)."""
        plan = self.plan(kind, "dir")
        value, why = self.decision(plan)
        assert (plan.gate, value) == (gate.EACH, "on")
        assert "the one to pi-worker-1.pi.default.svc also for every check" in why
        text = next(f.text for f in plan.files if f.path.endswith("ssh-gate"))
        assert '[ "$h" = pi-worker-1.pi.default.svc ]' in text

    def test_the_gate_for_all_is_a_resolved_workers(self) -> None:
        """In a pipelined launch's first Plan the last name may not have resolved yet, and
        may turn out to be this pod (no ssh, so its gate would never run and hold nothing
        back): the gate that also waits for every check is the last resolved worker's."""
        plan = self.plan("openmpi4", "dir", unresolved=("pi-worker-1.pi.default.svc",))
        assert (
            "the one to pi-worker-0.pi.default.svc also for every check" in (self.decision(plan)[1])
        )
        text = next(f.text for f in plan.files if f.path.endswith("ssh-gate"))
        assert '[ "$h" = pi-worker-0.pi.default.svc ]' in text

    @pytest.mark.parametrize("kind", ["mpich", "intel"])
    def test_hydra_reads_the_addresses_the_agent_checked(self, kind: str) -> None:
        """hydra resolves every name itself to tell this pod's hosts, and a second DNS
        answer naming this pod would start a worker's ranks here without ssh: it reads
        the workers' IPv4 addresses, which ssh knows them by too (SECURITY.md 32); one
        with only an IPv6 address, which no hostfile takes, turns the gate off."""
        plan = self.plan(kind, "dir")
        assert "10.1.0.10" in plan.hostfile_text and "pi-worker" not in plan.hostfile_text
        cfg = next(f.text for f in plan.files if f.path.endswith("/ssh_config"))
        assert "Host pi-worker-0.pi.default.svc 10.1.0.10\n" in cfg
        config = Config.from_env(
            {**BASE_ENV, "MPI_BOOTSTRAP_EXCHANGE": "dir", "MPI_BOOTSTRAP_EXCHANGE_DIR": "/x"},
            ["--state-dir", "/run/mpi-bootstrap", "launcher", "--", "python3", "t.py"],
            host=HOST,
        )
        v6 = TestSSHTrust.plan_with(self, config, {}, kind, v6=("pi-worker-1.pi.default.svc",))
        value, why = self.decision(v6)
        assert (v6.gate, value) == (None, "off"), why
        assert "pi-worker-1.pi.default.svc has no IPv4 address to give mpirun" in why

    def test_orte_tells_its_own_node_by_name_alone(self) -> None:
        """ORTE would resolve a hostfile name to see whether it is this pod: the gate pins
        `if_base_do_not_resolve` (over a value from the image's environment); the user's
        own flag for it turns the gate off."""
        plan = self.plan("openmpi4", "dir")
        assert shlex.join(["--mca", "if_base_do_not_resolve", "1"]) in shlex.join(plan.argv)
        env = {"OMPI_MCA_if_base_do_not_resolve": "0"}
        assert "if_base_do_not_resolve" in self.plan("openmpi4", "dir", env_extra=env).argv
        theirs = ("mpirun", "--mca", "if_base_do_not_resolve", "0", "python3", "t.py")
        value, why = self.decision(self.plan("openmpi4", "dir", program=theirs))
        assert value == "off" and "ORTE may take a worker's name for this pod" in why, why

    @pytest.mark.parametrize("kind", ["mpich", "intel"])
    def test_hydra_every_worker_waits_for_all(self, kind: str) -> None:
        """hydra: a proxy starts its ranks as soon as it connects, so every ssh waits."""
        plan = self.plan(kind, "dir")
        value, why = self.decision(plan)
        assert (plan.gate, value) == (gate.EVERY, "on")
        assert "every worker's ssh waits for every check" in why

    @pytest.mark.parametrize(
        ("flags", "program", "why"),
        [
            (("--exec", "true"), ("python3", "t.py"), "--exec: no resident supervisor"),
            (("--preflight", "off"), ("python3", "t.py"), "no checks to wait for"),
            (
                (),
                ("mpirun", "--mca", "plm_rsh_agent", "ssh -p 22", "python3", "t.py"),
                "the user's own ssh agent",
            ),
        ],
    )
    def test_off(self, flags: tuple[str, ...], program: tuple[str, ...], why: str) -> None:
        """No gate where nothing would carry the checks beside mpirun, or where mpirun's ssh
        is the user's (it would not wait): the checks then run first."""
        plan = self.plan("openmpi4", "dir", *flags, program=program)
        value, reason = self.decision(plan)
        assert (plan.gate, value) == (None, "off") and why in reason, reason
        assert not any(f.path.endswith("ssh-gate") for f in plan.files)

    @pytest.mark.parametrize(
        ("kind", "program", "env", "local", "why"),
        [
            # hydra forks the proxy of a host that is mpirun's own: its ranks start at once
            ("mpich", (), {}, "localhost", "localhost in the hostfile is this pod: hydra forks"),
            ("intel", (), {}, "10.1.0.9", "10.1.0.9 in the hostfile is this pod"),
            ("mpich", ("mpiexec", "-launcher", "fork", "a.out"), {}, None, "launcher 'fork'"),
            ("intel", ("mpirun", "-hosts", "a,b", "a.out"), {}, None, "user flag -hosts"),
            ("mpich", ("mpiexec", "-localhost", "x", "a.out"), {}, None, "user flag -localhost"),
            # ORTE's --novm: daemons only where ranks go, and none for this pod's ranks
            ("openmpi4", ("mpirun", "--novm", "a.out"), {}, "localhost", "user flag --novm"),
            ("openmpi4", (), {"OMPI_MCA_orte_no_vm": "1"}, "localhost", "env OMPI_MCA_orte_no_vm"),
            ("openmpi4", ("mpirun", "-H", "a,b", "a.out"), {}, None, "user flag -H"),
            ("openmpi4", (), {"OMPI_MCA_orte_default_dash_host": "a"}, None, "env OMPI_MCA_orte"),
            ("openmpi4", ("mpirun", "--mca", "plm", "slurm", "a.out"), {}, None, "plm 'slurm'"),
            ("openmpi5", ("mpirun", "--rankfile", "r", "a.out"), {}, None, "--rankfile"),
            ("openmpi5", ("mpirun", "--max-vm-size", "1", "a"), {}, "localhost", "--max-vm-size"),
        ],
    )
    def test_off_where_a_rank_can_start_without_it(
        self, kind: str, program: tuple[str, ...], env: dict[str, str], local: str | None, why: str
    ) -> None:
        """No gate where a rank can start without mpirun's ssh (launcher/mpi/gating.py): a
        host of the hostfile that is this pod where that runtime starts its ranks without a
        daemon that waits, a launcher or host list of the user's; the plan says why."""
        plan = self.plan(kind, "dir", program=program or ("a.out",), env_extra=env, local=local)
        value, reason = self.decision(plan)
        assert (plan.gate, value) == (None, "off") and why in reason, reason
        assert reason.endswith(": the checks, if any, run first, then mpirun"), reason
        assert not any(f.path.endswith("ssh-gate") for f in plan.files)
        assert not any("ssh-gate" in a for a in plan.argv), plan.argv

    @pytest.mark.parametrize(
        ("kind", "program", "env", "why"),
        [
            ("openmpi4", ("mpirun", "--novm", "-np", "1", "a.out"), {}, "user flag --novm"),
            ("openmpi4", ("mpirun", "-max-vm-size", "1", "a.out"), {}, "-max-vm-size"),
            ("openmpi4", ("mpirun", "--mca", "state_novm_select", "1", "a"), {}, "--mca state"),
            ("openmpi4", (), {"OMPI_MCA_orte_max_vm_size": "1"}, "env OMPI_MCA_orte_max_vm"),
            ("openmpi5", ("mpirun", "--max-vm-size", "1", "a.out"), {}, "--max-vm-size"),
        ],
    )
    def test_every_worker_waits_where_daemons_start_only_on_some(
        self, kind: str, program: tuple[str, ...], env: dict[str, str], why: str
    ) -> None:
        """ORTE's --novm (and --max-vm-size) starts daemons only on some hosts, so one that
        waits for all may never start: every gate waits for every check (no host of the
        hostfile is this pod, so every rank needs a daemon, and every daemon the gate)."""
        plan = self.plan(kind, "dir", program=program or ("a.out",), env_extra=env)
        value, reason = self.decision(plan)
        assert (plan.gate, value) == (gate.EVERY, "on") and why in reason, reason
        assert "every worker's ssh waits for every check" in reason
        text = next(f.text for f in plan.files if f.path.endswith("ssh-gate"))
        assert text.count(f"pass {gate.ALL}\n") == 1 and 'pass "$h"' not in text
        assert "orte_no_vm" not in plan.argv and "orte_max_vm_size" not in plan.argv

    @pytest.mark.parametrize("local", [None, "localhost"])
    def test_orte_virtual_machine_is_pinned(self, local: str | None) -> None:
        """ORTE, mode EACH: a daemon on every host of the hostfile before any rank, started
        over ssh, whatever an MCA parameter file says (the command line wins over it); with
        this pod in the hostfile too (its ranks start once every daemon has reported).
        PRRTE has no no-VM setting to pin, its plm is."""
        plan = self.plan("openmpi4", "dir", local=local)
        assert plan.gate == gate.EACH
        mca = params(list(plan.argv), "--mca")
        assert (mca["orte_no_vm"], mca["orte_max_vm_size"], mca["plm"]) == ("0", "0", "rsh")
        assert list(plan.argv).count("orte_no_vm") == 1
        plan5 = self.plan("openmpi5", "dir", local=local)
        assert plan5.gate == gate.EACH
        assert not any("vm" in a for a in plan5.argv), plan5.argv
        assert params(list(plan5.argv), "--prtemca")["plm"] == "ssh"

    def test_no_host_name_collides_with_a_mark(self) -> None:
        """The agent's own marks begin with a dot, which no host name can: hosts named `all`
        and `failed` get marks of their own, and the gate refuses a host word with a dot
        in front."""
        assert gate.ALL.startswith(".") and gate.FAILED.startswith(".")
        for name in ("all", "failed", "all.ok", "failed.wake"):
            assert gate.mark(name) not in (gate.ALL, gate.FAILED)
        for bad in (gate.ALL, gate.FAILED, ".x"):
            if bad != gate.ALL:
                with pytest.raises(ValueError):
                    gate.mark(bad)
        text = gate.script("/run/s", ("ssh",), gate.EACH, "all")
        assert '[ "$h" = all ]' in text and "pass .all; fi" in text


class TestLaunchOrder:
    """Whether the launcher takes each worker as it arrives (launcher/pipeline.py) or every
    worker first; `--explain` says which and why (the `launch order` decision)."""

    plan = TestSSHTrust.plan  # the same workers, records and key
    PRIVATE = TestSSHTrust.PRIVATE

    @staticmethod
    def decision(plan: Plan) -> tuple[str, str]:
        d = next(d for d in plan.decisions if d.setting == "launch order")
        return d.value, d.reason

    @pytest.mark.parametrize(
        ("kind", "then"),
        [
            ("openmpi4", "its daemon starts through the gate as its checks pass"),
            ("openmpi5", "its daemon starts through the gate as its checks pass"),
            ("mpich", "mpirun's ssh waits for every check"),
            ("intel", "mpirun's ssh waits for every check"),
        ],
    )
    def test_pipelined_behind_the_gate(self, kind: str, then: str) -> None:
        """Behind the launch gate, each worker is taken as it arrives; Open MPI's daemons
        start as their workers pass, hydra's proxies wait for every check."""
        plan = self.plan(kind, "dir")
        value, why = self.decision(plan)
        assert (plan.pipeline, value) == (True, "pipelined"), why
        assert then in why and "no rank starts before every worker passed every check" in why

    @pytest.mark.parametrize(
        ("flags", "why"),
        [
            (("--pipeline", "off"), "disabled: every name resolves"),
            (("--rewrite", "ip"), "--rewrite ip writes the addresses"),
            (("--exec", "true"), "no launch gate"),
            (("--preflight", "off"), "no launch gate"),
        ],
    )
    def test_every_worker_first(self, flags: tuple[str, ...], why: str) -> None:
        """Where the plan needs every answer (the IP rewrite), has no gate to hold the
        ranks, or is told not to: every name and record first, as the decision says."""
        plan = self.plan("openmpi4", "dir", *flags)
        value, reason = self.decision(plan)
        assert (plan.pipeline, value) == (False, "every worker first")
        assert why in reason, reason

    @pytest.mark.parametrize("kind", ["openmpi4", "mpich"])
    def test_explain_shows_the_first_plan(self, kind: str) -> None:
        """--explain of a pipelined launch says the Plan mpirun starts from first: the
        first worker's alone (its answer and record); none where every worker is first."""
        plan = self.plan(kind, "dir", "--explain")
        (d,) = [d for d in plan.decisions if d.setting == "first plan"]
        assert d.value == "mpirun as below", d.reason
        assert d.reason.startswith("from pi-worker-0.pi.default.svc's record alone"), d.reason
        ordered = self.plan(kind, "dir", "--explain", "--pipeline", "off")
        assert not [d for d in ordered.decisions if d.setting == "first plan"]
        assert plan.argv == self.plan(kind, "dir").argv
        later = dataclasses.replace(plan, env_set={**plan.env_set, "NCCL_IB_HCA": "=mlx5_1"})
        assert changes(plan, later) == ["environment"] and changes(plan, plan) == []


class TestLocalRule:
    """mpirun's rule for a host it runs without ssh, which decides preflight's hosts too."""

    @pytest.mark.parametrize(
        ("name", "address", "local"),
        [
            ("launcher-0", "10.1.0.9", True),  # the pod's own hostname
            ("launcher-0.job.default.svc", None, True),
            ("localhost", None, True),
            ("w", "127.0.0.1", True),  # lo's address is the pod's own
            ("w", "10.1.0.5", True),  # eth0's
            ("w", "127.0.0.2", False),  # loopback, but no interface holds it: ssh
            ("w", "::1", True),
            ("w", "10.1.0.6", False),
            ("w", None, False),
        ],
    )
    def test_local(self, name: str, address: str | None, local: bool) -> None:
        from mpi_bootstrap.ssh.peers import is_local

        own = frozenset({"127.0.0.1", "::1", "10.1.0.5"})
        assert is_local(name, address, "launcher-0", own) is local


# A fifth runtime, defined here alone: a hydra-like MPI that takes its hostfile as
# `host:N`, starts `acme_proxy` over ssh through one launcher path, and forwards variables
# as one list.
ACME = Runtime(
    name="acmerte",
    vendor="acme",
    version=re.compile(r"Acme MPI (\d\S*)"),
    choices=("acme",),
    daemons=("acme_proxy",),
    hostfile_form=hf.HYDRA,
    options=MappingProxyType({"n": 1, "f": 1, "hosts": 1, "launch-exec": 1, "nic": 1, "env": 1}),
    rows=(
        Ranks("-n", ("n",)),
        Hostfile("-f", ("f",), ("hosts",), ("ACME_HOSTFILE",)),
        LaunchExec("-launch-exec", "ACME_LAUNCH_EXEC", ("launch-exec",), ()),
        Default(
            "-nic",
            ("-nic", "{control_iface}"),
            "proxies wire up on the pod network",
            flags=("nic",),
            env=("ACME_NIC",),
        ),
        EnvDefault("ACME_AS_ROOT", "1", "running as root", when=lambda f: f.is_root),
    ),
    gate=Gate(
        host_lists=Default("", (), "", flags=("hosts",)),
        each=False,
        why="an acme proxy starts its ranks as soon as it connects",
        local="{local} in the hostfile is this pod: acme starts its ranks without ssh",
    ),
    forward=NameList("-envlist", ("envlist", "envall")),
)
ACME_VERSION = "Acme MPI 7.1 (build 3)\n"


class TestAFifthExchange:
    """An exchange is one descriptor (core/exchanges.py): one defined in this test alone
    is planned by the real planner — what it does is asked of its descriptor, its name is
    compared nowhere."""

    def test_planned(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A `vault` exchange whose key is the launcher's own and whose records are fetched:
        ssh is pinned through the launch gate, preflight claims every worker, and
        --explain's `ssh trust` says how, in the descriptor's words."""
        from mpi_bootstrap.core import exchanges

        vault = exchanges.Exchange(
            "vault",
            exchanges.OWN,
            exchanges.FETCHED,
            needs="token",
            trust="records from the vault on port {c.exchange_port}",
        )
        monkeypatch.setitem(exchanges.EXCHANGES, "vault", vault)
        base = TestSSHTrust().plan("openmpi4", "net")
        env = {**BASE_ENV, "MPI_BOOTSTRAP_TOKEN": "t" * 16}
        config = Config.from_env(
            env,
            ["--state-dir", "/run/mpi-bootstrap", "launcher", "--", "python3", "train.py"],
            host=HOST,
        )
        config = dataclasses.replace(config, exchange="vault")
        assert config.ex is vault
        plan = TestSSHTrust().plan_with(config, env)
        assert (
            plan.ssh_command == base.ssh_command == ("ssh", "-F", "/run/mpi-bootstrap/ssh_config")
        )
        assert plan.preflight and config.ex.keyed  # a claim key (launcher/pipeline.py)
        trust = next(d for d in plan.decisions if d.setting == "ssh trust")
        assert trust.value == "vault"
        assert trust.reason.startswith(f"records from the vault on port {config.exchange_port}")


class TestAFifthRuntime:
    """A runtime is one descriptor (core/runtimes/): one defined in this file alone is
    detected from its `mpirun --version` and planned by the real planner."""

    @staticmethod
    def info(choice: str = "auto") -> mpi.MPIInfo:
        return mpi.identify(
            ACME_VERSION,
            "/opt/acme/bin/mpirun",
            choice,
            "default" if choice == "auto" else "env MPI_BOOTSTRAP_MPI",
            prefix="/opt/acme",
            runtimes=(*mpi.RUNTIMES, ACME),
        )

    def test_detected(self) -> None:
        """Its version line picks it (or its MPI_BOOTSTRAP_MPI word does); without its row
        the same output is a ConfigError naming what mpirun said."""
        info = self.info()
        assert (info.runtime, info.vendor, info.version) == (ACME, "acme", "7.1")
        assert self.info("acme").runtime is ACME
        with pytest.raises(ConfigError, match=r"said 'Acme MPI 7\.1 \(build 3\)'"):
            mpi.identify(ACME_VERSION, "/opt/acme/bin/mpirun", "auto", "default", prefix="/x")

    def test_planned(self) -> None:
        """Its rows make the argv, in order, with the facts filled in; its hostfile form,
        forwarding and the agent's ssh wrapper come from its fields."""
        # make_plan's kind picks only the user overrides, none here: mpi_info is the MPI.
        plan = make_plan("mpich", "none", "none", mpi_info=self.info())
        assert list(plan.argv) == [
            "/opt/acme/bin/mpirun",
            "-n",
            "4",
            "-f",
            "/run/mpi-bootstrap/hostfile",
            "-launch-exec",
            "/run/mpi-bootstrap/ssh-launcher",
            "-nic",
            "eth0",
            "-envlist",
            "LD_LIBRARY_PATH,NCCL_DEBUG,NCCL_IB_DISABLE,NCCL_SOCKET_IFNAME,PATH,UCX_TLS",
            "python3",
            "train.py",
        ]
        assert plan.hostfile_text == "pi-worker-0.pi.default.svc:2\npi-worker-1.pi.default.svc:2\n"
        assert plan.env_set["ACME_AS_ROOT"] == "1"
        assert any(f.path == "/run/mpi-bootstrap/ssh-launcher" for f in plan.files)
        said = {d.setting: (d.value, d.source) for d in plan.decisions}
        assert said["mpi"] == ("acme 7.1", "detected")
        assert said["-nic"] == ("eth0", "agent default")
        assert (
            "ACME_AS_ROOT"
            not in make_plan("mpich", "none", "none", mpi_info=self.info(), is_root=False).env_set
        )

    def test_the_user_wins(self) -> None:
        """Its options are read from the user's own command by its arities, and the user's
        setting wins over its default."""
        program = ["mpirun", "-nic", "eth1", "-env", "X", "./a.out", "-nic", "inner"]
        plan = make_plan("mpich", "none", "none", mpi_info=self.info(), program=program)
        assert plan.argv[plan.program_index :] == ("./a.out", "-nic", "inner")
        assert plan.argv.count("eth0") == 0
        nic = next(d for d in plan.decisions if d.setting == "-nic")
        assert (nic.value, nic.source) == ("(user's)", "user flag -nic")

    def test_gated_and_checked(self) -> None:
        """Its gate holds every rank (a proxy starts its ranks as soon as it connects),
        and preflight looks for its daemon on every worker."""
        plan = make_plan("mpich", "none", "none", mpi_info=self.info(), remote=True)
        assert plan.gate == gate.EVERY
        assert "/run/mpi-bootstrap/ssh-gate" in plan.argv
        why = next(d.reason for d in plan.decisions if d.setting == "launch gate")
        assert "an acme proxy starts its ranks as soon as it connects" in why
        # A host of the hostfile that is this pod: its proxy would start without ssh.
        config = Config.from_env(BASE_ENV, ["launcher", "--", "a.out"], host=HOST)
        parsed = hf.parse(f"launcher-0:1\n{HOSTFILE}", "/etc/mpi/hostfile")
        answers = {h.name: Answer(h.name, addresses=("10.1.0.9",)) for h in parsed.hosts}
        facts = Gathered(
            environ=BASE_ENV,
            hostfile=parsed,
            answers=answers,
            mpi=self.info(),
            interfaces=frozenset({"lo", "eth0"}),
            is_root=True,
            is_pid1=True,
            remote=tuple(ADDRESSES),
        )
        local = build_plan(config, facts)
        why = next(d.reason for d in local.decisions if d.setting == "launch gate")
        assert local.gate is None and "launcher-0 in the hostfile is this pod: acme" in why
        script = remotecheck.RemoteCheck(self.info(), prefix=None, want_ld=None).script()
        assert "DAEMON acme_proxy" in script


class TestDescriptors:
    """What every runtime descriptor must hold for detection and resolving to read it."""

    def test_every_kind_of_row_is_read(self) -> None:
        """launcher/mpi/resolve.py has a reader for each kind of row."""
        assert set(READERS) == set(typing.get_args(Row))

    @pytest.mark.parametrize("runtime", mpi.RUNTIMES, ids=repr)
    def test_chosen_alone_by_a_word_of_its_own(self, runtime: Runtime) -> None:
        """A runtime has an MPI_BOOTSTRAP_MPI word that chooses it alone, and a word it
        shares (`openmpi`) is shared with runtimes of its own vendor only."""
        others = [r for r in mpi.RUNTIMES if r is not runtime]
        assert any(all(c not in r.choices for r in others) for c in runtime.choices)
        for r in others:
            if set(r.choices) & set(runtime.choices):
                assert r.vendor == runtime.vendor

    def test_the_lists_drawn_from_them(self) -> None:
        """The settings' choices and the daemons' names are the descriptors', in the order
        --help and the explainer have always had."""
        assert MPI_CHOICES == ("auto", "openmpi", "openmpi4", "openmpi5", "mpich", "intel")
        assert failures.DAEMONS == ("orted", "prted", "hydra_pmi_proxy", "hydra_bstrap_proxy")
