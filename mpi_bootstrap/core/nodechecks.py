"""The node checks, one row each: what the worker reports, when the check fails (69,
before any rank), the fix, and the check in a few words. The setting's choices
(MPI_BOOTSTRAP_NODE_CHECKS), its help, --explain's `node checks` row
(launcher/nodecheck.py) and docs/configuration.md's table ("Node checks", `make docs`)
all come from here; the rules themselves are launcher/nodecheck.py's. Pure."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class NodeCheck:
    name: str
    reports: str  # what the worker's report holds for it (core/remote.py node)
    fails: str  # when it fails (69, naming the worker)
    fix: str
    short: str  # the failure in a few words, for --explain


CHECKS = (
    NodeCheck(
        "shm",
        "`/dev/shm`'s size and free space (`df -Pk`)",
        (
            "NCCL is on the worker and its free space is below what NCCL's shared-memory transport "
            "maps for the worker's slots (below)"
        ),
        (
            "an emptyDir `medium: Memory` at `/dev/shm` with a `sizeLimit` (the message gives the "
            "YAML)"
        ),
        "/dev/shm too small for NCCL's buffers at the worker's slots",  # noqa: S108 - a name
    ),
    NodeCheck(
        "nccl",
        (
            "the `libnccl.so.2` the ranks load: the first in the forwarded `LD_LIBRARY_PATH`, else "
            "the loader's cache (`/sbin/ldconfig -p`); its version from its file's name "
            "(`libnccl.so.2.21.5`), else the banner it carries (`NCCL version 2.26.2+cuda…`, as "
            "pip's wheel ships it)"
        ),
        (
            "two workers load different versions (each version is named with its workers and "
            "path); a worker without NCCL beside others with it is a warning"
        ),
        "one image, or one NCCL on one `LD_LIBRARY_PATH`, everywhere",
        "NCCL versions that differ between workers",
    ),
    NodeCheck(
        "gpus",
        "`/dev/nvidia[0-9]*` (the GPUs the device plugin gave the pod)",
        "more slots than GPUs (ranks would share one); fewer is a warning (GPUs idle)",
        "`slots` = GPUs (`slotsPerWorker`)",
        "more slots than GPUs",
    ),
    NodeCheck(
        "rdma",
        (
            "behind each interface NCCL uses on that worker (the worker reports every interface "
            "and the RDMA ports behind it, under `MPI_BOOTSTRAP_SYSFS`: "
            "`class/net/NIC/device/infiniband/DEV/ports/P`; the launcher applies to its list the "
            "one rule of core/nccl.py with the `NCCL_SOCKET_IFNAME` the ranks get, NCCL's own when "
            "it is unset): each port's `state`; with `NCCL_IB_GID_INDEX` pinned, that index's GID "
            "and `gid_attrs/types`"
        ),
        (
            "a port not `ACTIVE`; the pinned GID empty (zeros) on a port; GIDs of different kinds "
            "(RoCE v1 against v2) across workers"
        ),
        (
            "check the link (`ibstat`) or leave the device out of `NCCL_IB_HCA`; unset "
            "`NCCL_IB_GID_INDEX` (NCCL picks per port) or pin an index that holds a RoCE v2 GID "
            "everywhere"
        ),
        "an RDMA port NCCL uses not ACTIVE, or a pinned GID empty or of another kind",
    ),
    NodeCheck(
        "imex",
        "with `NCCL_MNNVL_ENABLE` set, `/dev/nvidia-caps-imex-channels/channel*`",
        "`NCCL_MNNVL_ENABLE=1` and no IMEX channel (`Cuda failure 801` at init)",
        "a ComputeDomain's channel claim (NVIDIA's DRA driver; the message gives the YAML)",
        "NCCL_MNNVL_ENABLE=1 without an IMEX channel",
    ),
)
NAMES = tuple(c.name for c in CHECKS)
