"""Network interfaces present in this pod (psutil), and the data-interface choice."""

from __future__ import annotations


def present() -> frozenset[str]:
    """Names of the interfaces this network namespace has."""
    import psutil  # imported here: only the launcher's planning needs it

    return frozenset(psutil.net_if_addrs())


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
