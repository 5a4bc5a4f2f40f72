"""What a stranger on the pod network sees: a pod's control traffic, captured by a real
tcpdump on that pod's port of the simulated cluster's switch (tests/support/cluster.py),
and the lines the net exchange's clients sent, read back out of the capture."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
from pathlib import Path
from types import TracebackType

from tests.support.cluster import Cluster, Pod
from tests.support.wait import wait_until

PCAP_HEADER = 24  # bytes (pcap-savefile(5))
RECORD_HEADER = 16
LINKTYPE_ETHERNET = 1


class Capture:
    """tcpdump on `pod`'s port of the control bridge for TCP `port`, into `path`, from start
    to close(). (A capture on the bridge device itself sees no frame it forwards.)"""

    def __init__(self, cluster: Cluster, pod: Pod, path: Path, port: int) -> None:
        self.path, self.port = path, port
        self.proc = subprocess.Popen(
            [
                *cluster.switch.prefix(),
                "tcpdump",
                "-i",
                f"p{pod.index}-eth0",  # the switch's end of the pod's eth0 (Cluster._wire)
                "-n",
                "--immediate-mode",  # each packet handed over at once, none left behind
                "-U",  # and written as it comes
                "-Z",
                "root",  # keep root: Debian's tcpdump would switch to its own user
                "-w",
                str(path),
                f"tcp port {port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

        def listening() -> bool:
            assert self.proc.poll() is None, self.proc.communicate()
            return path.exists() and path.stat().st_size >= PCAP_HEADER

        wait_until(listening, 10, f"tcpdump to listen on {pod.name}'s port")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # tcpdump flushes and exits
        self.proc.communicate(timeout=10)

    def sent_lines(self) -> list[bytes]:
        """Every line a client sent to the port, stream by stream, in order."""
        out: list[bytes] = []
        for data in client_streams(self.path.read_bytes(), self.port).values():
            out += [ln for ln in data.split(b"\n") if ln]
        return out

    def hellos(self) -> list[bytes]:
        """The net exchange hellos among them, as sent (without their newline)."""
        out = []
        for line in self.sent_lines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("type") == "hello":
                out.append(line)
        return out

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def client_streams(pcap: bytes, port: int) -> dict[tuple[str, int], bytes]:
    """The bytes each client (address, port) sent to `port` over IPv4, by TCP sequence
    number (a segment seen twice counts once)."""
    magic = pcap[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    (linktype,) = struct.unpack(endian + "I", pcap[20:24])
    assert linktype == LINKTYPE_ETHERNET, linktype
    streams: dict[tuple[str, int], dict[int, bytes]] = {}
    at = PCAP_HEADER
    while at + RECORD_HEADER <= len(pcap):
        _, _, caught, _ = struct.unpack(endian + "IIII", pcap[at : at + RECORD_HEADER])
        frame = pcap[at + RECORD_HEADER : at + RECORD_HEADER + caught]
        at += RECORD_HEADER + caught
        if frame[12:14] != b"\x08\x00":  # IPv4 only: the cluster's bridges are IPv4
            continue
        ip = frame[14:]
        if ip[9] != socket.IPPROTO_TCP:
            continue
        (total,) = struct.unpack("!H", ip[2:4])
        tcp = ip[(ip[0] & 0x0F) * 4 : total]
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        data = tcp[(tcp[12] >> 4) * 4 :]
        if dport == port and data:
            streams.setdefault((socket.inet_ntoa(ip[12:16]), sport), {})[seq] = data
    return {k: b"".join(v[s] for s in sorted(v)) for k, v in streams.items()}
