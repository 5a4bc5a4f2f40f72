"""`mpi-bootstrap doctor`: why a job cannot start, host by host, each finding ending in
what to do.

Per host: the system resolver's answer; each nameserver of resolv.conf asked directly
(dnspython) for every name the search list and `ndots` produce, with the rcode each
gave; the negative-caching time from the zone's SOA; the headless Service's address
count against the workers in the hostfile; a resolved address that differs from the one
the worker published (a stale record of an earlier job); and over ssh (paramiko, the
job's key, the pinned host key) whether the worker answers and what its session has.
Everything runs in parallel under one deadline.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence

from mpi_bootstrap.core import hostfile as hf
from mpi_bootstrap.core import records
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import BootstrapError
from mpi_bootstrap.core.model import TEMPORARY, Answer
from mpi_bootstrap.core.names import is_ip_literal
from mpi_bootstrap.system import dns as sysdns
from mpi_bootstrap.system import hostfiles


@dataclasses.dataclass(frozen=True)
class Finding:
    host: str
    check: str
    ok: bool
    detail: str
    advice: str = ""

    def line(self) -> str:
        mark = "ok " if self.ok else "!! "
        text = f"{mark}{self.host}: {self.check}: {self.detail}"
        return text + (f" — {self.advice}" if self.advice and not self.ok else "")


def candidates(name: str, conf: sysdns.ResolvConf) -> list[str]:
    """The names glibc asks for, in order (res_search: ndots decides what goes first)."""
    if name.endswith("."):
        return [name.rstrip(".")]
    searched = [f"{name}.{s}" for s in conf.search]
    return [name, *searched] if name.count(".") >= conf.ndots else [*searched, name]


def ask(server: str, qname: str, timeout: float) -> tuple[str, tuple[str, ...], int | None]:
    """(rcode-ish status, addresses, negative-cache seconds) for `qname` A at `server`."""
    import dns.exception
    import dns.message
    import dns.query
    import dns.rcode
    import dns.rdatatype

    q = dns.message.make_query(qname, dns.rdatatype.A)
    try:
        r = dns.query.udp(q, server, timeout=timeout)
    except dns.exception.Timeout:
        return "timeout", (), None
    except OSError as exc:
        return f"error ({exc.strerror or exc})", (), None
    rcode = dns.rcode.to_text(r.rcode())
    addrs = tuple(str(rd) for rrset in r.answer if rrset.rdtype == dns.rdatatype.A
                  for rd in rrset)
    neg = None
    for rrset in r.authority:
        if rrset.rdtype == dns.rdatatype.SOA:
            neg = min(rrset.ttl, *(rd.minimum for rd in rrset))
    if rcode == "NOERROR":
        return ("answer" if addrs else "no data"), addrs, neg
    return rcode, addrs, neg


def within(deadline: float, jobs: Sequence[Callable[[], list[Finding]]],
           on_late: Callable[[int], list[Finding]]) -> list[Finding]:
    """Run every job at once in daemon threads; keep what finished by `deadline`.

    Daemon threads: a check stuck in the resolver or a dead nameserver never holds the
    doctor (or the agent) past its deadline, not even at exit.
    """
    import threading

    results: list[list[Finding]] = [[] for _ in jobs]
    done = [False] * len(jobs)

    def work(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except Exception as exc:  # a check that breaks is a finding, not a crash
            results[i] = [Finding("doctor", "internal", False, repr(exc))]
        done[i] = True

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = sum(not d for d in done)
    return [f for r in results for f in r] + (on_late(late) if late else [])


def system_lookup(name: str, deadline: float) -> Answer:
    """getaddrinfo, given at most half the time left: glibc tries a dead nameserver for
    its full timeout per name, and the direct queries still need the rest."""
    import threading

    holder: list[Answer] = []

    def look() -> None:
        holder.append(sysdns.SystemResolver()(name))

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(max(0.0, (deadline - time.monotonic()) / 2))
    return holder[0] if holder else Answer(
        name, error_kind=TEMPORARY, detail="no answer within half the deadline")


def dns_findings(name: str, conf: sysdns.ResolvConf, deadline: float) -> list[Finding]:
    out = []
    answer = system_lookup(name, deadline)
    if answer.ok:
        out.append(Finding(name, "system resolver", True, f"-> {answer.addresses[0]}"))
        return out
    out.append(Finding(name, "system resolver", False, f"{answer.error_kind}: {answer.detail}",
                       "see the nameserver findings below"))
    if not conf.nameservers:
        out.append(Finding(name, "resolv.conf", False, "no nameserver line",
                           "the pod's dnsPolicy gives it no DNS: use ClusterFirst"))
        return out
    for server in conf.nameservers:
        tried = []
        neg_ttl = None
        for qname in candidates(name, conf):
            left = deadline - time.monotonic()
            if left <= 0.05:
                tried.append(f"{qname}: (deadline)")
                break
            status, addrs, neg = ask(server, qname, min(conf.timeout, left))
            tried.append(f"{qname}: {status}")
            if status == "NXDOMAIN" and neg is not None:
                neg_ttl = neg if neg_ttl is None else max(neg_ttl, neg)
            if status == "timeout":
                out.append(Finding(name, f"nameserver {server}", False, "no answer",
                                   f"the nameserver {server} is down or unreachable from "
                                   "this pod: check the cluster DNS (CoreDNS) pods"))
                break
            if addrs:
                out.append(Finding(name, f"nameserver {server}", True,
                                   f"{qname} -> {addrs[0]} (asked: {'; '.join(tried)})"))
                break
        else:
            advice = ("the record does not exist (yet): the worker pod may not be Ready, or "
                      "its name in the hostfile does not match a pod of the headless Service")
            if any("REFUSED" in t for t in tried):
                advice += ("; REFUSED means the server does not serve that name at all: "
                           "MPI_BOOTSTRAP_REWRITE=fqdn asks for the full "
                           ".svc.<cluster-domain> name")
            if neg_ttl:
                advice += (f"; the DNS server will keep saying NXDOMAIN for up to {neg_ttl} "
                           "more seconds after the record appears (negative caching)")
            out.append(Finding(name, f"nameserver {server}", False,
                               f"not found (asked: {'; '.join(tried)})", advice))
    return out


def service_finding(hosts: Sequence[str], domain: str, conf: sysdns.ResolvConf,
                    deadline: float) -> list[Finding]:
    """`<subdomain>.<ns>.svc.<domain>` addresses versus the workers that use it."""
    groups: dict[str, int] = {}
    for h in hosts:
        labels = h.rstrip(".").split(".")
        if "svc" in labels:
            i = labels.index("svc")
            if i >= 3:
                groups[".".join(labels[1:i + 1]) + f".{domain}"] = groups.get(
                    ".".join(labels[1:i + 1]) + f".{domain}", 0) + 1
    out = []
    for service, workers in groups.items():
        if not conf.nameservers:
            break
        left = deadline - time.monotonic()
        if left <= 0.05:
            break
        status, addrs, _ = ask(conf.nameservers[0], service, min(conf.timeout, left))
        if len(addrs) >= workers:
            out.append(Finding(service, "headless Service", True,
                               f"{len(addrs)} addresses for {workers} workers"))
        else:
            out.append(Finding(service, "headless Service", False,
                               f"{len(addrs)} addresses for {workers} workers ({status})",
                               "the Service exists but its endpoints are not populated: "
                               "worker pods are not Ready (readinessProbe) or do not match "
                               "its selector"))
    return out


def stale_finding(name: str, address: str | None, published: Sequence[str]) -> Finding | None:
    if not address or not published or address in published:
        return None
    return Finding(name, "published address", False,
                   f"DNS says {address}, the worker published {', '.join(published)}",
                   "a stale record of an earlier job with the same name: wait for the DNS "
                   "TTL, or delete the old pods/Service")


def ssh_finding(name: str, target: str, port: int, *, user: str, private_key: str,
                host_key: str | None, timeout: float) -> Finding:
    """Connect with paramiko as mpirun's ssh would; run the remote environment check."""
    import io

    import paramiko

    client = paramiko.SSHClient()
    if host_key:
        kind, blob = host_key.split()[:2]
        client.get_host_keys().add(f"[{target}]:{port}" if port != 22 else target, kind,
                                   paramiko.PKey.from_type_string(kind, _b64(blob)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private_key))
        client.connect(target, port=port, username=user, pkey=pkey,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                       allow_agent=False, look_for_keys=False)
        _, out, _ = client.exec_command(
            'echo "LD=$LD_LIBRARY_PATH"; for d in orted prted hydra_pmi_proxy; do '
            'command -v $d; done', timeout=timeout)
        text = out.read().decode(errors="replace").strip().replace("\n", " ")
        return Finding(name, "ssh", True, f"{user}@{target}:{port} answers; {text}")
    except paramiko.BadHostKeyException:
        return Finding(name, "ssh", False, f"host key mismatch for {name}",
                       "the sshd there is not the one the worker published: a restarted "
                       "worker or a stale address")
    except paramiko.AuthenticationException:
        return Finding(name, "ssh", False, "the job's key was refused",
                       "give every pod the same key (Secret or exchange)")
    except (OSError, paramiko.SSHException) as exc:
        return Finding(name, "ssh", False, f"cannot connect to {target}:{port} ({exc})",
                       "is the worker running `mpi-bootstrap worker`, and is its sshd up?")
    finally:
        client.close()


def _b64(blob: str) -> bytes:
    import base64

    return base64.b64decode(blob)


def run(config: Config, *, deadline_s: float = 10.0,
        log: Callable[..., None] | None = None) -> list[Finding]:
    """Every check for every host in the hostfile (and the launcher), in parallel."""
    import socket

    deadline = time.monotonic() + deadline_s
    conf = sysdns.read_resolv_conf()
    try:
        hostfile = hostfiles.read(config.hostfile)
        names = [hf.fqdn(h.name, config.cluster_domain) if config.rewrite != "none"
                 else h.name for h in hostfile.hosts]
    except Exception as exc:  # the doctor reports; it does not fail on a bad hostfile
        return [Finding(config.hostfile, "hostfile", False, str(exc),
                        "fix the hostfile first")]
    names = [n for n in names if not is_ip_literal(n)]
    own = socket.gethostname()
    jobs: list[Callable[[], list[Finding]]] = [
        lambda n=n: dns_findings(n, conf, deadline) for n in [*names, own]]  # type: ignore[misc]
    jobs.append(lambda: service_finding(names, config.cluster_domain, conf, deadline))
    jobs.extend(ssh_jobs(config, names, deadline))
    return within(deadline + 0.5, jobs, lambda n: [Finding(
        "doctor", "deadline", False, f"{n} checks did not finish in {deadline_s:g} s",
        "a nameserver or a worker does not answer; the findings above say which")])


def ssh_jobs(config: Config, names: Sequence[str], deadline: float
             ) -> list[Callable[[], list[Finding]]]:
    """ssh checks for the workers the exchange knows (dir), with their pinned keys."""
    from mpi_bootstrap.ssh import dirx

    if config.exchange != "dir" or not config.exchange_dir:
        return []
    ex = dirx.DirExchange(config.exchange_dir)
    try:
        job = ex.peek_job_key()
    except BootstrapError as exc:
        message = exc.message
        return [lambda: [Finding(config.exchange_dir or "", "job key", False, message,
                                 "see the message")]]
    if job is None:
        return [lambda: [Finding(config.exchange_dir or "", "job key", False,
                                 "no key of a running job in the exchange directory",
                                 "start the workers (`mpi-bootstrap worker`): the first "
                                 "one makes the job's key")]]
    key = job.private
    jobs: list[Callable[[], list[Finding]]] = []
    for name in names:
        try:
            rec = ex.read(name)
        except records.RecordError:
            rec = None
        if rec is None:
            jobs.append(lambda n=name: [Finding(  # type: ignore[misc]
                n, "record", False, f"no record in {config.exchange_dir}",
                "the worker has not started `mpi-bootstrap worker` (or its pod is down)")])
            continue

        def check(n: str = name, r: records.Record = rec) -> list[Finding]:
            out = []
            answer = sysdns.SystemResolver()(n)
            stale = stale_finding(n, answer.addresses[0] if answer.ok else None, r.addresses)
            if stale:
                out.append(stale)
            target = r.addresses[0] if r.addresses else n
            left = max(0.5, deadline - time.monotonic())
            out.append(ssh_finding(n, target, r.port, user=config.ssh_user or r.user,
                                   private_key=key, host_key=r.host_key, timeout=left))
            return out

        jobs.append(check)
    return jobs


def render(findings: Sequence[Finding], as_json: bool) -> str:
    if as_json:
        return json.dumps({"findings": [dataclasses.asdict(f) for f in findings],
                           "problems": sum(not f.ok for f in findings)}, indent=2) + "\n"
    problems = [f for f in findings if not f.ok]
    lines = ["mpi-bootstrap doctor", *(f.line() for f in findings), "",
             f"{len(problems)} problem(s) found" if problems else "no problem found"]
    return "\n".join(lines) + "\n"


def main(config: Config, as_json: bool) -> int:
    findings = run(config)
    import sys

    sys.stdout.write(render(findings, as_json))
    return 0 if all(f.ok for f in findings) else 1


def for_dump(names: Sequence[str], deadline_s: float = 3.0) -> str:
    """The DNS part of the doctor for the DNS-wait timeout dump (bounded)."""
    conf = sysdns.read_resolv_conf()
    deadline = time.monotonic() + deadline_s
    found = within(deadline + 0.5, [lambda n=n: dns_findings(n, conf, deadline)  # type: ignore[misc]
                                    for n in names], lambda n: [])
    return "\n".join(f.line() for f in found)

