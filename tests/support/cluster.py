"""A simulated cluster on one machine: pods as network namespaces on two bridges.

    switch netns: br-ctl (control, 10.250.0.0/24) and br-data (data, 10.251.0.0/24)
    pod netns:    eth0 → br-ctl, net1 → br-data, its own /etc/hosts and resolv.conf;
                  commands run in their own UTS namespace with the pod's hostname.

Pods find each other through their hosts files (every pod knows every name), and
resolv.conf points at 127.0.0.1 inside the pod, where nothing listens unless a test
starts a DNS server: no lookup leaves the namespaces. Everything is removed by close().
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

from tests.support.netns import Netns, _ip

CTL_NET = "10.250.0"
DATA_NET = "10.251.0"


@dataclasses.dataclass
class Pod:
    name: str  # hostname, e.g. job-worker-0
    index: int
    netns: Netns

    @property
    def address(self) -> str:
        return f"{CTL_NET}.{self.index + 10}"

    @property
    def data_address(self) -> str:
        return f"{DATA_NET}.{self.index + 10}"

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """argv run inside this pod: its netns, a UTS namespace with its hostname, env."""
        envs = [f"{k}={v}" for k, v in (env or {}).items()]
        inner = shlex.join(["env", "-i", *envs, *argv])
        return [*self.netns.prefix(), "unshare", "--uts", "sh", "-c",
                f"hostname {shlex.quote(self.name)} && exec {inner}"]

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv, env), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None
              ) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(argv, env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


class Cluster:
    def __init__(self, names: Sequence[str], *, domain: str = "") -> None:
        """Pods named `names` (the first is usually the launcher). With `domain`, the
        hosts files also carry `name.domain` (e.g. job.default.svc)."""
        self.pods: list[Pod] = []
        self.procs: list[subprocess.Popen[str]] = []
        self.switch = Netns("mpib-sw")
        try:
            for br in ("br-ctl", "br-data"):
                self.switch.exec_checked(["ip", "link", "add", br, "type", "bridge"])
                self.switch.exec_checked(["ip", "link", "set", br, "up"])
            hosts = "127.0.0.1 localhost\n"
            for i, name in enumerate(names):
                fq = f" {name}.{domain}" if domain else ""
                hosts += f"{CTL_NET}.{i + 10} {name}{fq}\n"
            for i, name in enumerate(names):
                ns = Netns("mpib-pod", resolv_conf="nameserver 127.0.0.1\n"
                           "options ndots:5 timeout:1 attempts:1\n", hosts=hosts)
                pod = Pod(name, i, ns)
                self.pods.append(pod)
                self._wire(pod, "eth0", "br-ctl", pod.address)
                self._wire(pod, "net1", "br-data", pod.data_address)
        except BaseException:
            self.close()
            raise

    def _wire(self, pod: Pod, iface: str, bridge: str, address: str) -> None:
        # Made inside the switch namespace: nothing ever appears in the host's.
        outer = f"p{pod.index}-{iface}"
        _ip("-n", self.switch.name, "link", "add", outer, "type", "veth", "peer", "name",
            iface, "netns", pod.netns.name)
        self.switch.exec_checked(["ip", "link", "set", outer, "master", bridge])
        self.switch.exec_checked(["ip", "link", "set", outer, "up"])
        pod.netns.exec_checked(["ip", "addr", "add", f"{address}/24", "dev", iface])
        pod.netns.exec_checked(["ip", "link", "set", iface, "up"])

    def start(self, pod: Pod, argv: Sequence[str], env: Mapping[str, str] | None = None
              ) -> subprocess.Popen[str]:
        """Start a long-running process in `pod`; stopped by close() if still running."""
        p = pod.start(argv, env)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait()
        for pod in self.pods:
            pod.netns.close()  # kills whatever is left in the pod, by PID
        self.switch.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
