"""Network interfaces present in this pod (psutil), and the data-interface choice."""

from __future__ import annotations

# Names a secondary "fast" NIC gets: Multus/SR-IOV attaches `net1`, DraNet `dranet0`.
DATA_IFACE_CANDIDATES = ("net1", "dranet0")


def present() -> frozenset[str]:
    """Names of the interfaces this network namespace has."""
    import psutil  # imported here: only the launcher's planning needs it

    return frozenset(psutil.net_if_addrs())
