"""The settings table: every flag and variable the agent reads, its parser and default.

One row per setting (`SETTINGS`); the command line (core/cmdline.py) and `--help`
(core/helptext.py) are generated from it, and
`core.config` reads a run's values through it. Pure: nothing here reads the system.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mpi_bootstrap.core import runtimes
from mpi_bootstrap.core import values as v
from mpi_bootstrap.core.termination import DEFAULT_PATH as DEFAULT_TERMINATION_LOG

ROLES = ("launcher", "worker", "probe", "doctor")
# Names a secondary "fast" NIC gets: Multus/SR-IOV attaches `net1`, DraNet `dranet0`.
DATA_IFACE_CANDIDATES = ("net1", "dranet0")
# The port MPI Operator's base images run sshd on: the secret exchange's fixed port
# (no exchange tells the launcher another).
SECRET_SSHD_PORT = 2222
REWRITE_MODES = ("none", "fqdn", "ip")
EXCHANGE_MODES = ("auto", "secret", "dir", "net", "none")
MPI_CHOICES = ("auto", *runtimes.CHOICES)  # auto, openmpi, openmpi4, openmpi5, mpich, intel
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")

# ---------------------------------------------------------------- the settings table

@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its flag, the variables that may set it (first wins), its default."""

    name: str
    flag: str | None
    envs: tuple[str, ...]
    default: Any
    parse: Callable[[str], Any]
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("hostfile", "--hostfile", ("MPI_HOSTFILE",), "/etc/mpi/hostfile", v.path,
            "hostfile to read (never modified)"),
    Setting("output_hostfile", "--output-hostfile", ("MPI_BOOTSTRAP_OUTPUT_HOSTFILE",),
            None, v.path,
            "where the rewritten hostfile is written (default: STATE_DIR/hostfile); the "
            "original text goes to PATH.orig"),
    Setting("dns_wait_seconds", "--dns-wait-seconds", ("MPI_DNS_WAIT_SECONDS",), 120.0,
            v.seconds, "hard deadline for every host to resolve (0 = one round)"),
    Setting("dns_wait_interval", "--dns-wait-interval", ("MPI_DNS_WAIT_INTERVAL",), 3.0,
            v.positive_seconds,
            "paces re-polling: at most max(20, hosts/interval) lookups per second"),
    # 32: as fast as 64 here, and each lookup sends two queries (A and AAAA); at ~100
    # in flight dnsmasq's receive buffer overflowed and glibc waited out 5 s timeouts.
    Setting("dns_concurrency", "--dns-concurrency", ("MPI_BOOTSTRAP_DNS_CONCURRENCY",), 32,
            v.positive_int, "lookups in flight at once"),
    Setting("rewrite", "--rewrite", ("MPI_BOOTSTRAP_REWRITE",), "none",
            v.choice(REWRITE_MODES), "rewrite hostnames: none, fqdn (x.svc → x.svc.DOMAIN), ip"),
    Setting("rewrite_fqdn_legacy", None, ("REWRITE_MPI_HOSTFILE_FQDN",), False, v.boolean,
            "legacy switch: true means --rewrite fqdn"),
    Setting("cluster_domain", "--cluster-domain", ("MPI_BOOTSTRAP_CLUSTER_DOMAIN",),
            "cluster.local", v.domain, "Kubernetes cluster domain"),
    Setting("control_iface", "--control-iface", ("MPI_BOOTSTRAP_CONTROL_IFACE",), "eth0",
            v.iface, "interface for ssh and MPI control traffic"),
    Setting("data_iface", "--data-iface", ("MPI_BOOTSTRAP_DATA_IFACE",), None, v.iface,
            "data NIC the agent gives NCCL when NCCL_SOCKET_IFNAME is unset (default: net1 or "
            "dranet0 if present)"),
    Setting("mpi", "--mpi", ("MPI_BOOTSTRAP_MPI",), "auto", v.choice(MPI_CHOICES),
            "which MPI (auto = detect from `mpirun --version`)"),
    Setting("mpirun", "--mpirun", ("MPI_BOOTSTRAP_MPIRUN",), None, v.path,
            "mpirun to use (default: `mpirun` on PATH)"),
    Setting("forward_env", "--forward-env", ("MPI_BOOTSTRAP_FORWARD_ENV",), (), v.patterns,
            "extra variables to forward: NAME or PREFIX*, comma separated"),
    Setting("np", "--np", ("MPI_BOOTSTRAP_NP",), None, v.positive_int,
            "number of ranks (default: sum of slots)"),
    Setting("startup_timeout", "--startup-timeout", ("MPI_BOOTSTRAP_STARTUP_TIMEOUT",), 300.0,
            v.seconds, "Open MPI 4: abort if daemons do not report back in time (0 = never)"),
    Setting("ssh_connect_timeout", "--ssh-connect-timeout",
            ("MPI_BOOTSTRAP_SSH_CONNECT_TIMEOUT",), 10, v.positive_int,
            "ssh ConnectTimeout used by mpirun's launcher"),
    Setting("exec", "--exec", ("MPI_BOOTSTRAP_EXEC",), False, v.boolean,
            "replace the agent by mpirun instead of supervising it (images that run tini)"),
    Setting("grace_seconds", "--grace-seconds", ("MPI_BOOTSTRAP_GRACE_SECONDS",), 10.0,
            v.seconds, "after mpirun exits: SIGTERM what is left, SIGKILL after this long"),
    Setting("signal_group", "--signal-group", ("MPI_BOOTSTRAP_SIGNAL_GROUP",), False, v.boolean,
            "forward signals to mpirun's whole process group, not only mpirun"),
    Setting("liveness_seconds", "--liveness-seconds", ("MPI_BOOTSTRAP_LIVENESS_SECONDS",),
            30.0, v.bound,
            "while ranks run, a worker (or, seen from a worker, its launcher) silent this "
            "long is lost: the launcher ends the job (exit 75) naming the pod; 0 = off"),
    Setting("launcher_grace_seconds", "--launcher-grace-seconds",
            ("MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS",), 30.0, v.seconds,
            "worker: after its launcher is lost, wait this long (a restarted launcher may "
            "take over), then end what the launch started on it (daemons, ranks)"),
    Setting("exit_on_launcher_loss", "--exit-on-launcher-loss",
            ("MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS",), False, v.boolean,
            "worker: exit (75) once its launcher is lost and the launch ended, instead of "
            "staying up for the next launcher"),
    Setting("exchange", "--exchange", ("MPI_BOOTSTRAP_EXCHANGE",), "auto",
            v.choice(EXCHANGE_MODES),
            "how peers learn each other's sshd: secret, dir, net, none, or auto (dir if "
            "EXCHANGE_DIR is set, else net if TOKEN_FILE or TOKEN is set, else secret if a "
            "key is mounted)"),
    Setting("exchange_dir", "--exchange-dir", ("MPI_BOOTSTRAP_EXCHANGE_DIR",), None,
            v.plain_dir,
            "shared directory for the dir exchange"),
    Setting("exchange_port", "--exchange-port", ("MPI_BOOTSTRAP_EXCHANGE_PORT",), 2223,
            v.port, "TCP port of the workers' net exchange"),
    Setting("token_file", "--token-file", ("MPI_BOOTSTRAP_TOKEN_FILE",), None, v.path,
            "file holding the net exchange's shared secret (a key of a Secret volume, "
            "mode 0400): read once by the launcher and the worker, never put in any "
            "process's environment; the probe and the doctor do not read it"),
    Setting("token", None, ("MPI_BOOTSTRAP_TOKEN",), None, v.token,
            "the same secret in the environment (never logged), kept for compatibility: "
            "every process the container starts, the readiness probe included, then holds "
            "it in its environment; use MPI_BOOTSTRAP_TOKEN_FILE"),
    Setting("ssh_auth_dir", "--ssh-auth-dir", ("MPI_BOOTSTRAP_SSH_AUTH_DIR",), None, v.path,
            "where the job's key Secret is mounted (MPI Operator's sshAuthMountPath; "
            "default ~/.ssh)"),
    Setting("sshd_port", "--sshd-port", ("MPI_BOOTSTRAP_SSHD_PORT",), None, v.port,
            f"worker sshd port: a number, or 0 for a free one (default {SECRET_SSHD_PORT} "
            "with the secret exchange, else 0)"),
    Setting("sshd", "--sshd", ("MPI_BOOTSTRAP_SSHD",), "/usr/sbin/sshd", v.path,
            "the OpenSSH sshd binary"),
    Setting("ssh_user", "--ssh-user", ("MPI_BOOTSTRAP_SSH_USER",), None, v.user,
            "user the launcher logs in as (default: from each worker's record, or the "
            "launcher's own user)"),
    Setting("preflight", "--preflight", ("MPI_BOOTSTRAP_PREFLIGHT",), True, v.boolean,
            "check every worker over ssh before starting mpirun"),
    Setting("ssh_reuse", "--ssh-reuse", ("MPI_BOOTSTRAP_SSH_REUSE",), True, v.boolean,
            "keep preflight's ssh connection to each worker open (ControlMaster, socket in "
            "the state dir) so mpirun's ssh reuses it instead of connecting again"),
    Setting("ssh_kex", "--ssh-kex", ("MPI_BOOTSTRAP_SSH_KEX",), None, v.kex,
            "key exchange of the launcher's ssh (OpenSSH KexAlgorithms; default: the "
            "agent's choice, mlkem768x25519-sha256 where both ends take it, else "
            "curve25519-sha256; `default`: ssh's own, sntrup761x25519 in OpenSSH 9.0-9.8, "
            "six times the CPU per handshake)"),
    Setting("data_check", "--data-check", ("MPI_BOOTSTRAP_DATA_CHECK",), True, v.boolean,
            "before mpirun, test the data network between workers (ring and random pairs: "
            "TCP, and full-MTU packets that may not fragment); on when a data NIC is planned"),
    Setting("sysfs", "--sysfs", ("MPI_BOOTSTRAP_SYSFS",), "/sys", v.path,
            "where sysfs is mounted (a data NIC's RDMA device is read from it)"),
    Setting("state_dir", "--state-dir", ("MPI_BOOTSTRAP_STATE_DIR",), None,
            v.plain_dir,
            "private directory for generated files (default /run/mpi-bootstrap as root)"),
    Setting("termination_log", "--termination-log", ("MPI_BOOTSTRAP_TERMINATION_LOG",),
            DEFAULT_TERMINATION_LOG, v.path_or_off,
            "on a non-zero exit of the launcher or worker, the reason (phase, host, exit "
            "code, fix; at most 4 KiB) is written here, where Kubernetes shows it (`kubectl "
            "describe pod`); the default only if it exists, a path you set is created; "
            "empty: off"),
    Setting("log_format", "--log-format", ("MPI_BOOTSTRAP_LOG_FORMAT",), "auto",
            v.choice(LOG_FORMATS), "json, console, or auto (console on a TTY)"),
    Setting("log_level", "--log-level", ("MPI_BOOTSTRAP_LOG_LEVEL",), "info",
            v.choice(LOG_LEVELS), "debug, info, warning, error"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a setting's value came from: `default`, `env NAME` or `flag --x`."""

    kind: str  # "default" | "env" | "flag"
    name: str = ""

    def __str__(self) -> str:
        return self.kind if self.kind == "default" else f"{self.kind} {self.name}"


def setting(name: str) -> Setting:
    return _BY_NAME[name]
