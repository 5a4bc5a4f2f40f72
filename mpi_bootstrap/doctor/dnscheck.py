"""The doctor's DNS checks: the system resolver's answer; each nameserver of resolv.conf
asked directly (dnspython) for every name the search list and `ndots` produce, with the
rcode each gave; the negative-caching time from the zone's SOA; the headless Service's
address count against the workers in the hostfile."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from mpi_bootstrap.core.model import TEMPORARY, Answer
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.system import dns as sysdns
from mpi_bootstrap.system.parallel import map_within


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
    addrs = tuple(str(rd) for rrset in r.answer if rrset.rdtype == dns.rdatatype.A for rd in rrset)
    neg = None
    for rrset in r.authority:
        if rrset.rdtype == dns.rdatatype.SOA:
            neg = min(rrset.ttl, *(rd.minimum for rd in rrset))
    if rcode == "NOERROR":
        return ("answer" if addrs else "no data"), addrs, neg
    return rcode, addrs, neg


def system_lookup(name: str, deadline: float) -> Answer:
    """getaddrinfo, given at most half the time left: glibc tries a dead nameserver for
    its full timeout per name, and the direct queries still need the rest."""
    half = time.monotonic() + max(0.0, (deadline - time.monotonic()) / 2)
    outcome = map_within(sysdns.SystemResolver(), [name], half)[0]
    if outcome is None or outcome[0] is None:
        return Answer(name, error_kind=TEMPORARY, detail="no answer within half the deadline")
    return outcome[0]


def dns_findings(name: str, conf: sysdns.ResolvConf, deadline: float) -> list[Finding]:
    out = []
    answer = system_lookup(name, deadline)
    if answer.ok:
        out.append(Finding(name, "system resolver", True, f"-> {answer.addresses[0]}"))
        return out
    why = f"{answer.error_kind}: {answer.detail}"
    out.append(Finding(name, "system resolver", False, why, "see the nameserver findings below"))
    if not conf.nameservers:
        fix = "the pod's dnsPolicy gives it no DNS: use ClusterFirst"
        out.append(Finding(name, "resolv.conf", False, "no nameserver line", fix))
        return out
    for server in conf.nameservers:
        found = _ask_server(name, server, conf, deadline)
        if found is not None:
            out.append(found)
    return out


def _ask_server(name: str, server: str, conf: sysdns.ResolvConf, deadline: float) -> Finding | None:
    """One nameserver asked directly for every name glibc would try, in its order (None:
    the deadline came first)."""
    tried = []
    neg_ttl = None
    for qname in candidates(name, conf):
        left = deadline - time.monotonic()
        if left <= 0.05:
            return None
        status, addrs, neg = ask(server, qname, min(conf.timeout, left))
        tried.append(f"{qname}: {status}")
        if status == "NXDOMAIN" and neg is not None:
            neg_ttl = neg if neg_ttl is None else max(neg_ttl, neg)
        if status == "timeout":
            return Finding(
                name,
                f"nameserver {server}",
                False,
                "no answer",
                f"the nameserver {server} is down or unreachable from "
                "this pod: check the cluster DNS (CoreDNS) pods",
            )
        if addrs:
            return Finding(
                name,
                f"nameserver {server}",
                True,
                f"{qname} -> {addrs[0]} (asked: {'; '.join(tried)})",
            )
    advice = (
        "the record does not exist (yet): the worker pod may not be Ready, or "
        "its name in the hostfile does not match a pod of the headless Service"
    )
    if any("REFUSED" in t for t in tried):
        advice += (
            "; REFUSED means the server does not serve that name at all: "
            "MPI_BOOTSTRAP_REWRITE=fqdn asks for the full "
            ".svc.<cluster-domain> name"
        )
    if neg_ttl:
        advice += (
            f"; the DNS server will keep saying NXDOMAIN for up to {neg_ttl} "
            "more seconds after the record appears (negative caching)"
        )
    return Finding(
        name, f"nameserver {server}", False, f"not found (asked: {'; '.join(tried)})", advice
    )


def service_finding(
    hosts: Sequence[str], domain: str, conf: sysdns.ResolvConf, deadline: float
) -> list[Finding]:
    """`<subdomain>.<ns>.svc.<domain>` addresses versus the workers that use it."""
    groups: Counter[str] = Counter()
    for h in hosts:
        labels = h.rstrip(".").split(".")
        if "svc" in labels and (i := labels.index("svc")) >= 3:
            groups[".".join(labels[1 : i + 1]) + f".{domain}"] += 1
    out = []
    for service, workers in groups.items():
        left = deadline - time.monotonic()
        if not conf.nameservers or left <= 0.05:
            break
        status, addrs, _ = ask(conf.nameservers[0], service, min(conf.timeout, left))
        ok, detail, advice = len(addrs) >= workers, f"{len(addrs)} addresses", ""
        if ok:
            detail += f" for {workers} workers"
        elif status == "NXDOMAIN":  # no such name at all: not an empty Service
            detail = f"no such name (NXDOMAIN) for {workers} workers"
            advice = (
                "the Service does not exist (yet): MPI Operator creates it with the job; "
                "check its name and namespace, and MPI_BOOTSTRAP_CLUSTER_DOMAIN if the "
                "cluster's domain is not cluster.local"
            )
        else:
            detail += f" for {workers} workers ({status})"
            advice = (
                "the Service exists but its endpoints are not populated: worker pods are "
                "not Ready (readinessProbe) or do not match its selector"
            )
        out.append(Finding(service, "headless Service", ok, detail, advice))
    return out
