"""The settings table's second half: how the agent runs — supervision, liveness, the
exchange and ssh, the data check, its own files and logs. Pure."""

from __future__ import annotations

from mpi_bootstrap.core import nodechecks
from mpi_bootstrap.core import values as v
from mpi_bootstrap.core.exchanges import EXCHANGES, SECRET_SSHD_PORT
from mpi_bootstrap.core.settings.base import LOG_FORMATS, LOG_LEVELS, Setting
from mpi_bootstrap.core.termination import DEFAULT_PATH as DEFAULT_TERMINATION_LOG

NODE_CHECKS = nodechecks.NAMES  # core/nodechecks.py, the one table of the checks
ROWS: tuple[Setting, ...] = (
    Setting(
        "exec",
        "--exec",
        ("MPI_BOOTSTRAP_EXEC",),
        False,
        v.boolean,
        "replace the agent by mpirun instead of supervising it (images that run tini)",
    ),
    Setting(
        "grace_seconds",
        "--grace-seconds",
        ("MPI_BOOTSTRAP_GRACE_SECONDS",),
        10.0,
        v.seconds,
        "when mpirun exits: SIGTERM what is left, SIGKILL after this long (below Kubernetes' 30 s)",
    ),
    Setting(
        "signal_group",
        "--signal-group",
        ("MPI_BOOTSTRAP_SIGNAL_GROUP",),
        False,
        v.boolean,
        "forward signals to mpirun's whole process group, not only mpirun",
    ),
    Setting(
        "liveness_seconds",
        "--liveness-seconds",
        ("MPI_BOOTSTRAP_LIVENESS_SECONDS",),
        30.0,
        v.bound,
        "while ranks run, a worker (or, seen from a worker, its launcher) silent this "
        "long is lost: the launcher ends the job (exit 75) naming the pod; 0 = off",
    ),
    Setting(
        "launcher_grace_seconds",
        "--launcher-grace-seconds",
        ("MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS",),
        30.0,
        v.seconds,
        "worker: after its launcher is lost, wait this long (a restarted launcher may "
        "take over), then end what the launch started on it (daemons, proxies, ranks)",
    ),
    Setting(
        "exit_on_launcher_loss",
        "--exit-on-launcher-loss",
        ("MPI_BOOTSTRAP_EXIT_ON_LAUNCHER_LOSS",),
        False,
        v.boolean,
        "worker: exit (75) once its launcher is lost and the launch ended, instead of "
        "staying up for the next launcher (MPI Operator recreates no worker)",
    ),
    Setting(
        "exchange",
        "--exchange",
        ("MPI_BOOTSTRAP_EXCHANGE",),
        "auto",
        v.choice(("auto", *EXCHANGES)),
        "how peers learn each other's sshd: secret, dir, net, none, or auto (dir if "
        "EXCHANGE_DIR is set, else net if TOKEN_FILE or TOKEN is set, else secret if a "
        "key is mounted)",
    ),
    Setting(
        "exchange_dir",
        "--exchange-dir",
        ("MPI_BOOTSTRAP_EXCHANGE_DIR",),
        None,
        v.plain_dir,
        "shared directory for the dir exchange",
    ),
    Setting(
        "exchange_port",
        "--exchange-port",
        ("MPI_BOOTSTRAP_EXCHANGE_PORT",),
        2223,
        v.port,
        "TCP port of the workers' net exchange",
    ),
    Setting(
        "token_file",
        "--token-file",
        ("MPI_BOOTSTRAP_TOKEN_FILE",),
        None,
        v.path,
        "file holding the net exchange's shared secret (a key of a Secret volume, "
        "mode 0400): read once by the launcher and the worker, never put in any "
        "process's environment; the probe and the doctor do not read it",
    ),
    Setting(
        "token",
        None,
        ("MPI_BOOTSTRAP_TOKEN",),
        None,
        v.token,
        "the same secret in the environment (never logged), kept for compatibility: "
        "every process the container starts, the readiness probe included, then holds "
        "it in its environment; use MPI_BOOTSTRAP_TOKEN_FILE",
    ),
    Setting(
        "ssh_auth_dir",
        "--ssh-auth-dir",
        ("MPI_BOOTSTRAP_SSH_AUTH_DIR",),
        None,
        v.path,
        "where the job's key Secret is mounted (MPI Operator's sshAuthMountPath)",
        "~/.ssh",
    ),
    Setting(
        "sshd_port",
        "--sshd-port",
        ("MPI_BOOTSTRAP_SSHD_PORT",),
        None,
        v.port,
        "worker sshd port: a number, or 0 for a free one (retried if lost to a race)",
        f"{SECRET_SSHD_PORT} with the secret exchange, else 0",
    ),
    Setting(
        "sshd",
        "--sshd",
        ("MPI_BOOTSTRAP_SSHD",),
        "/usr/sbin/sshd",
        v.path,
        "the OpenSSH sshd binary",
    ),
    Setting(
        "ssh_server",
        "--ssh-server",
        ("MPI_BOOTSTRAP_SSH_SERVER",),
        "auto",
        v.choice(("auto", "openssh", "agent")),
        "the worker's ssh server: openssh (--sshd), agent (its own), auto (its own where "
        "the image has no usable sshd)",
    ),
    Setting(
        "ssh_user",
        "--ssh-user",
        ("MPI_BOOTSTRAP_SSH_USER",),
        None,
        v.user,
        "user the launcher logs in as",
        "each worker's own (its record); with the secret exchange, the launcher's own",
    ),
    Setting(
        "preflight",
        "--preflight",
        ("MPI_BOOTSTRAP_PREFLIGHT",),
        True,
        v.boolean,
        "check every worker over ssh, beside mpirun's start: no rank starts before all passed",
    ),
    Setting(
        "ssh_reuse",
        "--ssh-reuse",
        ("MPI_BOOTSTRAP_SSH_REUSE",),
        True,
        v.boolean,
        "keep preflight's ssh connection to each worker open (ControlMaster, socket in "
        "the state dir) so mpirun's ssh reuses it instead of connecting again",
    ),
    Setting(
        "pipeline",
        "--pipeline",
        ("MPI_BOOTSTRAP_PIPELINE",),
        True,
        v.boolean,
        "trust, check and let mpirun's ssh through to each worker as soon as it resolves "
        "and publishes its record, while the others are awaited (off: every name first)",
    ),
    Setting(
        "ssh_kex",
        "--ssh-kex",
        ("MPI_BOOTSTRAP_SSH_KEX",),
        None,
        v.kex,
        "key exchange of the launcher's ssh (OpenSSH KexAlgorithms): the agent's choice is "
        "mlkem768x25519-sha256 where both ends take it, else curve25519-sha256; `default`: "
        "ssh's own, sntrup761x25519 in OpenSSH 9.0-9.8, six times the CPU per handshake",
        "the agent's choice",
    ),
    Setting(
        "data_check",
        "--data-check",
        ("MPI_BOOTSTRAP_DATA_CHECK",),
        True,
        v.boolean,
        "before any rank starts, test the data network between workers (ring and random "
        "pairs: TCP, full-MTU packets that may not fragment); on with a data NIC and preflight",
    ),
    Setting(
        "node_checks",
        "--node-checks",
        ("MPI_BOOTSTRAP_NODE_CHECKS",),
        NODE_CHECKS,
        v.subset(NODE_CHECKS),
        "before any rank starts, check each worker's node (docs/configuration.md, \"Node "
        f'checks"): {", ".join(NODE_CHECKS)}; comma separated, empty: none',
    ),
    Setting(
        "sysfs",
        "--sysfs",
        ("MPI_BOOTSTRAP_SYSFS",),
        "/sys",
        v.path,
        "where sysfs is mounted (a data NIC's RDMA device: class/net/NIC/device/infiniband/)",
    ),
    Setting(
        "state_dir",
        "--state-dir",
        ("MPI_BOOTSTRAP_STATE_DIR",),
        None,
        v.plain_dir,
        "private directory for generated files, one per pod, held by the agent for its life",
        "/run/mpi-bootstrap/HOSTNAME as root, else ~/.mpi-bootstrap/HOSTNAME "
        "(/tmp/mpi-bootstrap-UID/HOSTNAME where that cannot be made)",
    ),
    Setting(
        "termination_log",
        "--termination-log",
        ("MPI_BOOTSTRAP_TERMINATION_LOG",),
        DEFAULT_TERMINATION_LOG,
        v.path_or_off,
        "on a non-zero exit of the launcher or worker, the reason (phase, host, exit "
        "code, fix; at most 4 KiB) is written here, where Kubernetes shows it (`kubectl "
        "describe pod`); the default only if it exists, a path you set is created; "
        "empty: off",
    ),
    Setting(
        "log_format",
        "--log-format",
        ("MPI_BOOTSTRAP_LOG_FORMAT",),
        "auto",
        v.choice(LOG_FORMATS),
        "json, console, or auto (console on a TTY)",
    ),
    Setting(
        "log_level",
        "--log-level",
        ("MPI_BOOTSTRAP_LOG_LEVEL",),
        "info",
        v.choice(LOG_LEVELS),
        "debug, info, warning, error",
    ),
)
