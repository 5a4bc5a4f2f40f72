"""Each worker's node, as its preflight session reported it (core/remote.py NODE), judged
before any rank starts: /dev/shm against what NCCL maps there for its slots, one NCCL
version on every worker, slots against GPUs. The rules: docs/configuration.md, "Node
checks". Pure: the launch raises what `problems` finds (exit 69)."""

from __future__ import annotations

from collections.abc import Mapping

from mpi_bootstrap.core.errors import some
from mpi_bootstrap.core.model import Decision
from mpi_bootstrap.core.remote import Report

# NCCL's shared-memory transport maps one segment per connection and channel, of its
# SIMPLE buffer (NCCL_BUFFSIZE, 4 MiB), LL128 and LL buffers and headers: 9,637,892
# bytes, the size NCCL's own "failed to extend /dev/shm/nccl-…" names. Each local rank
# holds 2 connections (ring and tree) on each of 2 channels (NCCL_MIN_NCHANNELS raises it).
SEGMENT, SIMPLE = 9_637_892, 4 << 20


def shm_need(slots: int, env: Mapping[str, str]) -> int:
    """Bytes NCCL maps in /dev/shm for `slots` ranks on one node (none for one rank)."""
    if slots < 2:
        return 0
    simple, channels = (env.get(k, "") for k in ("NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS"))
    simple_b = int(simple) if simple.isdigit() else SIMPLE
    return (
        slots
        * max(2, int(channels) if channels.isdigit() else 2)
        * 2
        * (SEGMENT - SIMPLE + simple_b)
    )


def problems(
    nodes: Mapping[str, Report], slots: Mapping[str, int], env: Mapping[str, str], on: set[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """(host, what is wrong and the fix) for each failed check of `on`, and warnings."""
    bad: list[tuple[str, str]] = []
    warn: list[str] = []
    for host, r in sorted(nodes.items()):
        n = slots.get(host, 1)
        need = shm_need(n, env) if r.nccl else 0
        if "shm" in on and r.shm and need > r.shm[1] * 1024:
            size = -(-need // (1 << 30))
            bad.append((host, (
                f"{host}: /dev/shm has {r.shm[1] // 1024} MiB free of {r.shm[0] // 1024} MiB, "
                f"and NCCL maps about {need >> 20} MiB there for {n} ranks (its shared-memory "
                "transport: docs/configuration.md, \"Node checks\"); give the pod a larger "
                "one:\n  volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: "
                f"{size}Gi}}}}]\n  volumeMounts: [{{name: dshm, mountPath: /dev/shm}}]"
            )))  # fmt: skip
        if "gpus" in on and r.gpus and n > r.gpus:
            bad.append((host, (
                f"{host}: {n} slots but {r.gpus} GPUs: ranks would share a GPU; set slots "
                f"to {r.gpus} (MPIJob: slotsPerWorker: {r.gpus})"
            )))  # fmt: skip
        elif "gpus" in on and r.gpus > n:
            warn.append(f"{host}: {n} slots of {r.gpus} GPUs: {r.gpus - n} idle")
    found = {h: r.nccl for h, r in nodes.items() if r.nccl}
    versions = sorted({v for _, v in found.values()})
    if "nccl" in on and len(versions) > 1:
        on_v = {v: sorted(h for h, (_, w) in found.items() if w == v) for v in versions}
        each = [f"{v} on {some(hs)} ({found[hs[0]][0]})" for v, hs in on_v.items()]
        bad.append((on_v[versions[-1]][0], (
            f"NCCL differs between workers: {'; '.join(each)}; NCCL needs one version on every "
            f"rank (a hang or 'invalid usage' at init): use one image, or the same "
            "LD_LIBRARY_PATH to one NCCL, everywhere"
        )))  # fmt: skip
    if "nccl" in on and found and len(found) < len(nodes):
        warn.append(f"no libnccl.so.2 on {some(sorted(set(nodes) - set(found)))}")
    return bad, warn


def decision(on: tuple[str, ...], source: str, preflight: bool) -> Decision:
    why = (
        "each worker's preflight session reports /dev/shm, the libnccl.so.2 its ranks "
        "load and its GPUs; /dev/shm too small for NCCL's buffers, NCCL versions that "
        "differ, more slots than GPUs: exit 69 before any rank (docs/configuration.md)"
        if on and preflight
        else "needs preflight's ssh sessions"
        if on
        else "disabled"
    )
    return Decision("node checks", ", ".join(on) if on and preflight else "off", source, why)
