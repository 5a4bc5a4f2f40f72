"""mpirun said something and exited non-zero: which known failure is it, and what to do
(docs/troubleshooting.md, "mpirun's failures explained"; the signatures come from real
output, tests/fixtures/mpirun-failures/). Standard library only: the resident uses it.

Linear in the output, whatever it holds: a pattern with `\\S*` before an alternation took
77 s on one rank's 128 KiB unbroken line, signals unanswered (tests/test_failures.py::
TestAdversarialInput). So only the last MAX_SCAN bytes are read, each line is cut at
MAX_LINE characters, a line is looked at only if it holds a signature's fixed text, and
every pattern is anchored or has bounded repeats.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

from mpi_bootstrap.core import liveness, runtimes
from mpi_bootstrap.core.errors import printable

MAX_SCAN = 256 * 1024  # the tail of mpirun's stderr the supervisor keeps
MAX_LINE = 1024  # ssh's and the MPIs' messages are far shorter
DAEMONS = runtimes.DAEMONS

Fields = dict[str, str]


# The signature of a worker mpirun lost while the job ran (pid1/verdict.py, pid1/lost.py:
# Open MPI 5 exits 0 all the same).
WORKER_LOST = "worker-lost"


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    needles: tuple[str, ...]  # a line is looked at only if it holds one of these
    cause: str  # may use {host}, {path}
    fix: str
    fields: Callable[[str], Fields | None] = lambda _line: {}  # None: not this one
    # Fields found on another line: (its fixed text, how to read them).
    detail: tuple[str, Callable[[str], Fields | None]] | None = None
    # For ssh's failures: the one line preflight prints for `ssh HOST` (may use {host} and
    # {last}, ssh's last line).
    brief: str = ""


def _pattern(regex: str, how: str = "search") -> Callable[[str], Fields | None]:
    compiled = re.compile(regex)
    find = compiled.match if how == "match" else compiled.search

    def fields(line: str) -> Fields | None:
        m = find(line)
        return None if m is None else {k: v for k, v in m.groupdict().items() if v}

    return fields


def _daemon_path(line: str) -> Fields | None:
    """The daemon the shell could not run (`bash: line 1: /x/bin/orted: No such file`)."""
    if not any(n in line for n in ("command not found", "No such file or directory", "not found")):
        return None
    for token in line.split():
        word = token.rstrip(":")
        if word.rsplit("/", 1)[-1] in DAEMONS:
            return {"path": word}
    return None


def _all_of(*parts: str) -> Callable[[str], Fields | None]:
    """The parts appear in this order on the line."""

    def fields(line: str) -> Fields | None:
        at = 0
        for part in parts:
            at = line.find(part, at)
            if at < 0:
                return None
            at += len(part)
        return {}

    return fields


def _any(*tests: Callable[[str], Fields | None]) -> Callable[[str], Fields | None]:
    def fields(line: str) -> Fields | None:
        for test in tests:
            found = test(line)
            if found is not None:
                return found
        return None

    return fields


_HOST = r"(?P<host>[^\s:@]{1,253})"
SIGNATURES = (
    Signature(
        "host-key-mismatch",
        ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "the sshd that answered for {host} presented a host key other than the one "
        "the worker published: a restarted worker, a stale address from an earlier job, "
        "or another pod's sshd",
        "check that the worker pod is running `mpi-bootstrap worker` and has published "
        "a fresh record, then start the launcher again (it re-reads the records); never "
        "switch StrictHostKeyChecking off to get past this",
        detail=("Host key for ", _pattern(r"Host key for (?P<host>\S{1,253}) has changed")),
        brief="host key mismatch for {host}: the sshd answering there is not the one the "
        "worker published (a stale address, or someone else's sshd)",
    ),
    Signature(
        "permission-denied",
        (": Permission denied (publickey",),
        "{host} refused the job's ssh key",
        "give every pod the same key: the MPIJob's Secret at the same sshAuthMountPath "
        "(MPI_BOOTSTRAP_SSH_AUTH_DIR), or the same exchange (MPI_BOOTSTRAP_EXCHANGE_DIR or "
        "MPI_BOOTSTRAP_TOKEN_FILE) on the launcher and the workers",
        fields=_pattern(
            r"(?:[^\s@]{1,64}@)?" + _HOST + r": Permission denied \(publickey", "match"
        ),
        brief="{host}: the worker's sshd refused the job's key (Permission denied)",
    ),
    Signature(
        "hydra-no-ipv4",
        ("unable to find interface",),
        "hydra (MPICH, Intel MPI) needs an IPv4 address on its interface; this pod has none",
        "use a pod network with IPv4 (dual-stack pods use IPv4), or Open MPI, which runs on "
        'IPv6 (docs/configuration.md, "Platforms")',
    ),
    Signature(
        "could-not-resolve",
        ("Could not resolve hostname ",),
        "ssh could not resolve {host}",
        "use names that resolve in the pods: MPI_BOOTSTRAP_REWRITE=fqdn for MPI "
        "Operator's `.svc` names (or ip), and keep MPI_DNS_WAIT_SECONDS long enough for "
        "the headless Service's records to appear",
        fields=_pattern(r"Could not resolve hostname (?P<host>[^\s:]{1,253})"),
        brief="{host}: ssh could not resolve the name",
    ),
    Signature(
        "no-route",
        ("No route to host", "Connection timed out", "Network is unreachable"),
        "the launcher has no route to {host} on the control network",
        "check that the address is the worker pod's current one (a deleted pod's address "
        "stays in stale DNS for a while) and that MPI_BOOTSTRAP_CONTROL_IFACE is the pod "
        "network; `mpi-bootstrap doctor` checks both",
        fields=_pattern(
            r"ssh: connect to host (?P<host>\S{1,253}) port \d{1,5}: "
            r"(?:No route to host|Connection timed out|Network is unreachable)"
        ),
        brief="{host}: ssh could not connect ({last})",
    ),
    Signature(
        "connection-refused",
        ("Connection refused",),
        "nothing listens for ssh on {host}",
        "the worker's sshd is not running or listens on another port: start the worker "
        "pods with `mpi-bootstrap worker` and a readinessProbe `mpi-bootstrap probe`",
        fields=_pattern(
            r"ssh: connect to host (?P<host>\S{1,253}) port (?P<port>\d{1,5}): "
            r"Connection refused"
        ),
        brief="{host}: connection refused: no sshd on that port",
    ),
    # A worker lost while the job ran: its daemon (ORTE's, PRRTE's) or its proxy
    # (hydra's) died or stopped answering, after the ranks had started. Not a start-up
    # failure: captured by killing a worker pod mid-job (tests/test_liveness.py;
    # tests/fixtures/mpirun-failures/*-worker-lost.txt). Open MPI 5 then even exits 0.
    Signature(
        WORKER_LOST,
        (
            "has lost communication with a remote daemon",
            "assert (!closed) failed",
            "Downstream from host",
        ),
        "mpirun lost {host} while the job ran: the daemon there, or the connection to it, "
        "died (the pod gone or killed, its node down, the daemon OOM-killed); the ranks "
        "there are gone",
        "look at that pod and its node (kubectl describe pod: evicted, OOM-killed, node "
        "not ready), then run the job again; the agent's liveness check "
        "(MPI_BOOTSTRAP_LIVENESS_SECONDS) ends such a job and names the pod even where "
        "mpirun would wait",
        fields=_any(
            _all_of("has lost communication with a remote daemon"),
            _all_of("assert (!closed) failed"),
            _all_of("Downstream from host", "exited abnormally"),
        ),
        detail=(
            "Remote daemon:",
            _pattern(
                r"Remote daemon: .{0,80} on node "
                r"(?P<host>\S{1,253})"
            ),
        ),
    ),
    Signature(
        "daemon-not-found",
        DAEMONS,
        "the MPI's remote daemon ({path}) is not where mpirun starts it on the workers",
        "install the same MPI at the same path in the launcher and worker images (Open "
        "MPI's --prefix is the launcher's install directory), or put it on the "
        "non-interactive PATH of the workers (mpi-operator #488)",
        fields=_daemon_path,
    ),
    Signature(
        "libfabric",
        (
            "Unable to find a libfabric provider",
            "fi_getinfo",
            "OFI call",
            "OFI endpoint",
            "MPIDI_OFI_",
        ),
        "libfabric found no usable network provider",
        "in pods without RDMA, set FI_PROVIDER=tcp (the agent already sets FI_TCP_IFACE "
        "to the control interface for Intel MPI)",
        fields=_any(
            _all_of("Unable to find a libfabric provider"),
            _all_of("fi_getinfo", "No data available"),
            _all_of("fi_getinfo", "-61"),
            _all_of("OFI call", "failed"),
            _all_of("OFI endpoint", "failed"),
            _all_of("MPIDI_OFI_", "failed"),
        ),
    ),
    Signature(
        "launcher-single-node",
        (
            "All nodes which are allocated for this job are already filled",
            "No available launching agents were found",
        ),
        "mpirun could start processes on this host only: its launcher setting reaches no "
        "other host (plm `isolated`, which CUDA/PyTorch images set in OMPI_MCA_plm), or "
        "-np asks for more ranks than the hostfile has slots",
        "remove `--mca plm …`/`--prtemca plm …` from the command (the agent overrides "
        "OMPI_MCA_plm and PRTE_MCA_plm itself when the command does not set them), and "
        "give -np no more than the hostfile's slots",
    ),
    Signature(
        "transport-on-node-only",
        ("unable to reach each other for",),
        "MPI processes on different hosts have no transport between them: the BTL list "
        "(OMPI_MCA_btl, --mca btl) holds only on-node ones (self, vader/sm)",
        "remove `--mca btl …` from the command, or list tcp in it (the agent sets "
        "`--mca btl self,tcp` and overrides an OMPI_MCA_btl without a network transport)",
    ),
    Signature(
        "daemons-did-not-report",
        (
            "ORTE was unable to reliably start one or more daemons",
            "A daemon failed to report back",
            "Launch proxy failed",
            "unable to connect to proxy",
            "HYDU_sock_connect",
        ),
        "MPI's daemons did not start on the workers, or could not connect back to the launcher",
        "run `mpi-bootstrap doctor` in the launcher pod: it checks DNS, ssh and the "
        "remote environment of every worker; also check that the pods can reach each "
        "other on MPI_BOOTSTRAP_CONTROL_IFACE (no NetworkPolicy blocks them)",
    ),
)


# ssh's own failures: the launcher's preflight explains a failed `ssh HOST` with these
# rows, the doctor its paramiko errors, the supervisor mpirun's output.
SSH_FAILURES = (
    "host-key-mismatch",
    "permission-denied",
    "could-not-resolve",
    "no-route",
    "connection-refused",
)
BY_NAME = {s.name: s for s in SIGNATURES}


@dataclasses.dataclass(frozen=True)
class Explanation:
    signature: str
    cause: str
    fix: str
    host: str | None = None  # the host at fault, where mpirun's output names one

    def text(self, code: int) -> str:
        """For a person: the cause names what mpirun printed (a host), escaped."""
        cause, fix = printable(self.cause, lines=False), printable(self.fix, lines=False)
        return (
            f"mpi-bootstrap: mpirun exited {code}. Likely cause: {cause}.\n  What to do: {fix}.\n"
        )


def _lines(output: str) -> list[str]:
    return [line[:MAX_LINE] for line in output[-MAX_SCAN:].splitlines()]


def _matches(sig: Signature, lines: list[str], stop: Callable[[], bool]) -> Iterator[Fields]:
    for n, line in enumerate(lines):
        if n % 256 == 0 and stop():
            return
        if any(needle in line for needle in sig.needles):
            found = sig.fields(line)
            if found is not None:
                yield found


def explain(output: str, stop: Callable[[], bool] = lambda: False) -> Explanation | None:
    """The most specific known failure in mpirun's output, or None (also when `stop()`
    says to give up: PID 1 polls its signals through it)."""
    lines = _lines(output)
    for sig in SIGNATURES:
        found = next(_matches(sig, lines, stop), None)
        if stop():
            return None
        if found is None:
            continue
        fields = dict(found)
        if sig.detail is not None:
            needle, read = sig.detail
            extra = next((f for line in lines if needle in line and (f := read(line))), None)
            fields.update(extra or {})
        host = fields.get("host")
        fields.setdefault("host", "a worker")
        fields.setdefault("path", "orted/prted/hydra proxy")
        return Explanation(sig.name, sig.cause.format(**fields), sig.fix, host)
    return None


# ssh's words for "nobody (or a dying sshd) answered": worth another try before the
# deadline (preflight). A wrong host key, a refused key or a missing daemon are not.
TRANSIENT = (
    "connection refused",
    "connection reset",
    "connection closed",
    "kex_exchange_identification",
)
# ssh's words for "no SSH server spoke on that address and port" (refused, no route,
# timed out, closed before its banner): then preflight's wait for the worker's sshd
# takes over.
UNREACHED = ("connect to host", "kex_exchange_identification", "banner exchange")


def transient(code: int, output: str) -> bool:
    """ssh itself failed (255) to connect, in a way a moment may cure."""
    low = output.lower()
    return code == 255 and any(t in low for t in TRANSIENT) and "permission denied" not in low


def unreached(code: int, output: str) -> bool:
    """ssh (255) got no SSH server to talk to, as opposed to one that said no."""
    low = output.lower()
    return code == 255 and any(u in low for u in UNREACHED)


def refused(output: str) -> bool:
    """ssh was refused: nothing listens on that port (yet, or any more)."""
    return "connection refused" in output.lower()


def refused_port(output: str) -> str:
    """The port of ssh's `connect to host H port P: Connection refused`."""
    m = re.search(r"port (\d{1,5}): Connection refused", output)
    return m.group(1) if m else "?"


def explain_ssh(host: str, output: str, code: int) -> str:
    """ssh's own words for a failed `ssh HOST …` → the table's one line (preflight)."""
    lines = _lines(output)
    ended = next((line for line in lines if line.startswith(liveness.ENDED)), None)
    if ended is not None:  # the worker's PID 1 ended it: said as such (pid1/watch.py)
        return f"{host}: {printable(ended.removeprefix('mpi-bootstrap: '), lines=False)}"
    last = _lines(output.strip())[-1] if output.strip() else f"ssh exited {code}"
    for name in SSH_FAILURES:
        sig = BY_NAME[name]
        if any(needle in line for line in lines for needle in sig.needles):
            return sig.brief.format(host=host, last=last)
    return f"{host}: ssh failed: {last}"
