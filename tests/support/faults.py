"""Faults on the simulated cluster's pods (tests/support/cluster.py), as a job meets them on
a real cluster: a node cut off, a network that drops everything or some, a frozen node,
a pod gone, a saturated CPU, a slow network. Each returns a `Fault` whose `undo()` ends
it; the cluster's close() undoes every one still in force (also after a signal).

    faults = Faults(cluster)
    faults.cut_off(pod)         its eth0 and net1 cut at the switch: no FIN, no RST, nothing
    faults.partition(a, b)      nothing passes between two pods, either way
    faults.drop(pod, percent)   that share of the frames on its links lost on the bridge
                                (nftables `numgen random`: this kernel has no netem, no NFQUEUE)
    faults.freeze(pod[, s])     SIGSTOP to every process of the pod (for good, or s seconds)
    faults.thaw(pod)            SIGCONT to every one
    faults.kill_pod(pod)        SIGKILL to the pod's PID 1 (a `pid1` pod's namespace: all of
                                it goes), the pod's network left, as a deleted pod's would
                                not be: its kernel still answers, with a reset
    faults.cpu_hog(pod, n)      n busy loops in the pod
    faults.delay(pods, ms)      every frame the pods send waits ms (tests/support/delayline.py)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.cluster import Cluster, Pod

DELAYLINE = str(Path(__file__).resolve().parent / "delayline.py")
TABLE = "mpib_drop"  # drop()'s nftables table for pod 3, in the switch: mpib_drop_3


class Fault:
    """A fault in force; `undo()` ends it (the first call; later ones do nothing)."""

    def __init__(self, what: str, undo: Callable[[], None] = lambda: None) -> None:
        self.what = what
        self._undo: Callable[[], None] | None = undo
        self._lock = threading.Lock()

    def undo(self) -> None:
        with self._lock:
            undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    @property
    def active(self) -> bool:
        return self._undo is not None

    def __repr__(self) -> str:
        return f"Fault({self.what!r}{', undone' if not self.active else ''})"


class Faults:
    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.made: list[Fault] = []
        cluster.on_close(self.undo_all)

    def _made(self, fault: Fault) -> Fault:
        self.made.append(fault)
        return fault

    def undo_all(self) -> None:
        """Every fault still in force undone, the last made first."""
        while self.made:
            self.made.pop().undo()

    def ifaces(self) -> list[str]:
        return ["eth0", "net1"] if self.c.data else ["eth0"]

    # ------------------------------------------------------------ network

    def ports(self, pod: Pod) -> list[str]:
        """The pod's ends of its links in the switch's namespace: `p3-eth0` (its veth's
        peer), and `e3-eth0`, the bridge port that takes its place under a delay line."""
        return [f"{x}{pod.index}-{i}" for i in self.ifaces() for x in "pe"]

    def _links(self, pod: Pod, state: str) -> None:
        _batch(
            ["ip", "-n", self.c.switch.name],
            [f"link set p{pod.index}-{i} {state}" for i in self.ifaces()],
        )

    def cut_off(self, pod: Pod) -> Fault:
        """The pod's cables pulled at the switch (its veths' switch ends down): what it sends
        goes nowhere, nothing reaches it, and nothing tells anyone — no FIN, no RST, no
        ICMP; its own stack sees only a link without carrier (its routes stay)."""
        self._links(pod, "down")
        return self._made(Fault(f"{pod.name} cut off", lambda: self._links(pod, "up")))

    def partition(self, a: Pod, b: Pod) -> Fault:
        """Nothing passes between `a` and `b` on the bridge, either way (ARP included);
        each still reaches every other pod."""
        one, two = (", ".join(f'"{p}"' for p in self.ports(x)) for x in (a, b))
        table = f"{TABLE}_{a.index}_{b.index}"
        ruleset = (
            f"table bridge {table} {{\n  chain links {{\n"
            "    type filter hook forward priority 0;\n"
            f"    iifname {{ {one} }} oifname {{ {two} }} drop\n"
            f"    iifname {{ {two} }} oifname {{ {one} }} drop\n  }}\n}}\n"
        )
        self._switch_run(["nft", "-f", "-"], ruleset, check=True)
        return self._made(
            Fault(
                f"{a.name} | {b.name}",
                lambda: self._switch_run(["nft", "delete", "table", "bridge", table]),
            )
        )

    def drop(self, pod: Pod, percent: int, *, inbound: bool = True) -> Fault:
        """Lose `percent`% of the frames the pod sends on its links (and, with `inbound`, of
        those sent to it: 100 is a pod that answers nothing, ARP included), each drawn
        alone (nftables' `numgen random`, as netem's loss draws). They are lost on the
        bridge, in the switch's namespace: the pod's own stack never hears of it, as a
        rule in its own output path would make it (connect() failing at once, EPERM)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent {percent}: 0 to 100")
        names = ", ".join(f'"{p}"' for p in self.ports(pod))
        # numgen's value is 0-99: `< 100` is refused, and 100% needs no draw.
        rule = "drop" if percent == 100 else f"numgen random mod 100 < {percent} drop"
        matches = ["iifname", "oifname"] if inbound else ["iifname"]
        table = f"{TABLE}_{pod.index}"
        ruleset = (
            f"table bridge {table} {{\n  chain links {{\n"
            "    type filter hook forward priority 0;\n"
            + "".join(f"    {m} {{ {names} }} {rule}\n" for m in matches)
            + "  }\n}\n"
        )

        def undo() -> None:
            self._switch_run(["nft", "delete", "table", "bridge", table])

        undo()  # a drop() before on this pod: replaced
        self._switch_run(["nft", "-f", "-"], ruleset, check=True)
        return self._made(Fault(f"{pod.name} drops {percent}%", undo))

    def _switch_run(self, argv: list[str], stdin: str = "", *, check: bool = False) -> None:
        done = self.c.switch.run(argv, input=stdin, capture_output=True)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv}: {done.stderr}")

    def delay(self, pods: Sequence[Pod], ms: float) -> Fault:
        """Every frame these pods send (on every interface) reaches the bridge `ms` later:
        a delay line (tests/support/delayline.py) in the switch's namespace takes the place
        of their ports on the bridges; frames to them pass in the kernel (tc mirred)."""
        sw = self.c.switch.name
        links = [
            (i, p.index, b) for p in pods for i, b in zip(self.ifaces(), BRIDGES, strict=False)
        ]
        ip, tc = [], []
        for iface, n, bridge in links:
            p, d, e = (f"{x}{n}-{iface}" for x in "pde")
            ip += [
                f"link add {d} type veth peer name {e}",
                f"link set {e} master {bridge}",
                f"link set {e} up",
                f"link set {d} up",
            ]
            tc += [
                f"qdisc add dev {d} clsact",
                f"filter add dev {d} ingress protocol all u32 match u32 0 0 "
                f"action mirred egress redirect dev {p}",
            ]
        _batch(["ip", "-n", sw], ip)
        _batch(["tc", "-n", sw], tc)
        args = [f"p{n}-{iface}:d{n}-{iface}" for iface, n, _ in links]
        line = subprocess.Popen(
            [*self.c.switch.prefix(), sys.executable, DELAYLINE, str(ms), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert line.stdout is not None
        if line.stdout.readline().strip() != "READY":
            line.kill()
            line.wait()
            raise AssertionError(f"the delay line did not start (exit {line.poll()})")
        _batch(["ip", "-n", sw], [f"link set p{n}-{iface} nomaster" for iface, n, _ in links])

        def undo() -> None:
            _batch(
                ["ip", "-n", sw],
                [f"link del d{n}-{iface}" for iface, n, _ in links]
                + [f"link set p{n}-{iface} master {b}" for iface, n, b in links],
            )
            line.kill()
            line.wait()

        names = ", ".join(p.name for p in pods)
        return self._made(Fault(f"{names}: frames delayed {ms:g} ms", undo))

    # ------------------------------------------------------------ processes

    def freeze(self, pod: Pod, seconds: float | None = None) -> Fault:
        """SIGSTOP to every process of the pod (twice over, for any forked meanwhile); for
        good, or until `seconds` have passed. undo() thaws it at once."""
        for _ in range(2):
            _signal(_own(pod), signal.SIGSTOP)
        timer = threading.Timer(seconds, lambda: self.thaw(pod)) if seconds else None
        if timer is not None:
            timer.daemon = True
            timer.start()

        def undo() -> None:
            if timer is not None:
                timer.cancel()
            self.thaw(pod)

        return self._made(Fault(f"{pod.name} frozen", undo))

    def thaw(self, pod: Pod) -> None:
        """SIGCONT to every process of the pod."""
        _signal(_own(pod), signal.SIGCONT)

    def kill_pod(self, pod: Pod) -> list[int]:
        """SIGKILL to the pod's PID 1 — every PID namespace's init in it (a `pid1` pod's
        program; each run of `Cluster.start`'s is one) —, or to every process of a pod
        without one. Returns the PIDs killed. Nothing to undo: start the pod's program
        again."""
        pids = pod.netns.pids()
        inits = [pid for pid in pids if _ns_init(pid)] or pids
        _signal(inits, signal.SIGKILL)
        return inits

    def cpu_hog(self, pod: Pod, n: int = 1) -> Fault:
        """`n` busy loops (a shell's) in the pod, at the pod's own priority."""
        hogs = [
            subprocess.Popen([*pod.netns.prefix(), "sh", "-c", "while :; do :; done"])
            for _ in range(n)
        ]

        def undo() -> None:
            for h in hogs:
                h.kill()
                h.wait()

        return self._made(Fault(f"{pod.name}: {n} busy", undo))


BRIDGES = ("br-ctl", "br-data")  # eth0's, net1's (tests/support/cluster.py)


def _batch(argv: list[str], commands: list[str]) -> None:
    """`ip -batch` / `tc -batch`: one process for many commands (a few ms each otherwise)."""
    if commands:
        subprocess.run(
            [*argv, "-batch", "-"],
            input="\n".join(commands) + "\n",
            text=True,
            check=True,
            capture_output=True,
        )


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _own(pod: Pod) -> list[int]:
    """The pod's own processes: all in its network namespace but the `unshare` that
    Cluster puts before its program, which is the harness's, as a container runtime's
    shim is the node's (frozen, it could not reap the pod's PID 1 once that is killed)."""
    own = []
    for pid in pod.netns.pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() != "unshare":
                own.append(pid)
    return own


def _ns_init(pid: int) -> bool:
    """Whether `pid` is PID 1 of its own PID namespace (its last NSpid is 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False
