"""`mpi-bootstrap doctor` against real dnsmasq scenarios in the simulated cluster:
record missing, record late, only-FQDN, nameserver down, wrong address."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import AGENT, NO_SSHD, REAL_MPIS
from tests.support.cluster import Cluster
from tests.support.job import Agent, Job
from tests.support.wait import wait_until

pytestmark = [pytest.mark.timeout(180)]

PODS = ["job-launcher", "job-worker-0", "job-worker-1"]


def doctor(c: Cluster, work: Path, **extra: str) -> dict[str, Any]:
    hf = work / "hostfile"
    hf.write_text("".join(f"{c.svc(w)} slots=1\n" for w in PODS[1:]))
    xdir = work / "exchange"
    xdir.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "MPI_HOSTFILE": str(hf),
        "MPI_BOOTSTRAP_EXCHANGE_DIR": str(xdir),
        "MPI_BOOTSTRAP_LOG_FORMAT": "json",
        # its own: root's default (/run/mpi-bootstrap) may hold another test's launcher's
        # ssh config, whose data network check then finds that test's workers gone
        "MPI_BOOTSTRAP_STATE_DIR": str(work / "doctor-state"),
        **extra,
    }
    done = c.pods[0].run([AGENT, "doctor", "--json"], env, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    out["exit"] = done.returncode
    return out


def about(report: dict[str, Any], host_part: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if host_part in f["host"]]


def start_workers(c: Cluster, work: Path, *, first: dict[str, str] | None = None) -> Job:
    """Both workers, with the dir exchange in work/exchange (where `doctor` looks), up
    once both have published their records; `first`: the first worker's own settings."""
    job = Job(c, work, REAL_MPIS["openmpi4"])
    job.workers += [Agent(c, c.pods[1], [AGENT, "worker"], job.env(c.pods[1], **(first or {})))]
    job.start_workers(c.pods[2:])
    wait_until(
        lambda: len(list(job.xdir.glob("job-worker-*.json"))) >= 2, 20, "both workers' records"
    )
    return job


@pytest.mark.usefixtures("dnsmasq", "realmpi")  # the workers of an Open MPI 4 job
def test_all_well(tmp_path: Path) -> None:
    """With both workers up, doctor finds no problem (exit 0): ssh answers on both, each
    server named (worker 0 on the agent's own, worker 1 on OpenSSH's sshd, as do the
    launcher's --explain and the probe), and the headless Service has 2 addresses."""
    tmp_path.chmod(0o755)
    with Cluster(PODS, dns=True) as c:
        job = start_workers(c, tmp_path, first=NO_SSHD)
        report = doctor(c, tmp_path)
        assert report["problems"] == 0, [f for f in report["findings"] if not f["ok"]]
        assert report["exit"] == 0
        ssh = {
            f["host"].split(".")[0]: f["detail"] for f in report["findings"] if f["check"] == "ssh"
        }
        assert "answers (the agent's own ssh server)" in ssh["job-worker-0"], ssh
        assert "answers (OpenSSH_" in ssh["job-worker-1"], ssh
        explain = c.pods[0].run(
            [AGENT, "launcher", "--explain", "--json", "--", "true"],
            job.launcher_env(slots=1),
            timeout=60,
        )
        decided = {d["setting"]: d["value"] for d in json.loads(explain.stdout)["decisions"]}
        assert decided["workers' ssh server"] == (
            f"the agent's own on {c.svc('job-worker-0')}; OpenSSH's sshd on 1 worker"
        ), decided
        probe = c.pods[1].run([AGENT, "probe"], job.env(c.pods[1], **NO_SSHD))
        assert probe.stdout.startswith("ready: the agent's ssh server on"), probe
        svc = [f for f in report["findings"] if f["check"] == "headless Service"]
        assert len(svc) == 1 and svc[0]["ok"] and svc[0]["detail"].startswith("2 addresses")


@pytest.mark.usefixtures("dnsmasq")
def test_record_missing_then_late(tmp_path: Path) -> None:
    """A missing record: doctor shows each search form's NXDOMAIN, the Service short of
    addresses, and exits 1; once the record appears, that worker's checks pass."""
    with Cluster(PODS, dns=True, late=["job-worker-1"]) as c:
        report = doctor(c, tmp_path)
        bad = [f for f in about(report, "job-worker-1") if not f["ok"]]
        ns = next(f for f in bad if f["check"].startswith("nameserver"))
        assert "not found" in ns["detail"]
        assert "job-worker-1.job.default.svc.default.svc.cluster.local: NXDOMAIN" in ns["detail"]
        assert "job-worker-1.job.default.svc.cluster.local: NXDOMAIN" in ns["detail"]
        assert "not be Ready" in ns["advice"]
        svc = next(f for f in report["findings"] if f["check"] == "headless Service")
        assert svc["host"] == "job.default.svc.cluster.local"
        assert not svc["ok"] and svc["detail"].startswith("1 addresses for 2 workers")
        assert "endpoints are not populated" in svc["advice"]
        assert report["exit"] == 1
        c.add_record("job-worker-1")  # the late record appears
        report = doctor(c, tmp_path)
        checked = [f for f in about(report, "job-worker-1") if f["check"] != "record"]
        assert checked and all(f["ok"] for f in checked), report


@pytest.mark.usefixtures("dnsmasq")
def test_no_sshd_anywhere(tmp_path: Path) -> None:
    """Names that resolve and no sshd listening (no exchange: the image's own sshd on 22,
    or the fixed port): the doctor says so per worker instead of "no problem found"."""
    with Cluster(PODS, dns=True) as c:
        for extra in (
            {"MPI_BOOTSTRAP_EXCHANGE": "none"},
            {"MPI_BOOTSTRAP_EXCHANGE": "none", "MPI_BOOTSTRAP_SSHD_PORT": "2222"},
        ):
            report = doctor(c, tmp_path, **extra)
            port = extra.get("MPI_BOOTSTRAP_SSHD_PORT", "22")
            reach = [f for f in report["findings"] if f["check"] == "ssh port"]
            assert len(reach) == 2 and not any(f["ok"] for f in reach), report
            assert all(
                "nothing answers on" in f["detail"] and f":{port} " in f["detail"] for f in reach
            ), reach
            assert report["exit"] == 1


@pytest.mark.usefixtures("dnsmasq")
def test_no_service(tmp_path: Path) -> None:
    """No record for any worker, nor the Service: NXDOMAIN is said as such (the Service does
    not exist), not as a Service whose endpoints are empty."""
    # No pod's record at all: with any (the launcher's), the Service's name would be an
    # empty non-terminal, which answers NODATA rather than NXDOMAIN.
    with Cluster(PODS, dns=True, late=PODS) as c:
        report = doctor(c, tmp_path)
        svc = next(f for f in report["findings"] if f["check"] == "headless Service")
        assert not svc["ok"] and svc["detail"] == "no such name (NXDOMAIN) for 2 workers"
        assert "the Service does not exist (yet)" in svc["advice"]
        assert "endpoints" not in svc["advice"]


@pytest.mark.usefixtures("dnsmasq")
def test_only_fqdn(tmp_path: Path) -> None:
    """Where only FQDNs resolve, doctor shows the REFUSED short name and advises
    MPI_BOOTSTRAP_REWRITE=fqdn, with which the checks pass."""
    with Cluster(PODS, dns=True, fqdn_only=True) as c:
        report = doctor(c, tmp_path)
        ns = next(f for f in about(report, "job-worker-0") if f["check"].startswith("nameserver"))
        assert not ns["ok"]
        assert "job-worker-0.job.default.svc: REFUSED" in ns["detail"]
        assert "MPI_BOOTSTRAP_REWRITE=fqdn" in ns["advice"]
        fixed = doctor(c, tmp_path, MPI_BOOTSTRAP_REWRITE="fqdn")
        checked = [f for f in about(fixed, "job-worker-0") if f["check"] != "record"]
        assert checked and all(f["ok"] for f in checked), fixed


@pytest.mark.usefixtures("dnsmasq")
def test_nameserver_down(tmp_path: Path) -> None:
    """A nameserver down: doctor says `no answer` and `down or unreachable` in under 30 s (one
    deadline, not hosts × timeout)."""
    with Cluster(PODS, dns=True) as c:
        assert c.dnsmasq is not None
        c.dnsmasq.close()
        t0 = time.monotonic()
        report = doctor(c, tmp_path)
        assert time.monotonic() - t0 < 30  # bounded by the deadline, not hosts × timeout
        down = [f for f in report["findings"] if f["check"] == "nameserver 10.250.0.2"]
        assert down and all(not f["ok"] and f["detail"] == "no answer" for f in down)
        assert "down or unreachable" in down[0]["advice"]


@pytest.mark.usefixtures("dnsmasq", "realmpi")  # the workers of an Open MPI 4 job
def test_wrong_address(tmp_path: Path) -> None:
    """DNS points at an old address; the worker published its real one."""
    tmp_path.chmod(0o755)
    with Cluster(PODS, dns=True, late=["job-worker-0"]) as c:
        assert c.dnsmasq is not None
        c.dnsmasq.add({c.fqdn("job-worker-0"): "10.250.0.77"})
        start_workers(c, tmp_path)
        report = doctor(c, tmp_path)
        stale = next(f for f in about(report, "job-worker-0") if f["check"] == "published address")
        assert not stale["ok"]
        assert "DNS says 10.250.0.77, the worker published 10.250.0.11" in stale["detail"]
        assert "stale record" in stale["advice"]


def test_negative_ttl_from_soa(mocker: Any) -> None:
    """NXDOMAIN with the zone's SOA: the doctor says how long the NXDOMAIN stays cached.
    (dnsmasq sends no SOA with its NXDOMAIN, so this reply is built here; CoreDNS does.)"""
    import dns.message
    import dns.rcode
    import dns.rrset

    from mpi_bootstrap.core.model import Answer
    from mpi_bootstrap.doctor import diagnose
    from mpi_bootstrap.system import dns as sysdns

    def reply(q: dns.message.Message, *_a: Any, **_k: Any) -> dns.message.Message:
        r = dns.message.make_response(q)
        r.set_rcode(dns.rcode.NXDOMAIN)
        r.authority.append(
            dns.rrset.from_text(
                "cluster.local.",
                30,
                "IN",
                "SOA",
                "ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5",
            )
        )
        return r

    mocker.patch("dns.query.udp", side_effect=reply)
    mocker.patch(
        "mpi_bootstrap.system.dns.SystemResolver.__call__",
        return_value=Answer("x", error_kind="not found"),
    )
    conf = sysdns.ResolvConf(("10.96.0.10",), ("default.svc.cluster.local",), 5, 1.0)
    found = diagnose.dns_findings("w-0.job.default.svc", conf, time.monotonic() + 5)
    ns = next(f for f in found if f.check.startswith("nameserver"))
    assert "will keep saying NXDOMAIN for up to 5 more seconds" in ns.advice
