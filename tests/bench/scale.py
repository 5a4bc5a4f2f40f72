"""Scale: one job on N worker pods, through the agent and with a bare mpirun beside it.

    make bench-scale N="16 32 64 128"        (or: python tests/bench/scale.py 16 32 64)

For each N: a simulated cluster (tests/support/cluster.py) of N worker pods and a launcher
pod, one slot each, names from per-pod hosts files (no DNS server), the `dir` exchange.
Then, with the same workers up:

1. bare: what a person writes by hand: a known_hosts and an ssh config built from the
   workers' records (host keys pinned, the job's key), and mpirun given the same hostfile
   and the same flags the agent would give it, its ssh pointed at that config;
2. agent: `mpi-bootstrap launcher -- /bin/hostname`, its phases read from its own log.

Every host must run a rank in both. Memory of each worker pod at rest (the agent's
supervisor and sshd: PSS, USS) is read before the jobs. Prints a table and JSON; never
asserts a time. Needs root, iproute2, OpenSSH, an MPI and the agent (the repository's
.venv or `mpi-bootstrap` on PATH); nothing Debian-specific.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import add_worker_env, stagger, worker_env
from tests.support import logs
from tests.support.cluster import Cluster, Pod, agent_env
from tests.support.interrupt import run_main

PATH = "/usr/local/bin:/usr/bin:/bin"
PHASES = (  # (with preflight, its first ssh to each worker is the wait for its sshd)
    ("records", "records"),
    ("mpirun_start", "mpirun start"),  # with the launch gate: before the checks
    ("preflight", "preflight ok"),
    ("data_check", "data check ok"),
    ("checks_passed", "checks passed"),  # the launch gate's: every check passed
)
# The host's neighbour (ARP/ND) table is shared by every namespace: past ~200 pods its
# default thresholds (128/512/1024) overflowed at 999 pods ("no route" to ~500 workers,
# ORTE's errmgr "no-path"). Raised for a run with more pods, then put back.
NEIGH_SYSCTLS = [
    f"/proc/sys/net/{v}/neigh/default/gc_thresh{i}" for v in ("ipv4", "ipv6") for i in (1, 2, 3)
]
NEIGH_RAISED = {"1": "8192", "2": "16384", "3": "32768"}
NEIGH_FROM_PODS = 200


def _agent() -> str:
    venv = ROOT / ".venv" / "bin" / "mpi-bootstrap"
    found = str(venv) if venv.exists() else shutil.which("mpi-bootstrap")
    if not found:
        raise SystemExit("no mpi-bootstrap: `make install`, or put it on PATH")
    return found


# Settings every worker gets (--worker-env), beside the job's.
WORKER_ENV: dict[str, str] = {}


class Scale:
    """N workers up in a fresh cluster; the jobs run against them."""

    def __init__(
        self,
        n: int,
        work: Path,
        agent: str,
        mpirun: str,
        data: bool = False,
        *,
        kex: str = "",
        stagger: bool = False,
    ) -> None:
        self.n, self.work, self.agent, self.mpirun, self.kex = n, work, agent, mpirun, kex
        self.profile: Path | None = None  # where Profile keeps its files, when asked
        self.worker_env = WORKER_ENV  # every worker's own settings (--worker-env)
        self.workers = [f"w{i}" for i in range(n)]
        self.xdir = work / "exchange"
        self.xdir.mkdir()
        t0 = time.monotonic()
        # --stagger: names from dnsmasq, each worker's record added as it becomes ready
        self.c = Cluster(
            ["launcher", *self.workers],
            pid1=True,
            data=data,
            private_root=True,
            dns=stagger,
            late=self.workers if stagger else (),
        )
        self.build_s = time.monotonic() - t0
        self.hostfile = work / "hostfile"
        self.hostfile.write_text("".join(f"{w} slots=1\n" for w in self.workers))

    def env(self, pod: Pod, **extra: str) -> dict[str, str]:
        own = self.worker_env if pod.name != "launcher" else {}
        return agent_env(
            self.work,
            pod,
            path=f"{Path(self.mpirun).parent}:{PATH}",
            **{"MPI_BOOTSTRAP_EXCHANGE_DIR": str(self.xdir), **own, **extra},
            **({"MPI_BOOTSTRAP_SSH_KEX": self.kex} if self.kex else {}),
        )

    def start_workers(self, timeout: float = 300) -> float:
        """Start every worker at once; seconds until every record is published (a record
        of the job before is replaced: the job-done mark makes the first pod clear them)."""
        t0, wall = time.monotonic(), time.time() - 1
        procs = []
        for pod in self.c.pods[1:]:  # the log to a file: nobody reads a pipe here
            with open(self.work / f"{pod.name}.log", "a") as out:
                procs.append(
                    subprocess.Popen(
                        pod.argv([self.agent, "worker"], self.env(pod)),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        for pod, p in zip(self.c.pods[1:], procs, strict=True):
            self.c.adopt(pod, p)  # signalled as the pod's program (its PID 1)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if all(_mtime(self.xdir / f"{w}.json") > wall for w in self.workers):
                return time.monotonic() - t0
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                raise SystemExit(f"a worker exited {dead[0].returncode}: see {self.work}")
            time.sleep(0.05)
        raise SystemExit(f"not every worker published a record within {timeout:g} s")

    def memory(self) -> dict[str, Any]:
        """Per worker pod at rest: the agent's processes and sshd (not the simulation's
        `unshare`/`sh` wrappers), summed; PSS and USS from /proc/PID/smaps_rollup."""
        per_pod = []
        for pod in self.c.pods[1:]:
            pss = uss = rss = 0
            for pid in pod.netns.pids():
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    if comm not in ("sshd", "python3", "python", "mpi-bootstrap"):
                        continue
                    roll = _rollup(pid)
                except OSError:
                    continue
                pss += roll["Pss"]
                uss += roll["Private_Clean"] + roll["Private_Dirty"]
                rss += roll["Rss"]
            per_pod.append((pss, uss, rss))
        mib = 1024.0
        return {
            "pss_mib_median": round(statistics.median(p[0] for p in per_pod) / mib, 2),
            "uss_mib_median": round(statistics.median(p[1] for p in per_pod) / mib, 2),
            "rss_mib_median": round(statistics.median(p[2] for p in per_pod) / mib, 2),
            "pss_mib_max": round(max(p[0] for p in per_pod) / mib, 2),
        }

    def plan_argv(self) -> list[str]:
        """The argv the agent would run (its --explain --json), for the bare run."""
        pod = self.c.pods[0]
        done = pod.run(
            [
                self.agent,
                "launcher",
                "--explain",
                "--json",
                "--mpirun",
                self.mpirun,
                "--",
                "/bin/hostname",
            ],
            self.env(pod, MPI_HOSTFILE=str(self.hostfile)),
            timeout=300,
        )
        if done.returncode != 0:
            raise SystemExit(f"--explain failed: {done.stderr}")
        return list(json.loads(done.stdout)["argv"])

    def bare(
        self, argv: list[str], *, kex: str | None = None, names: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """mpirun by hand: the plan's flags, its ssh pointed at a hand-made config (`kex`:
        its KexAlgorithms, else --kex's; `names`: the hostfile's name of each worker)."""
        hand = self.work / "by-hand"
        hand.mkdir(exist_ok=True)
        kex = self.kex if kex is None else kex
        recs = {w: json.loads((self.xdir / f"{w}.json").read_text()) for w in self.workers}
        alias = {w: (names or {}).get(w, w) for w in self.workers}
        (hand / "known_hosts").write_text(
            "".join(f"{alias[w]} {r['host_key']}\n" for w, r in recs.items())
        )
        cfg = "".join(
            f"Host {alias[w]}\n  HostName {r['addresses'][0]}\n  Port {r['port']}\n"
            f"  User {r['user']}\n  HostKeyAlias {alias[w]}\n"
            for w, r in recs.items()
        )
        cfg += (
            f"Host *\n  IdentityFile {self.xdir}/job-key/id\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {hand}/known_hosts\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  LogLevel ERROR\n"
        ) + (f"  KexAlgorithms {kex}\n" if kex else "")
        (hand / "ssh_config").write_text(cfg)
        ssh = f"ssh -F {hand}/ssh_config"
        # The agent's files → ours: its ssh command (or its launch gate), the hostfile.
        out = [ssh if a.startswith("ssh -F ") or a.endswith("/ssh-gate") else a for a in argv]
        out[out.index("--hostfile") + 1] = str(self.hostfile)
        pod = self.c.pods[0]
        with Profile(self.profile, f"bare-{time.time():.0f}") as prof:
            t0, cpu0 = time.monotonic(), _busy_cpu_s()
            done = pod.run(out, self.env(pod), timeout=600)
            total, cpu = time.monotonic() - t0, _busy_cpu_s() - cpu0
        return {
            **prof.summary(),
            "total_s": round(total, 3),
            "busy_cpu_s": round(cpu, 2),
            "exit_code": done.returncode,
            "all_hosts_ran": self._all_ran(done.stdout),
            "ssh": ssh,
            "kex": kex or "ssh default",
            "stderr_tail": done.stderr[-500:] if done.returncode else "",
        }

    def agent_job(self, **extra: str) -> dict[str, Any]:
        pod = self.c.pods[0]
        env = self.env(pod, MPI_HOSTFILE=str(self.hostfile), **extra)
        with Profile(self.profile, f"agent-{time.time():.0f}") as prof:
            t0, cpu0 = time.time(), _busy_cpu_s()
            done = pod.run(
                [self.agent, "launcher", "--mpirun", self.mpirun, "--", "/bin/hostname"],
                env,
                timeout=600,
            )
            total, cpu = time.time() - t0, _busy_cpu_s() - cpu0
        ev = {e["event"]: e for e in logs.events(done.stderr, partial=True)}
        phases = {k: round(logs.stamp(ev[name]) - t0, 3) for k, name in PHASES if name in ev}
        out = {
            **prof.summary(),
            "total_s": round(total, 3),
            "busy_cpu_s": round(cpu, 2),
            "exit_code": done.returncode,
            "all_hosts_ran": self._all_ran(done.stdout),
            "phases_s": phases,
            "stderr_tail": done.stderr[-800:] if done.returncode else "",
        }
        if "data check ok" in ev:
            out["data_check"] = {
                k: ev["data check ok"].get(k) for k in ("listen_s", "probe_s", "probes", "cpu_s")
            }
        if "mpirun_start" in phases:  # mpirun's whole life (beside the checks, if gated)
            out["mpirun_run_s"] = round(total - phases["mpirun_start"], 3)
        return out

    def logins(self) -> int:
        """Logins the workers' sshd accepted so far (one per ssh connection)."""
        return sum(
            (self.work / f"{w}.log").read_text().count("Accepted publickey") for w in self.workers
        )

    def counted(self, job: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """job's result, with the logins the workers accepted meanwhile."""
        before = self.logins()
        out = job()
        out["logins"] = self.logins() - before
        return out

    def _all_ran(self, stdout: str) -> bool:
        return sorted(set(stdout.split())) == sorted(self.workers)

    def end_workers(self, timeout: float = 60) -> None:
        """Until the workers have ended: by themselves after a job that succeeded (its
        job-done), else stopped (SIGTERM): after a failed job they stay up for a retry."""
        deadline = time.monotonic() + timeout
        for p in self.c.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.c.signal(p)
                p.wait(timeout=30)
        self.c.procs.clear()

    def close(self) -> None:
        self.c.close()


class Profile:
    """Where one job's CPU went, machine-wide (every pod shares the machine): `perf record
    -a` sampled at HZ, summed by program (CPU seconds), and process accounting (`accton`,
    Debian's acct) counting every process by program: sshd children, shells, Python
    starts, ssh clients and masters. Either part is skipped where its tool is missing."""

    HZ = 999

    def __init__(self, where: Path | None, name: str) -> None:
        self.where, self.name = where, name
        self.perf: subprocess.Popen[bytes] | None = None
        self.acct: Path | None = None

    def __enter__(self) -> Profile:
        if self.where is None:
            return self
        self.where.mkdir(parents=True, exist_ok=True)
        if shutil.which("perf"):
            self.perf = subprocess.Popen(
                ["perf", "record", "-a", "-F", str(self.HZ), "-o", str(self._file("perf"))],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # perf's own start-up is not the job's
        if shutil.which("accton"):
            self.acct = self._file("acct")
            self.acct.touch()
            subprocess.run(["accton", str(self.acct)], capture_output=True, check=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.acct is not None:
            subprocess.run(["accton", "off"], capture_output=True, check=False)
        if self.perf is not None:
            self.perf.send_signal(2)  # SIGINT: perf writes its file and ends
            self.perf.wait(timeout=60)

    def _file(self, kind: str) -> Path:
        assert self.where is not None
        return self.where / f"{self.name}.{kind}"

    def summary(self, top: int = 12) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.perf is not None:
            comms = subprocess.run(
                ["perf", "script", "-i", str(self._file("perf")), "-F", "comm"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split("\n")
            counts: dict[str, int] = {}
            for c in comms:
                if c.strip() and c.strip() != "swapper":
                    counts[c.strip()] = counts.get(c.strip(), 0) + 1
            out["cpu_s_by_program"] = {
                k: round(v / self.HZ, 2)
                for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]
            }
        if self.acct is not None:
            lines = subprocess.run(
                ["lastcomm", "-f", str(self.acct)], capture_output=True, text=True, check=False
            ).stdout.splitlines()
            procs: dict[str, int] = {}
            for ln in lines:
                if ln.split():
                    procs[ln.split()[0]] = procs.get(ln.split()[0], 0) + 1
            out["processes_by_program"] = dict(sorted(procs.items(), key=lambda kv: -kv[1])[:top])
        return out


class NeighbourTable:
    """The host's neighbour table thresholds raised for `pods` pods past NEIGH_FROM_PODS
    (said on stderr), and put back as they were."""

    def __init__(self, pods: int) -> None:
        self.saved: dict[str, str] = {}
        if pods <= NEIGH_FROM_PODS:
            return
        for path in NEIGH_SYSCTLS:
            try:
                self.saved[path] = Path(path).read_text().strip()
                Path(path).write_text(NEIGH_RAISED[path[-1]])
            except OSError as exc:
                print(f"neighbour table: cannot raise {path}: {exc}", file=sys.stderr)
        print(
            f"neighbour table: gc_thresh1/2/3 raised to {'/'.join(NEIGH_RAISED.values())} "
            f"for {pods} pods (were {'/'.join(list(self.saved.values())[:3])}); put back after",
            file=sys.stderr,
        )

    def __enter__(self) -> NeighbourTable:
        return self

    def __exit__(self, *exc: object) -> None:
        for path, value in self.saved.items():
            try:
                Path(path).write_text(value)
            except OSError as err:
                print(f"neighbour table: cannot put back {path}: {err}", file=sys.stderr)


def _busy_cpu_s() -> float:
    """CPU seconds this machine has spent busy (every pod's processes: they share it)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0])
    return out


def one_size(
    n: int,
    agent: str,
    mpirun: str,
    runs: int,
    compare: bool,
    *,
    data: bool = False,
    kex: str = "",
    profile: Path | None = None,
    other: str = "",
    bare_kex: str = "",
) -> dict[str, Any]:
    """`runs` rounds on one cluster of `n` workers: workers started, the bare mpirun (and,
    with `bare_kex`, the bare mpirun with that key exchange: the agent's), then
    the agent's job (which ends the workers). With `compare`, as many rounds again with
    the agent's ssh reuse off. With `data`, the pods have a data NIC (net1) and as many
    rounds again run with the data check off (its cost). With `other` (another agent, an
    earlier version, say), a round of it after each of the agent's, alternating which
    comes first ("agent_b")."""
    work = Path(tempfile.mkdtemp(prefix="mpib-scale-", dir="/run"))
    work.chmod(0o755)  # sshd's StrictModes: the keys' directories not writable by others
    s = None
    result: dict[str, Any] = {
        "workers": n,
        "kex": kex or None,
        "bare": [],
        "agent": [],
        "agent_reuse_off": [],
        "agent_data_check_off": [],
        "agent_b": [],
        "bare_kex": [],
    }
    table_ = NeighbourTable(n + 1)
    try:
        s = Scale(n, work, agent, mpirun, data, kex=kex)
        s.profile = profile / str(n) if profile else None
        result["cluster_build_s"] = round(s.build_s, 2)
        variants = [("agent", {})] * runs + (
            [("agent_reuse_off", {"MPI_BOOTSTRAP_SSH_REUSE": "off"})] * runs if compare else []
        )
        if data:  # interleaved, so both see the same machine
            off = ("agent_data_check_off", {"MPI_BOOTSTRAP_DATA_CHECK": "off"})
            offs = [off] * len(variants)
            variants = [v for pair in zip(variants, offs, strict=True) for v in pair]
        if other:
            pairs = [(("agent", {}), ("agent_b", {}))[:: 1 - 2 * (i % 2)] for i in range(runs)]
            variants = [v for pair in pairs for v in pair] + variants[runs:]
        argv: list[str] = []
        for r, (key, extra) in enumerate(variants):
            s.agent = other if key == "agent_b" else agent
            up = s.start_workers()
            time.sleep(1.0)  # at rest: start-up done
            if r == 0:
                result["workers_up_s"] = round(up, 2)
                result["memory_per_worker_pod"] = s.memory()
                argv = result["argv"] = s.plan_argv()
            if key == "agent":
                result["bare"].append(s.counted(lambda argv=argv: s.bare(argv)))
                if bare_kex:
                    result["bare_kex"].append(
                        s.counted(lambda argv=argv: s.bare(argv, kex=bare_kex))
                    )
            result[key].append(s.counted(lambda extra=extra: s.agent_job(**extra)))
            s.end_workers()
        return result
    except (Exception, KeyboardInterrupt) as exc:  # what was measured is kept and shown
        return _stopped(n, result, exc)
    finally:
        if s is not None:
            s.close()
        table_.__exit__()
        shutil.rmtree(work, ignore_errors=True)


def _stopped(n: int, result: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """A size that stopped on an error or a signal: what was measured, and why not more."""
    result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    result["stopped"] = isinstance(exc, KeyboardInterrupt)  # no next size, then
    print(f"{n} workers: stopped: {result['error']}", file=sys.stderr)
    return result


def one_stagger(
    n: int, agent: str, mpirun: str, runs: int, *, spread: float, bare_kex: str
) -> dict[str, Any]:
    """`runs` rounds on one cluster of `n` workers that become ready over `spread` s
    (tests/bench/stagger.py): the bare run with ssh's defaults, the agent, and (with
    `bare_kex`) the bare run with the agent's key exchange."""
    work = Path(tempfile.mkdtemp(prefix="mpib-stagger-", dir="/run"))
    work.chmod(0o755)  # sshd's StrictModes: the keys' directories not writable by others
    result: dict[str, Any] = {"workers": n, "stagger_s": spread, "bare_kex_name": bare_kex}
    s = None
    table_ = NeighbourTable(n + 1)
    try:
        s = Scale(n, work, agent, mpirun, stagger=True)
        result["cluster_build_s"] = round(s.build_s, 2)
        argv = result["argv"] = s.plan_argv()
        result.update(stagger.rounds(s, runs, spread, argv, bare_kex))
        return result
    except (Exception, KeyboardInterrupt) as exc:
        return _stopped(n, result, exc)
    finally:
        if s is not None:
            s.close()
        table_.__exit__()
        shutil.rmtree(work, ignore_errors=True)


def stagger_table(results: list[dict[str, Any]]) -> str:
    head = (
        "| workers | spread | last ready | agent: after the last | bare: after the last "
        "| agent/bare | bare, agent's kex: after the last | agent/that | agent total "
        "| bare total | after the last sshd up: agent / bare |\n" + "|---" * 11 + "|\n"
    )
    rows = []
    for r in results:
        a, b, k = r.get("agent", []), r.get("bare", []), r.get("bare_kex", [])
        aa, bb = _median(a, "after_last_ready_s"), _median(b, "after_last_ready_s")
        kk = _median(k, "after_last_ready_s")
        ok = all(x["exit_code"] == 0 and x["all_hosts_ran"] for x in a + b + k) and bool(a)
        rows.append(
            f"| {r['workers']} | {r['stagger_s']:g} s | {_median(a, 'last_ready_s')} s "
            f"| {aa} s | {bb} s | {f'{aa / bb:.2f}x' if aa and bb else 'n/a'} "
            f"| {kk if k else ''} | {f'{aa / kk:.2f}x' if aa and kk else ''} "
            f"| {_median(a, 'total_s')} s | {_median(b, 'total_s')} s "
            f"| {_median(a, 'after_last_up_s')} / {_median(b, 'after_last_up_s')} s |"
            + ("" if ok and "error" not in r else f" FAILED {r.get('error', '')[:200]}")
        )
    return head + "\n".join(rows) + "\n"


def _median(runs: list[dict[str, Any]], *keys: str) -> float | None:
    vals = []
    for r in runs:
        v: Any = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            vals.append(float(v))
    return round(statistics.median(vals), 2) if vals else None


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| workers | records | start → mpirun start | checks passed | mpirun's own run "
        "| total (agent) | bare mpirun | agent/bare | paired | agent, reuse off | other agent "
        "(busy CPU) | logins agent/bare | worker pod PSS (USS) | busy CPU agent/bare |\n"
        + "|---" * 14
        + "|\n"
    )
    rows = []
    for r in results:
        a, b, off = r["agent"], r["bare"], r["agent_reuse_off"]
        total, bare = _median(a, "total_s"), _median(b, "total_s")
        ok = all(x["exit_code"] == 0 and x["all_hosts_ran"] for x in a + b + off)
        ok = ok and bool(a) and "error" not in r
        mem = r.get("memory_per_worker_pod")
        ratios = [x["total_s"] / y["total_s"] for x, y in zip(a, b, strict=False)]
        rows.append(
            "| "
            + " | ".join(
                str(x)
                for x in (
                    r["workers"],
                    _median(a, "phases_s", "records"),
                    _median(a, "phases_s", "mpirun_start"),
                    _median(a, "phases_s", "checks_passed"),
                    _median(a, "mpirun_run_s"),
                    total,
                    bare,
                    f"{total / bare:.2f}x" if total and bare else "n/a",
                    f"{statistics.median(ratios):.2f}" if ratios else "n/a",
                    _median(off, "total_s") if off else "",
                    f"{_median(r['agent_b'], 'total_s')} ({_median(r['agent_b'], 'busy_cpu_s')} s)"
                    if r.get("agent_b")
                    else "",
                    f"{_median(a, 'logins')}/{_median(b, 'logins')}",
                    f"{mem['pss_mib_median']} MiB ({mem['uss_mib_median']} MiB)" if mem else "",
                    f"{_median(a, 'busy_cpu_s')}/{_median(b, 'busy_cpu_s')} s",
                )
            )
            + " |"
            + ("" if ok else f" FAILED {r.get('error', '')[:200]}")
        )
    return head + "\n".join(rows) + "\n"


def data_table(results: list[dict[str, Any]]) -> str:
    """The data check's cost: launcher start → mpirun start with it and without."""
    head = (
        "| workers | data check's own time | start → mpirun start, check on | check off "
        "| cost | cost, paired | CPU the check adds (all pods) |\n" + "|---" * 7 + "|\n"
    )
    rows = []
    for r in results:
        on = _median(r["agent"], "phases_s", "mpirun_start")
        off = _median(r["agent_data_check_off"], "phases_s", "mpirun_start")
        pre = [
            x["phases_s"]["data_check"] - x["phases_s"]["preflight"]
            for x in r["agent"]
            if "data_check" in x["phases_s"]
        ]
        own = round(statistics.median(pre), 2) if pre else None
        cost = f"{(on - off) / off:+.0%}" if on and off else "n/a"
        paired = _paired(r["agent"], r["agent_data_check_off"], off)
        cpu_on = _median(r["agent"], "busy_cpu_s")
        cpu_off = _median(r["agent_data_check_off"], "busy_cpu_s")
        cpu = f"{cpu_on - cpu_off:.2f} s" if cpu_on and cpu_off else "n/a"
        rows.append(f"| {r['workers']} | {own} s | {on} s | {off} s | {cost} | {paired} | {cpu} |")
    return head + "\n".join(rows) + "\n"


def _paired(on: list[dict[str, Any]], off: list[dict[str, Any]], base: float | None) -> str:
    """The median of the differences within each back-to-back pair, over the check-off
    median: the machine's slow drift cancels out of each pair."""
    diffs = [
        a["phases_s"]["mpirun_start"] - b["phases_s"]["mpirun_start"]
        for a, b in zip(on, off, strict=False)
        if "mpirun_start" in a["phases_s"] and "mpirun_start" in b["phases_s"]
    ]
    if not diffs or not base:
        return "n/a"
    return f"{statistics.median(diffs) / base:+.0%} ({statistics.median(diffs):+.2f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workers", nargs="*", type=int, default=[16, 32, 64, 128])
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--runs", type=int, default=3, help="jobs per size (medians reported)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--compare-reuse",
        action="store_true",
        help="also run the agent with MPI_BOOTSTRAP_SSH_REUSE=off",
    )
    ap.add_argument(
        "--data",
        action="store_true",
        help="pods with a data NIC; also run the agent with MPI_BOOTSTRAP_DATA_CHECK=off",
    )
    ap.add_argument(
        "--kex",
        default="",
        help="the key exchange of both jobs' ssh (the agent's MPI_BOOTSTRAP_SSH_KEX, the bare "
        "run's KexAlgorithms), e.g. curve25519-sha256; default: ssh's own",
    )
    ap.add_argument(
        "--agent",
        default="",
        help="the mpi-bootstrap command the pods run (default: .venv's, else on PATH); "
        "`make bench-scale` gives a plain install with the runtime dependencies only",
    )
    ap.add_argument(
        "--compare-agent",
        default="",
        help="another mpi-bootstrap (an earlier version's plain install), run on the same "
        "workers in alternate rounds with the agent's; its totals in the table too",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="profile every job (perf record -a, process accounting): where the CPU went, "
        "by program, and how many processes of each; files kept in this directory",
    )
    ap.add_argument(
        "--bare-kex",
        default="",
        help="also run the bare mpirun with this key exchange (the agent's: "
        "curve25519-sha256 with OpenSSH before 9.9), beside the one with --kex's",
    )
    ap.add_argument(
        "--stagger",
        type=float,
        default=None,
        metavar="S",
        help="workers ready one after another over S seconds (tests/bench/stagger.py): "
        "each run's time after the last worker was ready, agent and bare",
    )
    add_worker_env(ap)
    args = ap.parse_args(argv)
    WORKER_ENV.update(worker_env(args))
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    agent = args.agent or _agent()
    results = []
    show = stagger_table if args.stagger is not None else table
    for n in args.workers:
        r = (
            one_stagger(
                n, agent, args.mpirun, args.runs, spread=args.stagger, bare_kex=args.bare_kex
            )
            if args.stagger is not None
            else one_size(
                n,
                agent,
                args.mpirun,
                args.runs,
                args.compare_reuse,
                data=args.data,
                kex=args.kex,
                profile=args.profile,
                other=args.compare_agent,
                bare_kex=args.bare_kex,
            )
        )
        results.append(r)
        print(show([r]).splitlines()[-1], flush=True)
        if args.json:  # after each size: a later one that fails loses nothing before it
            args.json.write_text(json.dumps(results, indent=2))
        if r.get("stopped"):
            break
    print()
    print(
        f"cores: {os.cpu_count()}; mpirun: {args.mpirun}; runs per size: {args.runs}; "
        f"key exchange: {args.kex or 'ssh default'}"
    )
    print(show(results))
    if args.data:
        print(data_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 130 if results and results[-1].get("stopped") else 0


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: what it made is removed
