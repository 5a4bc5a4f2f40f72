"""The data check's program on a worker, run by its resident PID 1 in a forked copy of
itself (pid1/dataserve.py) on two FIFOs of the launcher's ssh session (ssh/datacheck.py);
what it does: docs/troubleshooting.md, "The data-plane check". Standard library only.

`probe NIC SECONDS SYSFS`: prints the data NIC as one JSON line and the port it opened
(TCP and UDP); reads one line, `from=ADDR,… NAME=ADDR:PORT:MTU …`; answers probes from those
addresses only (dataplane/port.py); probes each peer (a TCP connect and echo, a full-MTU
datagram that may not fragment, then the largest that passes), a JSON line each, then
`{"done": N}`; ends when stdin closes or SECONDS pass (an alarm ends it soon after).
The worker's agent also imports `nic_report` for its record (worker/main.py).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; `signal` imports enum: 3 ms
import _socket
import _thread
import errno
import fcntl
import json
import os
import resource
import select
import struct
import sys
import time
from typing import Any

from mpi_bootstrap.dataplane.port import PROBE_SECONDS, Server

SIOCGIFADDR, SIOCGIFMTU = 0x8915, 0x8921
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # <linux/in.h>
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO = 23, 2  # <linux/in6.h>
MIN_PACKET = 576  # bytes: every IPv4 path carries this much (RFC 791)
HELLO = b"mpi-bootstrap data check\n"
ALARM_SLACK = 5  # seconds past the session's end before its alarm ends the process


def _ioctl(nic: str, request: int) -> bytes:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        return fcntl.ioctl(s.fileno(), request, struct.pack("256s", nic.encode()[:15]))
    finally:
        s.close()


def addresses(nic: str) -> list[str]:
    """The NIC's IPv4 address (the primary one) and its global IPv6 addresses."""
    found = []
    try:  # noqa: SIM105 - contextlib would add 5 ms to every start
        found.append(_socket.inet_ntoa(_ioctl(nic, SIOCGIFADDR)[20:24]))
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            for line in fh:
                hexaddr, _, _, scope, _, name = line.split()
                if name == nic and scope == "00":
                    found.append(_socket.inet_ntop(_socket.AF_INET6, bytes.fromhex(hexaddr)))
    except OSError:
        pass
    return found


def rdma_devices(nic: str, sysfs: str = "/sys") -> list[str]:
    """The RDMA devices behind a netdev: `SYSFS/class/net/NIC/device/infiniband/*`."""
    try:
        return sorted(os.listdir(os.path.join(sysfs, "class", "net", nic, "device", "infiniband")))
    except OSError:
        return []


def memlock() -> int:
    """This process's locked-memory limit (soft) in bytes; -1 for unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return -1 if soft == resource.RLIM_INFINITY else soft


def nic_report(nic: str, sysfs: str = "/sys") -> dict[str, Any]:
    """What a pod says about its data NIC; `{"nic", "error": "missing", "have"}` if absent."""
    try:
        _socket.if_nametoindex(nic)
        mtu = struct.unpack("i", _ioctl(nic, SIOCGIFMTU)[16:20])[0]
    except OSError:
        return {
            "nic": nic,
            "error": "missing",
            "have": sorted(name for _, name in _socket.if_nameindex()),
        }
    return {
        "nic": nic,
        "mtu": mtu,
        "addresses": addresses(nic),
        "rdma": rdma_devices(nic, sysfs),
        "memlock": memlock(),
    }


def _family(address: str) -> int:
    return _socket.AF_INET6 if ":" in address else _socket.AF_INET


def _open(address: str) -> tuple[_socket.socket, _socket.socket, int]:
    """A TCP listener and a UDP socket on one port of `address`."""
    for _ in range(20):
        tcp = _socket.socket(_family(address), _socket.SOCK_STREAM)
        tcp.bind((address, 0))
        port = tcp.getsockname()[1]
        udp = _socket.socket(_family(address), _socket.SOCK_DGRAM)
        try:
            udp.bind((address, port))
        except OSError:
            tcp.close()
            udp.close()
            continue
        tcp.listen(128)
        return tcp, udp, port
    raise OSError(errno.EADDRINUSE, "no port free for both TCP and UDP")


def session(nic: str, seconds: float, sysfs: str) -> int:
    """Report the NIC, open the port, then answer probes while running the probes the
    launcher sends (one stdin line); until stdin closes or `seconds` pass. An alarm (its
    default action ends the process) bounds the whole session, whatever a peer or a
    reader of its output does."""
    _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)
    _signal.alarm(int(seconds) + ALARM_SLACK)
    report = nic_report(nic, sysfs)
    addrs = report.get("addresses") or []
    if "error" in report or not addrs:
        report.setdefault("error", "no address")
        _say(report)
        return 0
    try:
        tcp, udp, port = _open(str(addrs[0]))
    except OSError as exc:
        _say({**report, "error": f"cannot listen: {exc.strerror}"})
        return 0
    _say({**report, "port": port})
    Server(tcp, udp, lambda words: probe(report, words)).run(time.monotonic() + seconds)
    # No probe thread's line after this: one still inside stdout's write would hold the
    # buffer's own lock when the interpreter shuts down, which aborts it (SIGABRT, seen
    # once in test_datacheck); held here, a late thread waits on `_out` instead.
    _out.acquire()
    return 0


def _kind(exc: OSError) -> str:
    if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
        return "timeout"
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return "no route"
    return f"error: {exc.strerror or exc}"


def _tcp(src: str, addr: str, port: int, timeout: float) -> tuple[str | None, float]:
    """(None, the echo's round trip in seconds) if a TCP connection from `src` echoes our
    hello, else (the kind of failure, 0)."""
    s = _socket.socket(_family(addr), _socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.bind((src, 0))
        s.connect((addr, port))
        sent = time.monotonic()
        s.sendall(HELLO)
        got = b""
        while len(got) < len(HELLO):
            chunk = s.recv(len(HELLO) - len(got))
            if not chunk:
                return "closed by the peer", 0.0
            got += chunk
    except OSError as exc:
        return _kind(exc), 0.0
    finally:
        s.close()
    return None, time.monotonic() - sent


def _udp_passes(s: _socket.socket, payload: int, tries: int, wait: float) -> bool:
    """Does a don't-fragment datagram of `payload` bytes reach the peer (its answer)?"""
    for _ in range(tries):
        try:
            s.send(b"\0" * payload)
        except OSError:  # EMSGSIZE: a route from here already says it is too big
            return False
        ready, _, _ = select.select([s], [], [], wait)
        if ready:
            try:
                got = s.recv(16)
            except OSError:
                return False
            if got == struct.pack("!I", payload):
                return True
    return False


# A lost datagram is asked again (each try waits for its answer a few round trips, the
# echo's over TCP): a lossy, slow, saturated network (20% loss each way, 100 ms each way,
# every CPU busy: tests/bench/loaded.py) is no MTU problem. The full-MTU datagram gets
# TRIES tries, which a path losing 36% of round trips fails once in 3·10^4; a real MTU
# problem (every try lost) costs TRIES waits, then the bisection says how large passes.
TRIES, BISECT_TRIES = 10, 2
WAIT_S, WAIT_RTTS, MAX_WAIT_S = 0.3, 4, 2.0


def _mtu(src: str, addr: str, port: int, mtu: int, rtt: float) -> tuple[str | None, int]:
    """(None, mtu) when a full-MTU packet passes; else (why, the largest that passes)."""
    v6 = ":" in addr
    header = 48 if v6 else 28
    wait = min(MAX_WAIT_S, max(WAIT_S, WAIT_RTTS * rtt))
    s = _socket.socket(_family(addr), _socket.SOCK_DGRAM)
    try:
        if v6:
            s.setsockopt(_socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        else:
            s.setsockopt(_socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        s.bind((src, 0))
        s.connect((addr, port))
        if _udp_passes(s, mtu - header, TRIES, wait):
            return None, mtu
        low = min(MIN_PACKET, mtu)
        if not _udp_passes(s, low - header, TRIES, wait):
            return "udp", 0
        high = mtu  # low passes, high does not
        while high - low > 1:
            mid = (low + high) // 2
            passes = _udp_passes(s, mid - header, BISECT_TRIES, wait)
            low, high = (mid, high) if passes else (low, mid)
        return "mtu", low
    finally:
        s.close()


def probe_one(src: str, mtu: int, target: str, seconds: float) -> dict[str, object]:
    name, _, rest = target.partition("=")
    addr, port_text, peer_mtu = rest.rsplit(":", 2)
    addr = addr.strip("[]")
    port = int(port_text)
    path_mtu = min(mtu, int(peer_mtu))
    out: dict[str, object] = {"peer": name, "address": addr, "port": port, "mtu": path_mtu}
    why, rtt = _tcp(src, addr, port, seconds)
    if why is None:
        why, out["reaches"] = _mtu(src, addr, port, path_mtu, rtt)
    out["ok"] = why is None
    if why is not None:
        out["kind"] = why
    return out


def probe(report: dict[str, Any], targets: list[str]) -> None:
    """Probe every target at once, each in its own thread (this returns at once): one
    line per target as it is known, then `{"done": n}` after the last."""
    addrs = [str(a) for a in report.get("addresses") or []]
    left = [len(targets)]

    def one(target: str) -> None:
        name, _, rest = target.partition("=")
        result: dict[str, Any] = {"peer": name, "ok": False}
        try:
            v6 = ":" in rest.rsplit(":", 2)[0]
            src = next((a for a in addrs if (":" in a) == v6), None)
            if src is None:
                result["kind"] = f"no {'IPv6' if v6 else 'IPv4'} address on {report['nic']}"
            else:
                result = probe_one(src, int(report["mtu"]), target, PROBE_SECONDS)
        except Exception as exc:  # said as the pair's failure: a lost thread would hang it
            result["kind"] = f"error: {exc!r}"
        with _out:
            _write(result)
            left[0] -= 1
            if not left[0]:
                _write({"done": len(targets)})

    if not targets:
        _say({"done": 0})
    for target in targets:
        _thread.start_new_thread(one, (target,))


_out = _thread.allocate_lock()


def _write(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _say(obj: dict[str, Any]) -> None:
    with _out:
        _write(obj)
