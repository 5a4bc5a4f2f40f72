"""`make bench`: the mpi-bootstrap benchmarks. Prints a table; writes .bench/results.json.

    1. DNS round      one wait_for() round over 4,096 names served by a real dnsmasq
    2. late record    how fast wait_for() sees an 8-host job's last record appear
    3. --explain      the whole `mpi-bootstrap launcher --explain` process, 2 hosts
    4. hostfile       parse + fqdn rewrite + render + atomic write of 100,000 lines

Benchmarks 1-3 run inside a private network namespace (tests/support/netns.py) whose
resolv.conf is `nameserver 127.0.0.1` + `options ndots:1` and whose only DNS server is a
dnsmasq on that namespace's loopback (tests/support/dnsmasq.py): no packet leaves it.
Numbers are reported, never asserted: the exit status is non-zero only when a benchmark
could not run.
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import json
import math
import os
import platform
import pstats
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mpi_bootstrap.core import hostfile, settings
from mpi_bootstrap.system import files
from tests.support import dnsmasq as dnsmasq_mod
from tests.support import netns as netns_mod
from tests.support.dnsmasq import Dnsmasq
from tests.support.interrupt import run_main, shielded
from tests.support.netns import Netns

INNER = os.path.join(ROOT, "tests", "bench", "inner.py")
OUT_DIR = os.path.join(ROOT, ".bench")
OUT_JSON = os.path.join(OUT_DIR, "results.json")
PY = sys.executable
AGENT = os.path.join(os.path.dirname(PY), "mpi-bootstrap")

RESOLV_CONF = "nameserver 127.0.0.1\noptions ndots:1\n"
DOMAIN = "cluster.local"

# Benchmark sizes and targets (seconds).
ROUND_HOSTS = 4096
ROUND_RUNS = 5
# The agent's shipped default (--dns-concurrency) is the headline; the sweep brackets it.
DEFAULT_CONCURRENCY = int(
    next((s.default for s in settings.SETTINGS if s.name == "dns_concurrency"), 64)
)
CONCURRENCIES = tuple(sorted({16, 32, 64, 128, DEFAULT_CONCURRENCY}))
ROUND_TARGET = 0.25
LATE_HOSTS = 8
LATE_TRIALS = 10
LATE_INTERVAL = 3.0
BASH_PHASES = (1 / 6, 3 / 6, 5 / 6)  # where in the 3 s sleep the record lands
EXPLAIN_RUNS = 20
EXPLAIN_TARGET = 0.150
IMPORTTIME_RUNS = 3
HOSTFILE_LINES = 100_000
HOSTFILE_RUNS = 5
HOSTFILE_TARGET = 0.5


def round_name(i: int) -> str:
    return f"job-worker-{i}.job.default.svc.{DOMAIN}"


def round_addr(i: int) -> str:
    return f"198.18.{i // 250}.{i % 250 + 1}"  # RFC 2544 benchmark range


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def clean(obj: Any) -> Any:
    """NaN/inf → None, so results.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def nsrun(ns: Netns, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run argv inside the namespace, capturing its output as text."""
    return subprocess.run(
        [*ns.prefix(), *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_inner(ns: Netns, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run inner.py inside the namespace; return its JSON."""
    done = nsrun(ns, [PY, INNER, *args], timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"inner.py {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---------------------------------------------------------------- 1. DNS round


def bench_dns_round(ns: Netns, workdir: str) -> dict[str, Any]:
    names_file = os.path.join(workdir, "names-4096")
    with open(names_file, "w", encoding="ascii") as fh:
        fh.write("".join(f"{round_name(i)}\n" for i in range(ROUND_HOSTS)))
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in CONCURRENCIES}
    for r in range(ROUND_RUNS):
        # A fresh process per round (wait_for's worker threads never exit), and the
        # order rotates so that no concurrency always goes first.
        order = CONCURRENCIES[r % len(CONCURRENCIES) :] + CONCURRENCIES[: r % len(CONCURRENCIES)]
        for c in order:
            runs[c].append(
                run_inner(
                    ns, ["round", "--names", names_file, "--concurrency", str(c)], timeout=150
                )
            )
    sweep = {}
    for c, rs in runs.items():
        secs = [x["seconds"] for x in rs]
        sweep[c] = {
            "median_s": median(secs),
            "min_s": min(secs),
            "max_s": max(secs),
            "runs_s": secs,
            "all_resolved": all(x["ok"] for x in rs),
            "lookups": [x["lookups"] for x in rs],
            # Queries dropped on dnsmasq's full socket buffer: glibc then waits
            # its whole `timeout` (5 s) before it asks again.
            "udp_rcvbuf_drops": [x["udp_rcvbuf_drops"] for x in rs],
        }
    best = min(sweep, key=lambda c: sweep[c]["median_s"])
    ours = sweep[DEFAULT_CONCURRENCY]["median_s"]
    base = run_inner(ns, ["bash-round", "--names", names_file], timeout=150)
    return {
        "hosts": ROUND_HOSTS,
        "runs": ROUND_RUNS,
        "concurrency": DEFAULT_CONCURRENCY,
        "median_s": ours,
        "target_s": ROUND_TARGET,
        "all_resolved": sweep[DEFAULT_CONCURRENCY]["all_resolved"],
        "baseline": {
            "what": 'for h in $(cat names); do getent hosts "$h" >/dev/null; '
            "done  (one round, timed once)",
            "seconds": base["seconds"],
            "failed": base["failed"],
            "ok": base["ok"],
        },
        "ratio_baseline_over_ours": base["seconds"] / ours if ours > 0 else math.nan,
        "concurrency_sweep": {str(c): v for c, v in sweep.items()},
        "best_concurrency": best,
    }


# ---------------------------------------------------------------- 2. late record


def late_records() -> dict[str, str]:
    """The 7 records present from the start, for every trial (ours and the shell's)."""
    out = {}
    for k in range(LATE_TRIALS):
        for i in range(LATE_HOSTS - 1):
            out[f"lat{k}-worker-{i}.lat{k}.default.svc.{DOMAIN}"] = f"198.19.{10 + k}.{i + 1}"
    for k in range(len(BASH_PHASES)):
        for i in range(LATE_HOSTS - 1):
            out[f"bash{k}-worker-{i}.bash{k}.default.svc.{DOMAIN}"] = f"198.19.{40 + k}.{i + 1}"
    return out


def bench_late_record(ns: Netns, dm: Dnsmasq, workdir: str) -> dict[str, Any]:
    ours = run_inner(
        ns,
        [
            "latency",
            "--hostsdir",
            dm.hostsdir,
            "--trials",
            str(LATE_TRIALS),
            "--hosts",
            str(LATE_HOSTS),
            "--interval",
            str(LATE_INTERVAL),
        ],
        timeout=LATE_TRIALS * 25,
    )
    trials = ours["trials"]
    lat = [t["latency_from_visible"] for t in trials]
    lat_w = [t["latency_from_write"] for t in trials]
    rates = [t["rate_after_first_round"] for t in trials]
    repoll = [t["repoll_rate"] for t in trials]
    peak = [t["max_lookups_in_1s_after_first_round"] for t in trials]
    bash = run_inner(
        ns,
        [
            "bash-latency",
            "--hostsdir",
            dm.hostsdir,
            "--workdir",
            workdir,
            "--phases",
            ",".join(f"{p:.4f}" for p in BASH_PHASES),
            "--hosts",
            str(LATE_HOSTS),
            "--interval",
            str(LATE_INTERVAL),
        ],
        timeout=len(BASH_PHASES) * 25,
    )
    blat = [t["latency_from_visible"] for t in bash["trials"]]
    bmean = statistics.fmean(blat) if blat else math.nan
    med = median(lat)
    return {
        "hosts": LATE_HOSTS,
        "trials": LATE_TRIALS,
        "interval_s": LATE_INTERVAL,
        "measured_from": "first direct A query (1 ms polls from a thread in the same "
        "process, straight to dnsmasq) that answers the new record; "
        "latency_from_write also given",
        "median_s": med,
        "max_s": max(lat),
        "mean_s": statistics.fmean(lat),
        "from_write_median_s": median(lat_w),
        "from_write_max_s": max(lat_w),
        "visible_after_write_median_s": median([t["visible_after_write"] for t in trials]),
        "all_ok": all(t["ok"] for t in trials),
        "lookups_total": [t["lookups"] for t in trials],
        "lookups_total_median": median([t["lookups"] for t in trials]),
        "budget_lookups_per_s": ours["budget_per_s"],
        # Three views of "lookups per second after the first round":
        # rate_after_first_round = re-polls / (return - last first-round lookup); it
        #   counts one lookup too many for its window (the bucket starts refilling when
        #   the first round is sent, a few ms before its last lookup starts);
        # repoll_rate = (re-polls - 1) / (last re-poll - first re-poll), the steady rate;
        # peak = most re-polls in any 1 s window; a token bucket allows rate x 1 s + 1.
        "rate_after_first_round_median": median(rates),
        "rate_after_first_round_max": max(rates),
        "repoll_rate_median": median(repoll),
        "repoll_rate_max": max(repoll),
        "max_lookups_in_any_1s_after_first_round": max(peak),
        "within_budget_rule": "repoll_rate_max <= budget x 1.01 (timer jitter) and "
        "peak <= budget + 1 (the bucket's carried fraction of a token)",
        "within_budget": max(repoll) <= ours["budget_per_s"] * 1.01
        and max(peak) <= ours["budget_per_s"] + 1,
        "per_trial": trials,
        "baseline": {
            "what": "shell loop: getent every host, `sleep 3` between rounds; record lands "
            f"at {', '.join(f'{p:.2f}' for p in BASH_PHASES)} of the sleep "
            "(stratified, so the mean estimates a random arrival)",
            "trials_s": blat,
            "mean_s": bmean,
            "max_s": max(blat) if blat else math.nan,
            "expected_mean_s": "interval/2 + one round = 1.5 s + a few ms",
            "all_ok": all(t["ok"] for t in bash["trials"]),
        },
        "ratio_baseline_mean_over_ours_median": bmean / med if med > 0 else math.nan,
    }


# ---------------------------------------------------------------- 3. --explain


@dataclasses.dataclass
class Imp:
    """One `-X importtime` line."""

    name: str
    level: int
    self_us: int
    cum_us: int
    parent: str | None = None  # the module whose import ran this one


def parse_importtime(text: str) -> list[Imp]:
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:") :].split("|", 2)
        level = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append(Imp(name.strip(), level, int(self_us), int(cum_us)))
    # Output is post-order: a module's importer is the next line one level up.
    pending: dict[int, list[Imp]] = {}
    for row in rows:
        for child in pending.pop(row.level + 1, []):
            child.parent = row.name
        pending.setdefault(row.level, []).append(row)
    return rows


def importtime_report(runs: list[str]) -> dict[str, Any]:
    parsed = [parse_importtime(t) for t in runs]
    # Packages entered from our own modules: what making imports lazy would save.
    entries: dict[tuple[str, str], list[int]] = {}
    selfs: dict[str, list[int]] = {}
    totals = []
    for rows in parsed:
        # A module imported in another thread while the main thread is importing
        # (encodings.idna, from getaddrinfo in a DNS worker) can show a negative self time.
        totals.append(sum(max(0, r.self_us) for r in rows))
        for r in rows:
            selfs.setdefault(r.name, []).append(r.self_us)
            ours = r.name.split(".")[0] == "mpi_bootstrap"
            if ours or (r.parent or "").startswith("mpi_bootstrap"):
                entries.setdefault((r.parent or "(entry point)", r.name), []).append(r.cum_us)
    ext = sorted(
        ((k, median(v) / 1000) for k, v in entries.items() if not k[1].startswith("mpi_bootstrap")),
        key=lambda kv: -kv[1],
    )
    own = sorted(
        ((k, median(v) / 1000) for k, v in entries.items() if k[1].startswith("mpi_bootstrap")),
        key=lambda kv: -kv[1],
    )
    top_self = sorted(((k, median(v) / 1000) for k, v in selfs.items()), key=lambda kv: -kv[1])
    return {
        "note": "-X importtime instruments every import, so its times run high; compare "
        "them with each other, not with wall times",
        "total_import_ms": median(totals) / 1000,
        "external_imported_by_mpi_bootstrap": [
            {"module": k[1], "imported_by": k[0], "cumulative_ms": round(ms, 2)}
            for k, ms in ext[:12]
        ],
        "mpi_bootstrap_modules": [
            {"module": k[1], "imported_by": k[0], "cumulative_ms": round(ms, 2)}
            for k, ms in own[:12]
        ],
        "top_self_ms": [{"module": k, "self_ms": round(ms, 2)} for k, ms in top_self[:12]],
    }


def bench_explain(ns: Netns, workdir: str) -> dict[str, Any]:
    hf_path = os.path.join(workdir, "hostfile-2")
    with open(hf_path, "w", encoding="ascii") as fh:
        fh.write("localhost slots=1\n127.0.0.1 slots=1\n")
    out_hf = os.path.join(workdir, "out-hostfile")
    argv = [
        AGENT,
        "launcher",
        "--explain",
        "--hostfile",
        hf_path,
        "--output-hostfile",
        out_hf,
        "--dns-wait-seconds",
        "5",
        "--",
        "/bin/true",
    ]
    check = nsrun(ns, argv, timeout=60)
    if check.returncode != 0 or "Command:" not in check.stdout:
        raise RuntimeError(
            f"launcher --explain exited {check.returncode}: {check.stderr.strip()[-2000:]}"
        )
    refs = {
        "launcher --explain": argv,
        "python -c pass": [PY, "-c", "pass"],
        "python -c 'import cli, launcher'": [
            PY,
            "-c",
            "import mpi_bootstrap.cli, mpi_bootstrap.launcher",
        ],
        "mpirun --version": ["mpirun", "--version"],
    }
    timings: dict[str, dict[str, Any]] = {}
    tool = "hyperfine"
    if shutil.which("hyperfine"):
        export = os.path.join(workdir, "hyperfine.json")
        cmd = [
            *ns.prefix(),
            "hyperfine",
            "-N",
            "--warmup",
            "3",
            "--runs",
            str(EXPLAIN_RUNS),
            "--export-json",
            export,
            "--style",
            "none",
        ]
        for label, a in refs.items():
            cmd += ["--command-name", label, shlex.join(a)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"hyperfine exited {done.returncode}: {done.stderr[-2000:]}")
        with open(export, encoding="utf-8") as fh:
            for res in json.load(fh)["results"]:
                timings[res["command"]] = {
                    "median_s": res["median"],
                    "mean_s": res["mean"],
                    "min_s": res["min"],
                    "max_s": res["max"],
                    "user_s": res["user"],
                    "system_s": res["system"],
                }
    else:  # time it ourselves: one `ip netns exec` per run, so subtract its cost
        tool = "self-timed (hyperfine not found)"
        for label, a in refs.items():
            ts = []
            for _ in range(EXPLAIN_RUNS):
                t0 = time.perf_counter()
                if nsrun(ns, a, timeout=60).returncode != 0:
                    raise RuntimeError(f"{label} failed")
                ts.append(time.perf_counter() - t0)
            timings[label] = {"median_s": median(ts), "min_s": min(ts), "max_s": max(ts)}
    imports = []
    for _ in range(IMPORTTIME_RUNS):
        done = nsrun(ns, [PY, "-X", "importtime", *argv], timeout=60)
        imports.append(done.stderr)
    ours = timings["launcher --explain"]["median_s"]
    return {
        "runs": EXPLAIN_RUNS,
        "tool": tool,
        "argv": argv,
        "median_s": ours,
        "target_s": EXPLAIN_TARGET,
        "reference": timings,
        "importtime": importtime_report(imports),
    }


# ---------------------------------------------------------------- 4. hostfile


def bench_hostfile(workdir: str) -> dict[str, Any]:
    data = "".join(
        f"job-worker-{i}.job.default.svc slots=1\n" for i in range(HOSTFILE_LINES)
    ).encode("ascii")
    out = os.path.join(workdir, "hostfile-100k")

    def once() -> dict[str, float]:
        t0 = time.perf_counter()
        parsed = hostfile.parse(data, "bench-hostfile")
        t1 = time.perf_counter()
        names = {h.name: hostfile.fqdn(h.name, DOMAIN) for h in parsed.hosts}
        renamed = hostfile.rename(parsed, names)
        t2 = time.perf_counter()
        text = hostfile.render(renamed, hostfile.OPENMPI)
        t3 = time.perf_counter()
        files.atomic_write(out, text)
        t4 = time.perf_counter()
        return {
            "total": t4 - t0,
            "parse": t1 - t0,
            "fqdn+rename": t2 - t1,
            "render": t3 - t2,
            "atomic_write": t4 - t3,
        }

    once()  # warm-up
    runs = [once() for _ in range(HOSTFILE_RUNS)]
    with open(out, encoding="utf-8") as fh:
        first = fh.readline().strip()
    prof = cProfile.Profile()
    prof.enable()
    once()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    top = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in sorted(
        stats.stats.items(), key=lambda kv: -kv[1][2]
    )[:10]:  # type: ignore[attr-defined]
        where = f"{os.path.relpath(fname, ROOT) if fname.startswith(ROOT) else fname}:{line}"
        top.append(
            {
                "function": f"{func} ({where})",
                "calls": nc,
                "tottime_s": round(tt, 4),
                "cumtime_s": round(ct, 4),
            }
        )
    med = median([r["total"] for r in runs])
    return {
        "lines": HOSTFILE_LINES,
        "runs": HOSTFILE_RUNS,
        "median_s": med,
        "target_s": HOSTFILE_TARGET,
        "phases_median_s": {k: median([r[k] for r in runs]) for k in runs[0] if k != "total"},
        "first_output_line": first,
        "profile_top_tottime": top,
    }


# ---------------------------------------------------------------- PID 1 (pid1.py)

PID1 = os.path.join(ROOT, "tests", "bench", "pid1.py")


def run_script(name: str, timeout: float) -> dict[str, Any]:
    """Run tests/bench/<name>.py as it runs alone; its stdout is one JSON object."""
    path = os.path.join(ROOT, "tests", "bench", f"{name}.py")
    p = subprocess.Popen([PY, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        # Not subprocess.run's SIGKILL: SIGTERM lets the script remove its pods, daemons and
        # files (it ends on SIGTERM as on Ctrl-C: tests/support/interrupt.py) before it goes.
        with shielded():
            p.terminate()
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        raise
    if p.returncode != 0:
        raise RuntimeError(f"{name}.py exited {p.returncode}: {err.strip()[-2000:]}")
    return json.loads(out)  # type: ignore[no-any-return]


def bench_pid1() -> dict[str, Any]:
    """Supervisor RSS and SIGTERM latency."""
    return run_script("pid1", 240)


def bench_ssh() -> dict[str, Any]:
    """Worker readiness and preflight over 16 workers."""
    return run_script("ssh", 600)


def bench_cluster() -> dict[str, Any]:
    """Time to first rank per MPI, 16-worker launch phases."""
    return run_script("cluster", 900)


def bench_container() -> dict[str, Any]:
    """Image size added, container start to sshd ready."""
    return run_script("container", 1200)


def bench_doctor() -> dict[str, Any]:
    """doctor over 64 hosts with one nameserver down."""
    return run_script("doctor", 600)


# ---------------------------------------------------------------- report


def fmt_s(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


Row = tuple[str, str, str, str, str]


def did_not_run(
    b: dict[str, Any], key: str, title: str, rows: list[Row], details: list[str]
) -> bool:
    """A DID NOT RUN row (and the error's first line) for a benchmark that failed."""
    if "error" in b.get(key, {}):
        rows.append((title, "DID NOT RUN", "", "", ""))
        details.append(f"{title}: {b[key]['error'].splitlines()[0][:300]}")
        return True
    return False


def dns_round_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    rows.append(
        (
            f"1. DNS round, 4096 hosts, c={r['concurrency']}",
            fmt_s(r["median_s"]),
            f"<= {fmt_s(r['target_s'])}",
            f"{fmt_s(r['baseline']['seconds'])} (getent loop)",
            f"{r['ratio_baseline_over_ours']:.1f}x",
        )
    )
    sweep = ", ".join(
        f"c={c}: {fmt_s(v['median_s'])}"
        + (
            f" ({sum(v['udp_rcvbuf_drops'])} UDP queries dropped on dnsmasq's full "
            "receive buffer; each costs glibc's 5 s timeout)"
            if sum(v["udp_rcvbuf_drops"])
            else ""
        )
        for c, v in r["concurrency_sweep"].items()
    )
    details.append(
        f"1. all resolved: {r['all_resolved']} (baseline failures: "
        f"{r['baseline']['failed']}); concurrency sweep (median of "
        f"{r['runs']}): {sweep}; best: c={r['best_concurrency']}"
    )


def late_record_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    rows.append(
        (
            "2. late 8th record, detection",
            fmt_s(r["median_s"]),
            "(n/a)",
            f"{fmt_s(r['baseline']['mean_s'])} mean (sleep 3)",
            f"{r['ratio_baseline_mean_over_ours_median']:.0f}x",
        )
    )
    details.append(
        f"2. {r['trials']} trials: median {fmt_s(r['median_s'])}, max {fmt_s(r['max_s'])} "
        f"after dnsmasq first answered (from the write: median "
        f"{fmt_s(r['from_write_median_s'])}, max {fmt_s(r['from_write_max_s'])}); lookups "
        f"per trial {r['lookups_total']}; after the first round: re-poll rate "
        f"{r['repoll_rate_median']:.3f}/s median, {r['repoll_rate_max']:.3f}/s max; "
        f"re-polls/(time after first round) {r['rate_after_first_round_max']:.2f}/s max; "
        f"peak {r['max_lookups_in_any_1s_after_first_round']} in any 1 s (budget "
        f"{r['budget_lookups_per_s']:g}/s: {'within' if r['within_budget'] else 'OVER'});"
        f" shell loop trials: {', '.join(fmt_s(x) for x in r['baseline']['trials_s'])}"
    )


def explain_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    ref = r["reference"]
    rows.append(
        (
            "3. launcher --explain, 2 hosts",
            fmt_s(r["median_s"]),
            f"<= {fmt_s(r['target_s'])}",
            "",
            "",
        )
    )
    details.append(
        "3. reference ({}, median of {}): {}".format(
            r["tool"], r["runs"], "; ".join(f"{k}: {fmt_s(v['median_s'])}" for k, v in ref.items())
        )
    )
    it = r["importtime"]
    details.append(
        f"   -X importtime (instrumented, so high; median of {IMPORTTIME_RUNS}): "
        f"{it['total_import_ms']:.1f} ms in imports; top self times (ms): "
        + ", ".join(f"{e['module']} {e['self_ms']:.1f}" for e in it["top_self_ms"][:6])
    )
    details.append("   biggest imports made by mpi_bootstrap modules (cumulative ms):")
    details.extend(
        f"     {e['cumulative_ms']:6.1f} ms  {e['module']}  (imported by {e['imported_by']})"
        for e in it["external_imported_by_mpi_bootstrap"][:8]
    )
    details.append("   mpi_bootstrap modules (cumulative):")
    details.extend(
        f"     {e['cumulative_ms']:6.1f} ms  {e['module']}" for e in it["mpi_bootstrap_modules"][:8]
    )


def hostfile_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    rows.append(
        (
            "4. hostfile 100k: parse+fqdn+write",
            fmt_s(r["median_s"]),
            f"<= {fmt_s(r['target_s'])}",
            "",
            "",
        )
    )
    details.append(
        "4. phases (median): "
        + ", ".join(f"{k} {fmt_s(v)}" for k, v in r["phases_median_s"].items())
    )
    details.append("   profile (one run under cProfile, by own time):")
    details.extend(
        f"     {p['tottime_s'] * 1000:7.1f} ms  {p['calls']:>8} calls  {p['function']}"
        for p in r["profile_top_tottime"][:8]
    )


def pid1_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    rss, term = r.get("supervisor_rss", {}), r.get("sigterm_latency", {})
    if rss:
        rows.append(
            (
                "5. supervisor RSS (pid1.py)",
                f"{rss.get('supervisor_rss_mib')} MiB",
                f"<= {rss.get('target_mib')} MiB",
                f"{rss.get('bare_python_rss_mib')} MiB (bare python)",
                f"{rss.get('ratio')} (ours/bare)",
            )
        )
    if term:
        rows.append(
            (
                "6. SIGTERM to exit (pid1.py)",
                f"{term.get('median_ms')} ms",
                f"<= {term.get('target_ms')} ms",
                "",
                "",
            )
        )
        details.append(
            f"5-6. from tests/bench/pid1.py: SIGTERM latency max "
            f"{term.get('max_ms')} ms over {term.get('runs')} runs"
        )
    beside = r.get("beside_tini", {})
    if beside:
        details.append(
            "5b. PID 1 beside Debian's tini and dumb-init, same process tree (median; max):"
        )
        details.append(
            f"     {'':10} {'RSS':>9} {'forward':>16} {'SIGTERM->exit':>18} {'start-up window':>19}"
        )
        for init, v in beside.items():
            fw, te, sw = v["forward"], v["sigterm_to_exit"], v["startup_window"]
            details.append(
                f"     {init:10} {v['rss_mib']:>5} MiB {fw['median_ms']:>6} ms "
                f"({fw['max_ms']:>5}) {te['median_ms']:>7} ms ({te['max_ms']:>6}) "
                f"{sw['median_ms']:>7} ms ({sw['max_ms']:>7})"
            )


def ssh_rows(r: dict[str, Any], rows: list[Row], _details: list[str]) -> None:
    ready, pf = r.get("worker_ready", {}), r.get("preflight_16", {})
    if ready:
        rows.append(
            (
                "7. worker start to sshd ready",
                f"{ready.get('median_ms')} ms",
                f"<= {ready.get('target_ms')} ms",
                "",
                "",
            )
        )
    if pf:
        rows.append(
            (
                "8. preflight, 16 workers",
                f"{pf.get('parallel_ms')} ms",
                "",
                f"{pf.get('serial_ms')} ms (one by one)",
                f"{pf.get('ratio')}x",
            )
        )


def cluster_rows(r: dict[str, Any], rows: list[Row], details: list[str]) -> None:
    for mpi, v in r.get("pods_up_to_first_rank", {}).items():
        med = v.get("median_s")
        rows.append(
            (
                f"9. pods up -> first rank, {mpi}",
                f"{med:.2f} s" if med is not None else "FAILED",
                "",
                f"{v.get('runs_ok')}/{v.get('runs')} runs ok",
                "",
            )
        )
    split = r.get("workers16_phases_s", {})
    if split:
        rows.append(
            (
                "10. 16 workers: start -> mpirun",
                f"{split.get('total_to_mpirun_start')} s",
                "",
                "",
                "",
            )
        )
        details.append(
            "10. 16 workers, launcher phases (s): "
            + ", ".join(f"{k} {v}" for k, v in split.items() if k != "total_to_mpirun_start")
        )


def container_rows(r: dict[str, Any], rows: list[Row], _details: list[str]) -> None:
    img, start = r.get("image_mb", {}), r.get("container_start_to_sshd_ready_ms", {})
    rows.append(
        (
            "11. image size added by agent",
            f"{img.get('added_by_agent_layer')} MB",
            "",
            f"venv alone {img.get('agent_venv_only')} MB",
            "",
        )
    )
    rows.append(("12. container start -> sshd ready", f"{start.get('median')} ms", "", "", ""))


def doctor_rows(r: dict[str, Any], rows: list[Row], _details: list[str]) -> None:
    rows.append(
        (
            "13. doctor, 64 hosts, 1 NS down",
            f"{r.get('elapsed_s')} s",
            f"<= {r.get('doctor_deadline_s')} s deadline",
            f"{r.get('serial_worst_case_s')} s (hosts x timeout)",
            "",
        )
    )


# (key in results["benchmarks"], title when it did not run, always reported (else only when
# present), the function adding its rows and details), in the table's order.
SECTIONS: tuple[
    tuple[str, str, bool, Callable[[dict[str, Any], list[Row], list[str]], None]], ...
] = (
    ("dns_round", "1. DNS round, 4096 hosts", True, dns_round_rows),
    ("late_record", "2. late 8th record", True, late_record_rows),
    ("explain", "3. launcher --explain", True, explain_rows),
    ("hostfile", "4. hostfile 100k lines", True, hostfile_rows),
    ("pid1", "5. PID 1 (pid1.py)", False, pid1_rows),
    ("ssh", "7. SSH (ssh.py)", False, ssh_rows),
    ("cluster", "9. cluster (cluster.py)", False, cluster_rows),
    ("container", "11. container (container.py)", False, container_rows),
    ("doctor", "13. doctor (doctor.py)", False, doctor_rows),
)


def table(results: dict[str, Any]) -> str:
    b = results["benchmarks"]
    rows: list[Row] = [("Benchmark", "Result (median)", "Target", "Baseline", "Baseline/ours")]
    details: list[str] = []
    for key, title, always, add_rows in SECTIONS:
        if (always or key in b) and not did_not_run(b, key, title, rows, details):
            add_rows(b[key], rows, details)
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, "", *details])


def meta() -> dict[str, Any]:
    def out(argv: list[str]) -> str:
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except OSError:
            return ""

    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": out(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "",
        "dnsmasq": out([dnsmasq_mod.DNSMASQ, "--version"]).splitlines()[0:1],
        "namespace_resolv_conf": RESOLV_CONF,
    }


def guarded(results: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.monotonic()
    print(f"  running {key} ...", file=sys.stderr, flush=True)
    try:
        results["benchmarks"][key] = fn()
    except Exception as exc:
        results["benchmarks"][key] = {"error": f"{exc!r}\n{traceback.format_exc()}"}
    results["benchmarks"][key]["bench_wall_s"] = time.monotonic() - t0


def skip(results: dict[str, Any], keys: Sequence[str], why: str) -> None:
    for key in keys:
        results["benchmarks"][key] = {"error": f"skipped: {why}"}


def main() -> int:
    t_start = time.monotonic()
    results: dict[str, Any] = {"meta": meta(), "benchmarks": {}}
    workdir = tempfile.mkdtemp(prefix="mpib-bench-")
    os.chmod(workdir, 0o755)  # noqa: S103 - dnsmasq and the namespace read files here
    try:
        ok, why = netns_mod.available()
        if ok:
            ok, why = dnsmasq_mod.available()
        ns_keys = ("dns_round", "late_record", "explain")
        if not ok:
            skip(results, ns_keys, why)
        else:
            try:
                hosts = f"127.0.0.1 localhost\n::1 localhost\n127.0.0.1 {socket.gethostname()}\n"
                with Netns("mpib-bench", resolv_conf=RESOLV_CONF, hosts=hosts) as ns:
                    records = {round_name(i): round_addr(i) for i in range(ROUND_HOSTS)}
                    records.update(late_records())
                    with Dnsmasq(ns, domain=DOMAIN, records=records) as dm:
                        results["meta"]["dnsmasq_late_records_via"] = "inotify (--hostsdir)"
                        guarded(results, "dns_round", lambda: bench_dns_round(ns, workdir))
                        guarded(results, "late_record", lambda: bench_late_record(ns, dm, workdir))
                    guarded(results, "explain", lambda: bench_explain(ns, workdir))
            except Exception as exc:  # namespace or dnsmasq setup failed
                for key in ns_keys:
                    results["benchmarks"].setdefault(key, {"error": f"setup: {exc!r}"})
        guarded(results, "hostfile", lambda: bench_hostfile(workdir))
        if os.path.exists(PID1) and netns_mod.available()[0]:
            guarded(results, "pid1", bench_pid1)
        if netns_mod.available()[0]:
            guarded(results, "ssh", bench_ssh)
            guarded(results, "cluster", bench_cluster)
            guarded(results, "container", bench_container)
            guarded(results, "doctor", bench_doctor)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["meta"]["total_wall_s"] = time.monotonic() - t_start
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(OUT_JSON, "w", encoding="utf-8") as fh:
        json.dump(clean(results), fh, indent=2)
        fh.write("\n")
    print(table(results))
    print(
        f"\n(whole run {results['meta']['total_wall_s']:.0f} s; JSON: "
        f"{os.path.relpath(OUT_JSON, ROOT)}; namespace resolv.conf: "
        f"{RESOLV_CONF.strip().replace(chr(10), ' / ')})"
    )
    failed = [k for k, v in results["benchmarks"].items() if "error" in v]
    if failed:
        print(f"could not run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)  # a signal ends it as Ctrl-C does: every `finally` runs (namespace, files)
