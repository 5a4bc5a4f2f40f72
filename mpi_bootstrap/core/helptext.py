"""What `--help` and `--help-all` print (cli.py): a short usage a person reads, and every
setting grouped by purpose with the form of its value; both end with the exit codes, since
there is no README inside an image. Pure: built from the settings table and errors.py's."""

from __future__ import annotations

import textwrap

from mpi_bootstrap.core import settings as s
from mpi_bootstrap.core.errors import MEANINGS

USAGE = """usage: mpi-bootstrap [SETTINGS] ROLE [-- PROGRAM ARGS…]
       mpi-bootstrap [SETTINGS] launcher --explain [--json] -- mpirun …
       mpi-bootstrap --help-all | --version

Roles (or MPI_BOOTSTRAP_ROLE, or the operator's: MPI Operator, Volcano, JobSet, Trainer):
  launcher   wait for the hostfile's names, trust the workers' sshd, check them, and run
             mpirun with the flags its MPI needs (ENTRYPOINT of the launcher's image;
             the MPIJob's mpirun command is its PROGRAM)
  worker     generate keys, run a private sshd, share its key and port with the launcher,
             supervise it as the pod's PID 1
  probe      a worker's readinessProbe: exit 0 once its sshd serves and its record is out
  doctor     from the launcher's pod: DNS, the Service, the workers' records and ssh
"""

# The settings people change most, in --help.
COMMON = ("hostfile", "rewrite", "dns_wait_seconds", "data_iface", "exchange")

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "The job (launcher)",
        (
            "hostfile",
            "output_hostfile",
            "rewrite",
            "rewrite_fqdn_legacy",
            "cluster_domain",
            "mpi",
            "mpirun",
            "np",
            "forward_env",
            "startup_timeout",
        ),
    ),
    ("Waiting for DNS", ("dns_wait_seconds", "dns_wait_interval", "dns_concurrency")),
    ("Networks", ("control_iface", "data_iface", "data_check", "node_checks", "sysfs")),
    (
        "Trust: the exchange and ssh",
        (
            "exchange",
            "exchange_dir",
            "exchange_port",
            "token_file",
            "token",
            "ssh_auth_dir",
            "sshd",
            "ssh_server",
            "sshd_port",
            "ssh_user",
            "preflight",
            "ssh_reuse",
            "pipeline",
            "ssh_kex",
            "ssh_connect_timeout",
        ),
    ),
    (
        "PID 1 and the agent",
        (
            "exec",
            "grace_seconds",
            "signal_group",
            "state_dir",
            "termination_log",
            "log_format",
            "log_level",
        ),
    ),
    ("While ranks run", ("liveness_seconds", "launcher_grace_seconds", "exit_on_launcher_loss")),
)

FORMS = {
    "path": "PATH",
    "plain_dir": "DIR",
    "path_or_off": "PATH",
    "seconds": "SECONDS",
    "positive_seconds": "SECONDS",
    "bound": "SECONDS",
    "positive_int": "N",
    "boolean": "true|false",
    "port": "PORT",
    "token": "TOKEN",
    "user": "USER",
    "kex": "ALGORITHMS",
    "iface": "NIC",
    "patterns": "PATTERNS",
    "domain": "DOMAIN",
}


def form(setting: s.Setting) -> str:
    """The form of a setting's value: its choices, or what kind of value it is."""
    choices = getattr(setting.parse, "choices", None)
    if choices:
        return "|".join(choices)
    return FORMS.get(setting.parse.__name__, "VALUE")


def default_of(setting: s.Setting) -> str:
    """The default as --help-all and docs/configuration.md write it."""
    value = setting.default
    if value is None:
        return setting.default_text or "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _line(setting: s.Setting) -> str:
    flag = f"{setting.flag} {form(setting)}" if setting.flag else f"(variable) {form(setting)}"
    head = f"  {flag:<34} {', '.join(setting.envs)} [default: {default_of(setting)}]"
    return (
        textwrap.fill(head, 90, subsequent_indent=" " * 6, break_on_hyphens=False)
        + "\n"
        + textwrap.fill(setting.help, 88, initial_indent=" " * 6, subsequent_indent=" " * 6)
    )


def exit_codes() -> str:
    rows = ["Exit codes:", "  0    success (--explain: the plan was printed)"]
    rows += [f"  {code:<4} {what}" for code, (what, _) in sorted(MEANINGS.items())]
    rows += ["  N    mpirun's own exit code, passed through", "  128+N  ended by signal N"]
    return "\n".join(rows) + "\n"


def short() -> str:
    common = "\n".join(_line(s.setting(n)) for n in COMMON)
    return (
        f"{USAGE}\nThe settings people change most (each also a variable; the flag "
        f"wins):\n{common}\n  --explain [--json]                 show the plan and "
        "every decision; run nothing\n\n--help-all lists every setting, grouped.\n\n"
        f"{exit_codes()}"
    )


def full() -> str:
    parts = [USAGE]
    for title, names in GROUPS:
        parts.append(f"{title}:\n" + "\n".join(_line(s.setting(n)) for n in names) + "\n")
    parts.append(
        "Other:\n  --explain                          show the plan and every "
        "decision; run nothing\n  --json                             with "
        "--explain: one JSON object\n"
    )
    parts.append(exit_codes())
    return "\n".join(parts)
