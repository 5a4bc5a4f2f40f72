"""mpirun said something and exited non-zero: which known failure is it, and what to do.

The signatures come from real output of Open MPI 4 (ORTE), Open MPI 5 (PRRTE) and
MPICH/Intel hydra, captured in the simulated cluster (tests/fixtures/mpirun-failures/,
with the script that made them). The most specific cause wins: "Host key verification
failed" explains the generic "ORTE was unable to reliably start one or more daemons"
that follows it. Output that matches nothing gets no explanation — mpirun's own words
stand. Standard library only: the resident supervisor uses it.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern[str]
    cause: str  # may use {host}, {path}
    fix: str
    detail: re.Pattern[str] | None = None  # where the fields are, if not in `pattern`


def _sig(name: str, pattern: str, cause: str, fix: str, detail: str | None = None
         ) -> Signature:
    return Signature(name, re.compile(pattern, re.M), cause, fix,
                     re.compile(detail, re.M) if detail else None)


SIGNATURES = (
    _sig("host-key-mismatch",
         r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED",
         "the sshd that answered for {host} presented a host key other than the one "
         "the worker published: a restarted worker, a stale address from an earlier job, "
         "or another pod's sshd",
         "check that the worker pod is running `mpi-bootstrap worker` and has published "
         "a fresh record, then start the launcher again (it re-reads the records); never "
         "switch StrictHostKeyChecking off to get past this",
         detail=r"Host key for (?P<host>\S+) has changed"),
    _sig("permission-denied",
         r"^(?:\S+@)?(?P<host>[^\s:@]+): Permission denied \(publickey",
         "{host} refused the job's ssh key",
         "give every pod the same key: the MPIJob's Secret at the same sshAuthMountPath "
         "(MPI_BOOTSTRAP_SSH_AUTH_DIR), or the same exchange (MPI_BOOTSTRAP_EXCHANGE_DIR or "
         "MPI_BOOTSTRAP_TOKEN) on the launcher and the workers"),
    _sig("could-not-resolve",
         r"Could not resolve hostname (?P<host>[^\s:]+)",
         "ssh could not resolve {host}",
         "use names that resolve in the pods: MPI_BOOTSTRAP_REWRITE=fqdn for MPI "
         "Operator's `.svc` names (or ip), and keep MPI_DNS_WAIT_SECONDS long enough for "
         "the headless Service's records to appear"),
    _sig("no-route",
         r"ssh: connect to host (?P<host>\S+) port \d+: (?:No route to host|"
         r"Connection timed out|Network is unreachable)",
         "the launcher has no route to {host} on the control network",
         "check that the address is the worker pod's current one (a deleted pod's address "
         "stays in stale DNS for a while) and that MPI_BOOTSTRAP_CONTROL_IFACE is the pod "
         "network; `mpi-bootstrap doctor` checks both"),
    _sig("connection-refused",
         r"ssh: connect to host (?P<host>\S+) port (?P<port>\d+): Connection refused",
         "nothing listens for ssh on {host}",
         "the worker's sshd is not running or listens on another port: start the worker "
         "pods with `mpi-bootstrap worker` and a readinessProbe `mpi-bootstrap probe`"),
    _sig("daemon-not-found",
         r"(?P<path>\S*(?:orted|prted|hydra_pmi_proxy|hydra_bstrap_proxy))"
         r"(?::| )(?:.*)?(?:command not found|No such file or directory|not found)",
         "the MPI's remote daemon ({path}) is not where mpirun starts it on the workers",
         "install the same MPI at the same path in the launcher and worker images (Open "
         "MPI's --prefix is the launcher's install directory), or put it on the "
         "non-interactive PATH of the workers (mpi-operator #488)"),
    _sig("libfabric",
         r"(?:Unable to find a libfabric provider|fi_getinfo.*(?:No data available|-61)|"
         r"OFI (?:call|endpoint).*failed|MPIDI_OFI_\w+.*failed)",
         "libfabric found no usable network provider",
         "in pods without RDMA, set FI_PROVIDER=tcp (the agent already sets FI_TCP_IFACE "
         "to the control interface for Intel MPI)"),
    _sig("daemons-did-not-report",
         r"ORTE was unable to reliably start one or more daemons|A daemon failed to "
         r"report back|ORTE has lost communication with a remote daemon|PRTE has lost "
         r"communication with a remote daemon|Launch proxy failed|unable to connect to "
         r"proxy|HYDU_sock_connect",
         "MPI's daemons did not start on the workers, or could not connect back to the "
         "launcher",
         "run `mpi-bootstrap doctor` in the launcher pod: it checks DNS, ssh and the "
         "remote environment of every worker; also check that the pods can reach each "
         "other on MPI_BOOTSTRAP_CONTROL_IFACE (no NetworkPolicy blocks them)"),
)


@dataclasses.dataclass(frozen=True)
class Explanation:
    signature: str
    cause: str
    fix: str

    def text(self, code: int) -> str:
        return (f"mpi-bootstrap: mpirun exited {code}. Likely cause: {self.cause}.\n"
                f"  What to do: {self.fix}.\n")


def explain(output: str) -> Explanation | None:
    """The most specific known failure in mpirun's output, or None."""
    for sig in SIGNATURES:
        m = sig.pattern.search(output)
        if m:
            fields = {k: v for k, v in m.groupdict().items() if v}
            d = sig.detail.search(output) if sig.detail else None
            if d:
                fields.update({k: v for k, v in d.groupdict().items() if v})
            fields.setdefault("host", "a worker")
            fields.setdefault("path", "orted/prted/hydra proxy")
            return Explanation(sig.name, sig.cause.format(**fields), sig.fix)
    return None
