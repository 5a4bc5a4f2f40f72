"""A delay line for the simulated cluster's links: this kernel has no netem qdisc (and no
fq, whose earliest-departure-time would do it), so frames wait in user space.

    python delayline.py MS POD_SIDE:BRIDGE_SIDE [...]     (run inside the switch netns)

tests/support/faults.py `delay()` sets the path up: a pod's veth end in the switch
(`p3-eth0`) leaves its bridge, a new veth pair (`d3-eth0` ↔ `e3-eth0`) takes its place
there, and a tc rule sends whatever comes from the bridge (`d3-eth0`'s ingress) straight
on to the pod (`p3-eth0`'s egress): frames *to* the pod pass in the kernel. Frames *from*
the pod are read here from `p3-eth0` and sent on `d3-eth0` MS milliseconds later, in
order, as `tc qdisc … netem delay MS` on every pod's interface would do.

The packet sockets carry virtio-net headers (PACKET_VNET_HDR), so a TCP segment that
the pod's stack handed over unsegmented and without its checksum (the veth offloads)
is sent on as it was, the kernel finishing it; no offload needs turning off. Prints
READY once every socket is bound. Runs at a raised priority: the network is not a pod,
and a pod whose CPU is saturated must not slow every link.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4  # sll_pkttype of a frame this host sends (tc's redirect, here)
BUFSIZE = 65536 + 64  # a whole unsegmented TCP frame and its virtio-net header


def packet_socket(iface: str, proto: int) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.bind((iface, proto))
    s.setblocking(False)
    return s


def run(delay_s: float, links: list[tuple[str, str]]) -> None:
    ep = select.epoll()
    out_of: dict[int, socket.socket] = {}
    keep: list[socket.socket] = []
    for pod_side, bridge_side in links:
        rx = packet_socket(pod_side, ETH_P_ALL)
        tx = packet_socket(bridge_side, 0)  # protocol 0: receives nothing
        keep += [rx, tx]
        out_of[rx.fileno()] = tx
        ep.register(rx.fileno(), select.EPOLLIN)
    by_fd = {s.fileno(): s for s in keep}
    queue: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
    print("READY", flush=True)
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        for fd, _ in ep.poll(wait):
            rx = by_fd[fd]
            while True:
                try:
                    frame, addr = rx.recvfrom(BUFSIZE)
                except BlockingIOError:
                    break
                if addr[2] != PACKET_OUTGOING:
                    queue.append((time.monotonic() + delay_s, out_of[fd], frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, tx, frame = queue.popleft()
            with contextlib.suppress(OSError):  # a full queue or a link down: lost, as on a wire
                tx.send(frame)


def main() -> None:
    delay_ms = float(sys.argv[1])
    links = [tuple(arg.split(":", 1)) for arg in sys.argv[2:]]
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    run(delay_ms / 1000, [(a, b) for a, b in links])


if __name__ == "__main__":
    main()
