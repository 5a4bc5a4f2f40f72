"""The doctor's ssh checks, for workers the exchange knows: a resolved address that
differs from the one the worker published (a stale record of an earlier job), and over
ssh (paramiko, the job's key, the pinned host key) whether the worker answers and what
its session has — the same remote check as the launcher's preflight (core/remote.py),
its failures explained by the same table (core/failures.py)."""

from __future__ import annotations

import base64
import errno
import functools
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from mpi_bootstrap.core import failures, records, remote, runtimes
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError, printable
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.ssh import sides
from mpi_bootstrap.system import dns as sysdns


def stale_finding(name: str, address: str | None, published: Sequence[str]) -> Finding | None:
    if not address or not published or address in published:
        return None
    return Finding(
        name,
        "published address",
        False,
        f"DNS says {address}, the worker published {', '.join(published)}",
        "a stale record of an earlier job with the same name: wait for the DNS "
        "TTL, or delete the old pods/Service",
    )


def _failure_of(exc: BaseException) -> str | None:
    """paramiko's and the socket's errors, as rows of the ssh failure table."""
    import paramiko

    if isinstance(exc, paramiko.BadHostKeyException):
        return "host-key-mismatch"
    if isinstance(exc, paramiko.AuthenticationException):
        return "permission-denied"
    if isinstance(exc, ConnectionRefusedError):
        return "connection-refused"
    if isinstance(exc, socket.gaierror):
        return "could-not-resolve"
    if isinstance(exc, TimeoutError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
    ):
        return "no-route"
    return None


def ssh_finding(
    name: str,
    target: str,
    port: int,
    *,
    user: str,
    private_key: str,
    host_key: str | None,
    timeout: float,
    sysfs: str = "/sys",
) -> Finding:
    """Connect with paramiko as mpirun's ssh would; run the remote environment check and
    the node report (sysfs: MPI_BOOTSTRAP_SYSFS, as the launcher's); read up to the
    launcher's budget of it (launcher/session.py REPORT_LIMIT)."""
    import io

    import paramiko

    client = paramiko.SSHClient()
    if host_key:
        kind, blob = host_key.split()[:2]
        client.get_host_keys().add(
            f"[{target}]:{port}" if port != 22 else target,
            kind,
            paramiko.PKey.from_type_string(kind, base64.b64decode(blob)),
        )
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private_key))
        client.connect(
            target,
            port=port,
            username=user,
            pkey=pkey,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=False,
            look_for_keys=False,
        )
        _, out, _ = client.exec_command(
            f"{remote.script(runtimes.DAEMONS, ())}; {remote.node(sysfs)}", timeout=timeout
        )
        report = remote.parse(out.read(1 << 20).decode(errors="replace"))
        said = f"{user}@{target}:{port} answers ({_server(client)}); {report.summary()}"
        return Finding(name, "ssh", True, said)
    except (OSError, paramiko.SSHException) as exc:
        failure = _failure_of(exc)
        if failure is None:
            fix = "is the worker running `mpi-bootstrap worker`, and is its sshd up?"
            return Finding(name, "ssh", False, f"cannot connect to {target}:{port} ({exc})", fix)
        sig = failures.BY_NAME[failure]
        return Finding(name, "ssh", False, sig.cause.format(host=name, path=""), sig.fix)
    finally:
        client.close()


def _server(client: Any) -> str:
    """Which server answered, by its banner: the agent's own (ssh/server.py) or another."""
    transport = client.get_transport()
    banner = str(getattr(transport, "remote_version", "") or "")
    if banner.startswith(f"SSH-2.0-{remote.SERVER_BANNER}_"):
        return "the agent's own ssh server"
    return printable(banner.removeprefix("SSH-2.0-"))[:60] or "an ssh server"


def ssh_jobs(
    config: Config, names: Sequence[str], deadline: float
) -> list[Callable[[], list[Finding]]]:
    """ssh checks for the workers the exchange knows (dir), with their pinned keys."""
    from mpi_bootstrap.ssh import dirx

    if sides.of(config.ex).knock(config) is not None or not config.exchange_dir:
        return []  # no records here to log in with: reach_jobs knocks instead
    where = config.exchange_dir
    ex = dirx.DirExchange(where)
    try:
        job = ex.peek_job_key()
    except BootstrapError as exc:
        found = [Finding(where, "job key", False, exc.message, "see the message")]
        return [functools.partial(list, found)]
    if job is None:
        found = [
            Finding(
                where,
                "job key",
                False,
                "no key of a running job in the exchange directory",
                "start the workers (`mpi-bootstrap worker`): the first one makes the job's key",
            )
        ]
        return [functools.partial(list, found)]
    jobs: list[Callable[[], list[Finding]]] = []
    for name in names:
        try:
            rec = ex.read(name)
        except records.RecordError:
            rec = None
        if rec is None:
            missing = [
                Finding(
                    name,
                    "record",
                    False,
                    f"no record in {where}",
                    "the worker has not started `mpi-bootstrap worker` (or its pod is down)",
                )
            ]
            jobs.append(functools.partial(list, missing))
            continue
        jobs.append(functools.partial(_login, config, name, rec, job.private, deadline))
    return jobs


def _login(
    config: Config, name: str, rec: records.Record, key: str, deadline: float
) -> list[Finding]:
    """One worker over ssh with the job's key and its pinned host key (and whether DNS
    still names an earlier pod's address)."""
    out = []
    answer = sysdns.SystemResolver()(name)
    stale = stale_finding(name, answer.addresses[0] if answer.ok else None, rec.addresses)
    if stale:
        out.append(stale)
    target = rec.addresses[0] if rec.addresses else name
    left = max(0.5, deadline - time.monotonic())
    out.append(
        ssh_finding(
            name,
            target,
            rec.port,
            user=config.ssh_user or rec.user,
            private_key=key,
            host_key=rec.host_key,
            timeout=left,
            sysfs=config.sysfs,
        )
    )
    return out


def reach_jobs(
    config: Config, names: Sequence[str], deadline: float
) -> list[Callable[[], list[Finding]]]:
    """Where the doctor has no record to log in with (every exchange but `dir`): whether
    each worker's ssh port answers with an SSH banner (the fixed sshd port, else 22), or,
    with the `net` exchange, whether its exchange port takes a connection."""
    knock = sides.of(config.ex).knock(config)
    if knock is None:
        return []  # ssh_jobs logs in with the job's key
    return [functools.partial(reach_finding, n, *knock, deadline) for n in names]


def reach_finding(name: str, port: int, what: str, deadline: float) -> list[Finding]:
    timeout = max(0.5, deadline - time.monotonic())
    try:
        with socket.create_connection((name, port), timeout=timeout) as conn:
            if what != "ssh port":
                return [Finding(name, what, True, f"{name}:{port} takes a connection")]
            conn.settimeout(timeout)
            banner = conn.recv(255)
    except OSError as exc:
        failure = _failure_of(exc)
        advice = (
            failures.BY_NAME[failure].fix
            if failure
            else "is the worker running `mpi-bootstrap worker`, and is its sshd up?"
        )
        return [Finding(name, what, False, f"nothing answers on {name}:{port} ({exc})", advice)]
    if banner.startswith(b"SSH-"):
        first = banner.split(b"\n")[0].decode("ascii", "replace").strip()
        return [Finding(name, what, True, f"{name}:{port} answers {first}")]
    return [
        Finding(
            name,
            what,
            False,
            f"{name}:{port} answers, but not with an SSH banner",
            "another program holds the port: set MPI_BOOTSTRAP_SSHD_PORT on both sides",
        )
    ]
