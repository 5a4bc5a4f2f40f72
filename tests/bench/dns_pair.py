"""The DNS wait's round over 4,096 hosts, this tree's against another checkout's, paired:
the two run in turn on one dnsmasq (a private namespace, as `make bench`'s round), the
order swapped every round, and the ratio taken pair by pair (docs/benchmarks.md,
"The DNS round, paired").

    python tests/bench/dns_pair.py OTHER_TREE [ROUNDS]   # e.g. a `git worktree` of 094c4fd

Each run is tests/bench/inner.py's `round` of its own tree (the wait_for call alone, a
fresh interpreter each time). Prints each pair, then medians and the spread as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from tests.bench.run import (
    DEFAULT_CONCURRENCY,
    DOMAIN,
    RESOLV_CONF,
    ROUND_HOSTS,
    round_addr,
    round_name,
)
from tests.support.dnsmasq import Dnsmasq
from tests.support.netns import Netns

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one(ns: Netns, tree: str, names: str) -> float:
    """One round of `tree`'s wait_for, in seconds."""
    argv = [sys.executable, f"{tree}/tests/bench/inner.py", "round", "--names", names]
    done = subprocess.run(
        [
            *ns.prefix(),
            "env",
            f"PYTHONPATH={tree}",
            *argv,
            "--concurrency",
            str(DEFAULT_CONCURRENCY),
        ],
        capture_output=True,
        text=True,
        cwd=tree,
        timeout=150,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise SystemExit(f"{tree}: not every name resolved: {result}")
    return float(result["seconds"])


def main(other: str, rounds: int) -> None:
    work = tempfile.mkdtemp(prefix="mpib-dns-pair-", dir="/run")
    os.chmod(work, 0o755)  # noqa: S103 - the namespace's processes read the names here
    try:
        names = os.path.join(work, "names")
        with open(names, "w", encoding="ascii") as fh:
            fh.write("".join(f"{round_name(i)}\n" for i in range(ROUND_HOSTS)))
        hosts = f"127.0.0.1 localhost\n127.0.0.1 {socket.gethostname()}\n"
        records = {round_name(i): round_addr(i) for i in range(ROUND_HOSTS)}
        with (
            Netns("mpib-dns-pair", resolv_conf=RESOLV_CONF, hosts=hosts) as ns,
            Dnsmasq(ns, domain=DOMAIN, records=records),
        ):
            for tree in (HERE, other):  # warm-up: the page cache, dnsmasq's
                one(ns, tree, names)
            pairs = []
            for r in range(rounds):
                if r % 2 == 0:
                    ours = one(ns, HERE, names)
                    theirs = one(ns, other, names)
                else:
                    theirs = one(ns, other, names)
                    ours = one(ns, HERE, names)
                pairs.append((ours, theirs))
                print(f"{ours * 1000:.0f} ms / {theirs * 1000:.0f} ms = {ours / theirs:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [a / b for a, b in pairs]
    summary = {
        "rounds": rounds,
        "this_ms": statistics.median(a for a, _ in pairs) * 1000,
        "other_ms": statistics.median(b for _, b in pairs) * 1000,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    if os.geteuid() != 0 or len(sys.argv) < 2:
        raise SystemExit("usage (as root): python tests/bench/dns_pair.py OTHER_TREE [ROUNDS]")
    main(os.path.abspath(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 9)
