"""A simulated cluster on one machine: pods as network namespaces on two bridges.

    switch netns: br-ctl (control, 10.250.0.0/16) and br-data (data, 10.251.0.0/16)
    pod netns:    eth0 → br-ctl, net1 → br-data (unless `data=False`), its own
                  /etc/hosts and resolv.conf;
                  commands run in their own UTS namespace with the pod's hostname, and
                  (`pid1=True`) as PID 1 of their own PID namespace; with
                  `private_root` (the default) in their own mount namespace, root's
                  shell start-up files empty and the pod's own /tmp (`Pod.tmp`).

Names, two ways:
- `dns=False`: every pod's hosts file knows every pod (short names, and `name.domain`).
- `dns=True`: like Kubernetes. dnsmasq on the control bridge (10.250.0.2) serves
  MPI Operator's names `<pod>.<job>.<ns>.svc.cluster.local` (only the FQDN: there is no
  record for the `.svc` form, and dnsmasq refuses names outside cluster.local); a pod's
  resolv.conf has the Kubernetes search list and `options ndots:5`, and its hosts file
  only itself. `fqdn_only=True` drops the bare `cluster.local` from the search list, so
  `x.job.ns.svc` stops resolving: a cluster where only the FQDN works. `late` names pods
  whose records are added only when the test calls `add_record`.
No lookup ever leaves the namespaces. Everything is removed by close(), also when a
signal cuts the program short (a bench ended by SIGTERM: tests/support/interrupt.py, and
what close() does is not itself cut short), and what was registered with `on_close` (the
faults of tests/support/faults.py) is undone first. Every namespace's name holds the
cluster's `id` (`mpib-pod-<id>-…`, `mpib-sw-<id>-…`): what a cluster made can be found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support import resources
from tests.support.dnsmasq import Dnsmasq
from tests.support.interrupt import shielded
from tests.support.netns import Netns, _ip

CTL_NET = "10.250"  # /16 each: pod i is .(i+10)/256.(i+10)%256, 10.250.0.10 for the first
DATA_NET = "10.251"
PREFIX = 16
MAX_PODS = 1000  # a Linux bridge takes at most 1024 ports


def _host(net: str, index: int) -> str:
    n = index + 10
    return f"{net}.{n >> 8}.{n & 255}"


def _addresses(index: int, family: str) -> list[str]:
    """Pod `index`'s control addresses in a cluster of `family` (Cluster)."""
    v4, v6 = _host(CTL_NET, index), _host6(CTL_NET, index)
    return {"4": [v4], "6": [v6], "dual": [v4, v6]}[family]


def _host6(net: str, index: int) -> str:
    """The IPv6 twin of `_host`: fd00:10:250::a for 10.250.0.10 (a ULA, never routed)."""
    return f"fd00:{net.replace('.', ':')}::{index + 10:x}"


@dataclasses.dataclass
class Pod:
    name: str  # hostname, e.g. job-worker-0
    index: int
    netns: Netns
    pid1: bool = False  # commands run as PID 1 of their own PID namespace
    # Root's shell start-up files empty, as in an image, not this machine's: bash reads
    # ~/.bashrc for every ssh session, and a pyenv set-up there costs 100 ms each and
    # takes a lock (pyenv's rehash, a file in its shims folder) that a shell killed at the
    # wrong moment leaves behind: every later ssh session on the machine then waits 60 s.
    private_root: bool = True
    # The pod's own /tmp (with private_root): a directory of the cluster's, bind-mounted
    # over /tmp for every command in the pod, as a container has its own. On one shared
    # /tmp, Open MPI 5's mpirun (PID 9 in every launcher pod, hostname job-launcher) found
    # another session's PMIx rendezvous files, or a killed pod's, under its own name and
    # exited 213 ("The PMIx server's listener thread failed to start").
    tmp: str | None = None
    # The node's /run/mpi-bootstrap, bound in for every command in the pod (with
    # private_root): every pod of the cluster sees the same directory there, as pods that
    # share /run (a hostPath, a harness of pods on one machine) do.
    node_run: str | None = None
    family: str = "4"  # the pod network's: "4", "6" (IPv6 only) or "dual" (Cluster)

    @property
    def address(self) -> str:
        return _host6(CTL_NET, self.index) if self.family == "6" else _host(CTL_NET, self.index)

    @property
    def data_address(self) -> str:
        if self.family == "6":
            return _host6(DATA_NET, self.index)
        return _host(DATA_NET, self.index)

    def addresses(self) -> list[str]:
        """Its control addresses: IPv4, IPv6 or both (`family`)."""
        return _addresses(self.index, self.family)

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """argv run inside this pod: its netns, a UTS namespace with its hostname, env."""
        envs = [f"{k}={v}" for k, v in (env or {}).items()]
        inner = shlex.join(["env", "-i", *envs, *argv])
        # --kill-child: if unshare goes, so does the pod's PID 1 (and with it the pod).
        pid = ["--pid", "--fork", "--mount-proc", "--kill-child"] if self.pid1 else []
        mount = ["--mount"] if self.private_root else []
        root = ""
        if self.private_root:
            root = (
                "for f in /root/.bashrc /root/.profile; do [ ! -e $f ] || "
                "mount --bind /dev/null $f || exit; done && "
            )
            if self.tmp is not None:
                inner_repo = ""
                if REPO_IN_TMP is not None:  # the clone stays visible at its own path
                    inner_repo = shlex.quote(os.path.join(self.tmp, REPO_IN_TMP))
                    root += f"mount --bind {shlex.quote(str(REPO))} {inner_repo} && "
                root += f"mount --rbind {shlex.quote(self.tmp)} /tmp && "
            if self.node_run is not None:
                root += f"mount --bind {shlex.quote(self.node_run)} {NODE_RUN} && "
        return [
            *self.netns.prefix(),
            "unshare",
            "--uts",
            *mount,
            *pid,
            "sh",
            "-c",
            f"{root}hostname {shlex.quote(self.name)} && exec {inner}",
        ]

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv, env), capture_output=True, text=True, timeout=timeout, check=False
        )

    def start(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(argv, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


DNS_ADDRESS = f"{CTL_NET}.0.2"
NODE_RUN = "/run/mpi-bootstrap"  # where root's default state directories lie (Pod.node_run)
# The clone (its venvs, the agent): a clone below /tmp would be hidden in a pod by the
# pod's own /tmp, and every agent there "not found" (127), unless bound into it.
REPO = Path(__file__).resolve().parents[2]
TMP = Path("/tmp").resolve()
REPO_IN_TMP = os.path.relpath(REPO, TMP) if REPO.is_relative_to(TMP) else None


def agent_env(
    work: Path, pod: Pod, *, path: str = "/usr/local/bin:/usr/bin:/bin", **extra: str
) -> dict[str, str]:
    """The environment tests give the agent in `pod`: its own HOME and state directory
    under `work`, JSON logs; `extra` adds or overrides variables."""
    home = work / pod.name
    home.mkdir(exist_ok=True)
    return {
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "MPI_BOOTSTRAP_STATE_DIR": str(home / "state"),
        "MPI_BOOTSTRAP_LOG_FORMAT": "json",
        **extra,
    }


def _asked_for(dns: bool) -> None:
    """In a test, a cluster needs its `netns` fixture, and `dnsmasq` for DNS."""
    resources.need("netns", "a simulated cluster")
    if dns:
        resources.need("dnsmasq", "a simulated cluster with DNS")


class Cluster:
    def __init__(
        self,
        names: Sequence[str],
        *,
        domain: str = "",
        dns: bool = False,
        job: str = "job",
        namespace: str = "default",
        fqdn_only: bool = False,
        late: Sequence[str] = (),
        pid1: bool = False,
        data: bool = True,
        private_root: bool = True,
        shared_run: bool = False,
        family: str = "4",
        data_ifaces: Mapping[str, str | None] | None = None,
    ) -> None:
        """Pods named `names` (the first is usually the launcher). With `domain` (and
        `dns=False`), the hosts files also carry `name.domain`. With `shared_run`, every
        pod sees one directory of the cluster's at /run/mpi-bootstrap (Pod.node_run).
        `family`: "6" gives every pod IPv6 addresses only (fd00:10:250::/64 and
        fd00:10:251::/64), "dual" both; the hosts files name each address (AAAA as well).
        `data_ifaces` names each pod's data NIC (None: it has none; `net1` for a pod it
        does not name), as a Multus network or a DraNet claim names it."""
        _asked_for(dns)
        if len(names) > MAX_PODS:
            raise ValueError(f"{len(names)} pods: one bridge holds at most {MAX_PODS}")
        self.pods: list[Pod] = []
        self.procs: list[subprocess.Popen[Any]] = []
        self._pid1: set[int] = set()  # started in a PID-1 pod: the program is unshare's child
        self.dnsmasq: Dnsmasq | None = None
        self.job, self.namespace = job, namespace
        self.data = data
        self.id = uuid.uuid4().hex[:6]
        self._on_close: list[Callable[[], None]] = []
        # The pods' own /tmp directories (Pod.tmp), removed by close().
        self.root = tempfile.mkdtemp(prefix=f"mpib-cluster-{self.id}-", dir="/run")
        self.switch = Netns(f"mpib-sw-{self.id}", resolv_conf=f"nameserver {DNS_ADDRESS}\n")
        try:
            for br in ("br-ctl", "br-data") if data else ("br-ctl",):
                self.switch.exec_checked(["ip", "link", "add", br, "type", "bridge"])
                self.switch.exec_checked(["ip", "link", "set", br, "up"])
            hosts = self._hosts(names, domain, family)
            search = [f"{namespace}.svc.cluster.local", "svc.cluster.local"]
            if not fqdn_only:
                search.append("cluster.local")
            for i, name in enumerate(names):
                if dns:
                    resolv = (
                        f"search {' '.join(search)}\nnameserver {DNS_ADDRESS}\n"
                        "options ndots:5 timeout:1 attempts:2\n"
                    )
                    own = f"127.0.0.1 localhost\n{_host(CTL_NET, i)} {self.fqdn(name)} {name}\n"
                    ns = Netns(f"mpib-pod-{self.id}", resolv_conf=resolv, hosts=own)
                else:
                    ns = Netns(
                        f"mpib-pod-{self.id}",
                        resolv_conf="nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n",
                        hosts=hosts,
                    )
                pod = Pod(name, i, ns, pid1=pid1, private_root=private_root, family=family)
                pod.tmp = self._tmp(i) if private_root else None
                pod.node_run = self._node_run() if shared_run and private_root else None
                self.pods.append(pod)
                self._wire(pod, "eth0", "br-ctl")
                nic = (data_ifaces or {}).get(name, "net1")
                if data and nic:
                    self._wire(pod, nic, "br-data")
            if dns:
                self.switch.exec_checked(
                    ["ip", "addr", "add", f"{DNS_ADDRESS}/{PREFIX}", "dev", "br-ctl"]
                )
                records = [(self.fqdn(p.name), p.address) for p in self.pods if p.name not in late]
                # The headless Service answers with every ready worker (not the launcher).
                records += [(self.service, p.address) for p in self.pods[1:] if p.name not in late]
                self.dnsmasq = Dnsmasq(self.switch, records=records, listen=DNS_ADDRESS)
        except BaseException:
            self.close()
            raise

    def _hosts(self, names: Sequence[str], domain: str, family: str) -> str:
        """The hosts file of a cluster without DNS: every pod's every address."""
        hosts = "127.0.0.1 localhost\n"
        for i, name in enumerate(names):
            fq = f" {name}.{domain}" if domain else ""
            for address in _addresses(i, family):
                hosts += f"{address} {name}{fq}\n"
        return hosts

    def _tmp(self, index: int) -> str:
        """A pod's own /tmp: sticky and open to all, as /tmp is; with the place of the
        clone in it where the clone lies below /tmp (Pod.argv binds it there)."""
        path = os.path.join(self.root, f"{index}-tmp")
        os.mkdir(path)
        os.chmod(path, 0o1777)  # noqa: S103 - it is the pod's /tmp
        if REPO_IN_TMP is not None:
            os.makedirs(os.path.join(path, REPO_IN_TMP))
        return path

    def _node_run(self) -> str:
        path = os.path.join(self.root, "node-run")
        if not os.path.isdir(path):
            os.makedirs(NODE_RUN, mode=0o755, exist_ok=True)  # the mount point, empty
            os.mkdir(path, 0o755)
        return path

    def fqdn(self, name: str) -> str:
        """MPI Operator's name for a pod: `<pod>.<job>.<ns>.svc.cluster.local`."""
        return f"{name}.{self.job}.{self.namespace}.svc.cluster.local"

    def svc(self, name: str) -> str:
        """The form MPI Operator writes in hostfiles: `<pod>.<job>.<ns>.svc`."""
        return f"{name}.{self.job}.{self.namespace}.svc"

    @property
    def service(self) -> str:
        """The headless Service's name: `<job>.<ns>.svc.cluster.local`."""
        return f"{self.job}.{self.namespace}.svc.cluster.local"

    def add_record(self, name: str) -> None:
        """A pod's DNS record appears (late), in its own name and the Service's."""
        assert self.dnsmasq is not None
        pod = next(p for p in self.pods if p.name == name)
        self.dnsmasq.add([(self.fqdn(name), pod.address), (self.service, pod.address)])

    def _wire(self, pod: Pod, iface: str, bridge: str) -> None:
        # Made inside the switch namespace: nothing ever appears in the host's.
        outer = f"p{pod.index}-{iface}"
        _ip(
            "-n",
            self.switch.name,
            "link",
            "add",
            outer,
            "type",
            "veth",
            "peer",
            "name",
            iface,
            "netns",
            pod.netns.name,
        )
        self.switch.exec_checked(["ip", "link", "set", outer, "master", bridge])
        self.switch.exec_checked(["ip", "link", "set", outer, "up"])
        v4 = _host(CTL_NET if iface == "eth0" else DATA_NET, pod.index)
        v6 = _host6(CTL_NET if iface == "eth0" else DATA_NET, pod.index)
        if pod.family != "6":
            pod.netns.exec_checked(["ip", "addr", "add", f"{v4}/{PREFIX}", "dev", iface])
        if pod.family != "4":  # nodad: usable at once, not after duplicate detection
            pod.netns.exec_checked(["ip", "-6", "addr", "add", f"{v6}/64", "dev", iface, "nodad"])
        pod.netns.exec_checked(["ip", "link", "set", iface, "up"])

    def start(
        self, pod: Pod, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start a long-running process in `pod`; stopped by close() if still running."""
        return self.adopt(pod, pod.start(argv, env))

    def adopt(self, pod: Pod, p: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        """A process started in `pod` by other means (`pod.argv`, its output to a file):
        signalled as the pod's program (`signal`) and stopped by close()."""
        self.procs.append(p)
        if pod.pid1:
            self._pid1.add(p.pid)
        return p

    @staticmethod
    def pid_of(p: subprocess.Popen[str]) -> int:
        """The PID of the pod's program: `unshare --fork`'s child when pid1, else p's."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{p.pid}/task/{p.pid}/children") as fh:
                    kids = fh.read().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            if p.poll() is not None:
                break
            time.sleep(0.01)
        return p.pid

    def signal(self, p: subprocess.Popen[str], signum: int = signal.SIGTERM) -> None:
        """Signal the pod's program itself (`unshare` does not pass signals on)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid_of(p) if p.pid in self._pid1 else p.pid, signum)

    def on_close(self, undo: Callable[[], None]) -> None:
        """Have close() call `undo` first (the last registered first)."""
        self._on_close.append(undo)

    def close(self) -> None:
        with shielded():
            self._close()

    def _close(self) -> None:
        while self._on_close:
            with contextlib.suppress(Exception):
                self._on_close.pop()()
        for p in self.procs:
            if p.poll() is None:
                self.signal(p)
        deadline = time.monotonic() + 5
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.dnsmasq is not None:
            self.dnsmasq.close()
        for pod in self.pods:
            pod.netns.close()  # kills whatever is left in the pod, by PID
        self.switch.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
