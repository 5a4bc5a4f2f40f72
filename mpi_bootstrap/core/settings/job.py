"""The settings table's first half: the job the launcher runs — its hostfile and names,
the DNS wait, the networks, the MPI and its mpirun. Pure (core/settings/ has the rest)."""

from __future__ import annotations

from mpi_bootstrap.core import values as v
from mpi_bootstrap.core.settings.base import MPI_CHOICES, REWRITE_MODES, Setting

ROWS: tuple[Setting, ...] = (
    Setting(
        "hostfile",
        "--hostfile",
        ("MPI_HOSTFILE",),
        "/etc/mpi/hostfile",
        v.path,
        "hostfile to read (never modified)",
    ),
    Setting(
        "output_hostfile",
        "--output-hostfile",
        ("MPI_BOOTSTRAP_OUTPUT_HOSTFILE",),
        None,
        v.path,
        "where the rewritten hostfile is written, atomically; the original text goes to PATH.orig",
        "STATE_DIR/hostfile",
    ),
    Setting(
        "dns_wait_seconds",
        "--dns-wait-seconds",
        ("MPI_DNS_WAIT_SECONDS",),
        120.0,
        v.seconds,
        "hard deadline for every host to resolve (0 = one round)",
    ),
    Setting(
        "dns_wait_interval",
        "--dns-wait-interval",
        ("MPI_DNS_WAIT_INTERVAL",),
        3.0,
        v.positive_seconds,
        "paces re-polling: at most max(20, hosts/interval) lookups a second after the first round",
    ),
    # 32: as fast as 64 here, and each lookup sends two queries (A and AAAA); at ~100
    # in flight dnsmasq's receive buffer overflowed and glibc waited out 5 s timeouts.
    Setting(
        "dns_concurrency",
        "--dns-concurrency",
        ("MPI_BOOTSTRAP_DNS_CONCURRENCY",),
        32,
        v.positive_int,
        "lookups in flight at once (each sends an A and an AAAA query)",
    ),
    Setting(
        "rewrite",
        "--rewrite",
        ("MPI_BOOTSTRAP_REWRITE",),
        "none",
        v.choice(REWRITE_MODES),
        "rewrite hostnames: none, fqdn (x.svc → x.svc.DOMAIN, idempotent), ip (its address)",
    ),
    Setting(
        "rewrite_fqdn_legacy",
        None,
        ("REWRITE_MPI_HOSTFILE_FQDN",),
        False,
        v.boolean,
        "legacy switch: true means --rewrite fqdn unless --rewrite/MPI_BOOTSTRAP_REWRITE is set",
    ),
    Setting(
        "cluster_domain",
        "--cluster-domain",
        ("MPI_BOOTSTRAP_CLUSTER_DOMAIN",),
        "cluster.local",
        v.domain,
        "Kubernetes cluster domain",
    ),
    Setting(
        "control_iface",
        "--control-iface",
        ("MPI_BOOTSTRAP_CONTROL_IFACE",),
        "eth0",
        v.iface,
        "interface for ssh and MPI control traffic",
    ),
    Setting(
        "data_iface",
        "--data-iface",
        ("MPI_BOOTSTRAP_DATA_IFACE",),
        None,
        v.iface,
        "data NIC (if present) the agent gives NCCL as NCCL_SOCKET_IFNAME==NIC when that is unset",
        "net1 or dranet0",
    ),
    Setting(
        "mpi",
        "--mpi",
        ("MPI_BOOTSTRAP_MPI",),
        "auto",
        v.choice(MPI_CHOICES),
        "which MPI (auto = detect from `mpirun --version`)",
    ),
    Setting(
        "mpirun",
        "--mpirun",
        ("MPI_BOOTSTRAP_MPIRUN",),
        None,
        v.path,
        "mpirun to use (wrap mode uses yours)",
        "`mpirun` on PATH",
    ),
    Setting(
        "forward_env",
        "--forward-env",
        ("MPI_BOOTSTRAP_FORWARD_ENV",),
        (),
        v.patterns,
        "variables to forward: NAME, PREFIX* or * (the launcher's environment), comma separated",
    ),
    Setting(
        "np", "--np", ("MPI_BOOTSTRAP_NP",), None, v.positive_int, "number of ranks", "sum of slots"
    ),
    Setting(
        "startup_timeout",
        "--startup-timeout",
        ("MPI_BOOTSTRAP_STARTUP_TIMEOUT",),
        300.0,
        v.seconds,
        "Open MPI 4: abort if daemons do not report back in time (0 = never)",
    ),
    Setting(
        "ssh_connect_timeout",
        "--ssh-connect-timeout",
        ("MPI_BOOTSTRAP_SSH_CONNECT_TIMEOUT",),
        10,
        v.positive_int,
        "ssh ConnectTimeout used by mpirun's launcher",
    ),
)
