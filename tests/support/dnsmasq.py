"""A real dnsmasq inside a private `Netns`: serves only 127.0.0.1 in that namespace.

    with Netns("mpib", resolv_conf="nameserver 127.0.0.1\\noptions ndots:1\\n") as ns, \\
            Dnsmasq(ns, records={"w-0.job.default.svc.cluster.local": "198.18.0.1"}) as dm:
        dm.add({"w-1.job.default.svc.cluster.local": "198.18.0.2"})  # a late record

Records live in files in a hosts directory (`--hostsdir`): dnsmasq reads the files there
at start and picks up files added later through inotify, so a late record needs no
signal. Files are written under a dot name and renamed into place, so dnsmasq (which
skips dot files) never reads half a file. `add(..., wait=True)` confirms the record
answers through the namespace's resolver; if inotify did not deliver it in time, it
sends SIGHUP (dnsmasq then re-reads every hosts file) and says so in `used_sighup`.

Names under `domain` that have no record get NXDOMAIN at once (`--local=/domain/`), as
a Kubernetes cluster DNS answers for a pod that does not exist yet; nothing is ever
forwarded (`--no-resolv`, no `--server`). `close()` stops only the dnsmasq this object
started (by its PID) and removes its directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from types import TracebackType

from tests.support import resources
from tests.support.interrupt import shielded
from tests.support.netns import Netns

DNSMASQ = "/usr/sbin/dnsmasq"
READY_NAME = "dnsmasq-ready.invalid"  # a record of our own, to see that dnsmasq answers

Records = Mapping[str, str] | Iterable[tuple[str, str]]


def available() -> tuple[bool, str]:
    if not os.access(DNSMASQ, os.X_OK):
        return False, f"needs dnsmasq ({DNSMASQ}; Debian package dnsmasq-base)"
    return True, ""


def _pairs(records: Records) -> list[tuple[str, str]]:
    items = records.items() if isinstance(records, Mapping) else records
    return [(str(name), str(addr)) for name, addr in items]


def write_hosts_file(directory: str, filename: str, records: Records) -> str:
    """Write `address name` lines to directory/filename atomically; return the path.

    The temporary file starts with a dot: dnsmasq ignores dot files in a hosts
    directory, so it sees only the complete file (inotify IN_MOVED_TO on the rename).
    """
    if filename.startswith(".") or "/" in filename:
        raise ValueError(f"bad hosts file name {filename!r}")
    text = "".join(f"{addr} {name}\n" for name, addr in _pairs(records))
    tmp = os.path.join(directory, f".{filename}.tmp")
    path = os.path.join(directory, filename)
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)  # dnsmasq drops root for an unprivileged user
    os.replace(tmp, path)
    return path


class Dnsmasq:
    def __init__(
        self,
        netns: Netns,
        *,
        domain: str = "cluster.local",
        records: Records = (),
        start_timeout: float = 10.0,
        listen: str = "127.0.0.1",
    ) -> None:
        """`listen`: the address to serve on (loopback by default; the cluster puts it on
        its control bridge)."""
        resources.need("dnsmasq", "dnsmasq")
        self.netns = netns
        self.domain = domain
        self.workdir = tempfile.mkdtemp(prefix="mpib-dnsmasq-")
        self.hostsdir = os.path.join(self.workdir, "hosts.d")
        self.log_path = os.path.join(self.workdir, "dnsmasq.log")
        self.used_sighup = False
        self._files = 0
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            # dnsmasq drops root for an unprivileged user, which must read the hosts files.
            os.chmod(self.workdir, 0o755)  # noqa: S103
            os.mkdir(self.hostsdir, 0o755)
            os.chmod(self.hostsdir, 0o755)  # noqa: S103
            self._write([*_pairs(records), (READY_NAME, "127.0.0.1")])
            argv = [
                *netns.prefix(),
                DNSMASQ,
                "--keep-in-foreground",  # our child: its PID is the one we stop
                "--conf-file=/dev/null",  # no /etc/dnsmasq.conf, no conf-dir
                "--no-resolv",
                "--no-poll",
                "--no-hosts",  # no upstream, no /etc/hosts
                f"--listen-address={listen}",
                "--bind-interfaces",  # that address only
                "--port=53",
                f"--local=/{domain}/",  # NXDOMAIN for unknown names in the domain
                f"--hostsdir={self.hostsdir}",
                "--local-ttl=0",
                f"--pid-file={os.path.join(self.workdir, 'dnsmasq.pid')}",
                f"--log-facility={self.log_path}",
            ]
            self._argv = argv
            self.start(start_timeout)
        except BaseException:
            self.close()
            raise

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (again, after stop(): the same records, from hostsdir)."""
        with open(os.path.join(self.workdir, "stderr"), "ab") as err:
            self.proc = subprocess.Popen(
                self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )
        self._wait_answers(READY_NAME, timeout, "start")

    def stop(self) -> None:
        """Stop the server (only the PID we started); its records stay for start()."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _write(self, pairs: list[tuple[str, str]]) -> str:
        self._files += 1
        return write_hosts_file(self.hostsdir, f"records-{self._files:05d}", pairs)

    def resolves(self, name: str) -> bool:
        """Whether `name` resolves through the namespace's resolver (getent).

        `getent hosts`, not `ahosts`: ahosts asks getaddrinfo with AI_ADDRCONFIG, which
        finds nothing in a namespace whose only addresses are on loopback.
        """
        done = subprocess.run(
            [*self.netns.prefix(), "getent", "hosts", name],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return done.returncode == 0

    def _wait_answers(self, name: str, timeout: float, what: str) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"dnsmasq exited with {self.proc.returncode} during {what}: {self.log_tail()}"
                )
            if self.resolves(name):
                return True
            time.sleep(0.01)
        if what == "start":
            raise RuntimeError(f"dnsmasq did not answer within {timeout:g} s: {self.log_tail()}")
        return False

    def add(self, records: Records, *, wait: bool = True, timeout: float = 5.0) -> str:
        """Add records in a new hosts file; with `wait`, return once they answer."""
        pairs = _pairs(records)
        path = self._write(pairs)
        if wait and pairs:
            last = pairs[-1][0]
            if not self._wait_answers(last, timeout / 2, "add"):
                # inotify did not deliver: SIGHUP re-reads every hosts file.
                self.used_sighup = True
                os.kill(self.pid, signal.SIGHUP)
                if not self._wait_answers(last, timeout / 2, "add"):
                    raise RuntimeError(f"dnsmasq did not pick up {path}: {self.log_tail()}")
        return path

    def log_tail(self, lines: int = 20) -> str:
        parts = []
        for name in ("dnsmasq.log", "stderr"):
            try:
                with open(
                    os.path.join(self.workdir, name), encoding="utf-8", errors="replace"
                ) as fh:
                    parts.extend(fh.read().splitlines()[-lines:])
            except OSError:
                pass
        return "\n".join(parts)

    def close(self) -> None:
        with shielded():
            self.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Dnsmasq:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
