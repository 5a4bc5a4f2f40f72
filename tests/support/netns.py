"""Private network namespaces for tests and benchmarks: made here, removed here.

A `Netns` is a named network namespace (`ip netns add`) with loopback up, optional
interfaces (e.g. `eth0`, `net1`; veth pairs) with addresses from the TEST-NET/benchmark ranges, and
its own /etc/netns/<name>/{resolv.conf,hosts}, which `ip netns exec` bind-mounts over
/etc. Nothing it creates is reachable from outside the namespace, and `close()` removes
all of it (also on failure: use it as a context manager or a fixture with a finalizer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType

from tests.support import resources
from tests.support.interrupt import shielded

ETC_NETNS = "/etc/netns"


def available() -> tuple[bool, str]:
    """Whether this machine can build namespaces (root and iproute2)."""
    if os.geteuid() != 0:
        return False, "needs root"
    if shutil.which("ip") is None:
        return False, "needs iproute2 (`ip`)"
    return True, ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Netns:
    def __init__(
        self,
        prefix: str = "mpib",
        *,
        ifaces: Mapping[str, str] | None = None,
        resolv_conf: str = "",
        hosts: str = "127.0.0.1 localhost\n",
    ) -> None:
        """`ifaces` maps a dummy interface name to its CIDR address (e.g. eth0 → 10.x/24)."""
        resources.need("netns", "a network namespace")
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.etc = os.path.join(ETC_NETNS, self.name)
        self._made = False
        try:
            _ip("netns", "add", self.name)
            self._made = True
            self.exec_checked(["ip", "link", "set", "lo", "up"])
            for i, (iface, cidr) in enumerate((ifaces or {}).items()):
                # No `dummy` module on this kernel: a veth whose peer stays in the same
                # namespace gives an UP interface with carrier, reachable only from here.
                peer = f"peer{i}"
                self.exec_checked(
                    ["ip", "link", "add", iface, "type", "veth", "peer", "name", peer]
                )
                self.exec_checked(["ip", "addr", "add", cidr, "dev", iface])
                self.exec_checked(["ip", "link", "set", peer, "up"])
                self.exec_checked(["ip", "link", "set", iface, "up"])
            os.makedirs(self.etc, exist_ok=True)
            self.write_etc("resolv.conf", resolv_conf)
            self.write_etc("hosts", hosts)
        except BaseException:
            self.close()
            raise

    def write_etc(self, name: str, text: str) -> None:
        with open(os.path.join(self.etc, name), "w", encoding="utf-8") as fh:
            fh.write(text)

    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def exec_checked(self, argv: Sequence[str]) -> None:
        subprocess.run(
            [*self.prefix(), *argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def run(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(), *argv], text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        with shielded():
            self._close()

    def _close(self) -> None:
        if self._made:
            # Only processes inside our own namespace: nothing else can be in it.
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            subprocess.run(
                ["ip", "netns", "delete", self.name],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._made = False
        shutil.rmtree(self.etc, ignore_errors=True)

    def __enter__(self) -> Netns:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
