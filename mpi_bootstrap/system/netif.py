"""Network interfaces present in this pod (psutil): their names, the order NCCL finds
them in, their addresses. Which of them is the data NIC is core/nccl.py's choice."""

from __future__ import annotations


def present() -> frozenset[str]:
    """Names of the interfaces this network namespace has."""
    import psutil  # imported here: only the launcher's planning needs it

    return frozenset(psutil.net_if_addrs())


def nccl_order() -> tuple[str, ...]:
    """The interfaces NCCL could use here, in the order NCCL finds them: RUNNING, with an
    IPv4 or IPv6 address (not ::1), those with IPv4 first — getifaddrs' order, which
    NCCL walks (src/os/linux.cc `ncclOsFindInterfaces`, NVIDIA/nccl). psutil lists the
    names in that order: it sorts getifaddrs' entries by family, stably."""
    import socket

    import psutil

    stats = psutil.net_if_stats()
    found = [
        (
            name,
            [
                a
                for a in addrs
                if a.family == socket.AF_INET
                or (a.family == socket.AF_INET6 and a.address != "::1")
            ],
        )
        for name, addrs in psutil.net_if_addrs().items()
        if name in stats and "running" in stats[name].flags.split(",")
    ]
    return tuple(name for name, addrs in found if addrs)


def addresses(iface: str | None = None, *, link_local: bool = True) -> list[str]:
    """IPv4/IPv6 addresses of `iface` (None: of every interface), scope ids dropped."""
    import socket

    import psutil

    found = psutil.net_if_addrs()
    groups = [found.get(iface, [])] if iface is not None else list(found.values())
    out = []
    for group in groups:
        for a in group:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                addr = a.address.split("%", 1)[0]
                if link_local or not addr.startswith("fe80"):
                    out.append(addr)
    return out
