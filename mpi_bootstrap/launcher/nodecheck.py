"""Each worker's node, as its preflight session reported it (core/remote.py `node`: a
peer's words, shown escaped and bounded), judged before any rank starts: /dev/shm against
what NCCL maps there for its slots, one NCCL version on every worker, slots against GPUs,
RDMA ports and the pinned GID, IMEX. The rules: docs/configuration.md, "Node checks".
Pure: the launch raises what `problems` finds (exit 69)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from mpi_bootstrap.core import nccl, nodechecks
from mpi_bootstrap.core.errors import shown, some
from mpi_bootstrap.core.model import Decision
from mpi_bootstrap.core.remote import Report
from mpi_bootstrap.core.values import digits

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
    simple_b = SIMPLE if (b := digits(simple)) is None else b  # ASCII digits, bounded
    return slots * max(2, digits(channels) or 2) * 2 * (SEGMENT - SIMPLE + simple_b)


GID_FIX = (
    "unset NCCL_IB_GID_INDEX (NCCL picks one per port), or pin an index that holds a "
    "RoCE v2 GID on every worker"
)
IMEX = "/dev/nvidia-caps-imex-channels/"


def problems(
    nodes: Mapping[str, Report],
    slots: Mapping[str, int],
    env: Mapping[str, str],
    on: set[str],
    rule: nccl.Rule | None = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """(host, what is wrong and the fix) for each failed check of `on`, and warnings.
    `rule`: the NCCL_SOCKET_IFNAME the ranks get (core/nccl.py), which says which of
    each worker's interfaces NCCL uses: only the RDMA ports behind those are judged
    (None: every port reported)."""
    bad: list[tuple[str, str]] = []
    warn: list[str] = []
    nodes = {h: _behind(r, rule) for h, r in nodes.items()}
    for host, r in sorted(nodes.items()):
        bad += [(host, why) for why in _one(host, r, slots.get(host, 1), env, on, warn)]
    found = {h: r.nccl for h, r in nodes.items() if r.nccl}
    versions = sorted({v for _, v in found.values()})
    if "nccl" in on and len(versions) > 1:
        on_v = {v: sorted(h for h, (_, w) in found.items() if w == v) for v in versions}
        each = [
            f"{shown(v)} on {some(hs)} ({shown(found[hs[0]][0], 400)})" for v, hs in on_v.items()
        ]
        bad.append((on_v[versions[-1]][0], (
            f"NCCL differs between workers: {'; '.join(each)}; NCCL needs one version on every "
            f"rank (a hang or 'invalid usage' at init): use one image, or the same "
            "LD_LIBRARY_PATH to one NCCL, everywhere"
        )))  # fmt: skip
    if "nccl" in on and found and len(found) < len(nodes):
        warn.append(f"no libnccl.so.2 on {some(sorted(set(nodes) - set(found)))}")
    kinds: dict[str, list[str]] = {}
    for h, r in sorted(nodes.items()):
        for _, port, gid, kind in r.gids:
            if gid.strip("0:-"):
                kinds.setdefault(kind, []).append(f"{h} {port}")
    if "rdma" in on and len(kinds) > 1:
        order = sorted(kinds, key=lambda k: (len(kinds[k]), k))  # the fewest first
        each = [f"{shown(k)} on {shown(some(kinds[k]))}" for k in order]
        bad.append((kinds[order[0]][0].split()[0], (
            f"NCCL_IB_GID_INDEX={env.get('NCCL_IB_GID_INDEX')} is of another kind on some "
            f"workers: {'; '.join(each)}; NCCL connects like to like only: {GID_FIX}"
        )))  # fmt: skip
    return bad, warn


def _behind(r: Report, rule: nccl.Rule | None) -> Report:
    """The report with only the RDMA ports (and GIDs) behind the interfaces NCCL uses on
    that worker, by the one rule the ranks get: NCCL's own when unset (core/nccl.py)."""
    if rule is None:
        return r
    used = set(rule.select(r.ifaces)[0])
    return dataclasses.replace(
        r,
        ports=tuple(p for p in r.ports if p[0] in used),
        gids=tuple(g for g in r.gids if g[0] in used),
    )


def _one(  # noqa: PLR0917 - one worker's facts, and what it is judged by
    host: str, r: Report, n: int, env: Mapping[str, str], on: set[str], warn: list[str]
) -> list[str]:
    """What is wrong on one worker running `n` ranks (its warnings added to `warn`)."""
    bad: list[str] = []
    need = shm_need(n, env) if r.nccl else 0
    if "shm" in on and r.shm and need > r.shm[1] * 1024:
        size = -(-need // (1 << 30))
        bad.append(
            f"{host}: /dev/shm has {r.shm[1] // 1024} MiB free of {r.shm[0] // 1024} MiB, "
            f"and NCCL maps about {need >> 20} MiB there for {n} ranks (its shared-memory "
            'transport: docs/configuration.md, "Node checks"); give the pod a larger '
            "one:\n  volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: "
            f"{size}Gi}}}}]\n  volumeMounts: [{{name: dshm, mountPath: /dev/shm}}]"
        )
    if "gpus" in on and r.gpus and n > r.gpus:
        bad.append(
            f"{host}: {n} slots but {r.gpus} GPUs: ranks would share a GPU; set slots "
            f"to {r.gpus} (MPIJob: slotsPerWorker: {r.gpus})"
        )
    elif "gpus" in on and r.gpus > n:
        warn.append(f"{host}: {n} slots of {r.gpus} GPUs: {r.gpus - n} idle")
    if "rdma" in on:
        bad += [
            f"{host}: RDMA port {shown(port)} behind the data NIC is {shown(state)}: NCCL "
            f"cannot use it; check its link (ibstat), or leave {shown(port.split('/')[0])} out "
            "of NCCL_IB_HCA"
            for _, port, state in r.ports
            if state != "ACTIVE"
        ] + [
            f"{host}: NCCL_IB_GID_INDEX={env.get('NCCL_IB_GID_INDEX')} is empty on {shown(port)}: "
            f"NCCL cannot connect there; {GID_FIX}"
            for _, port, gid, _ in r.gids
            if not gid.strip("0:-")
        ]
    if "imex" in on and r.imex == 0 and env.get("NCCL_MNNVL_ENABLE") == "1":
        bad.append(
            f"{host}: NCCL_MNNVL_ENABLE=1 but the pod has no IMEX channel ({IMEX}): "
            "multi-node NVLink fails at NCCL's init (Cuda failure 801); claim one from "
            "the job's ComputeDomain (NVIDIA's DRA driver):\n  resourceClaims: [{name: "
            "imex, resourceClaimTemplateName: COMPUTEDOMAIN-channel}]"
        )
    return bad


def nccl_job(on: Sequence[str], env: Mapping[str, str]) -> bool:
    """Where each worker reports its node: node checks on, and NCCL_* in the job's env."""
    return bool(on) and any(k.startswith("NCCL_") for k in env)


def decision(on: tuple[str, ...], source: str, preflight: bool, nccl_env: bool) -> Decision:
    if on and preflight and not nccl_env:
        why = "none runs: the job's environment has no NCCL_* variable (the checks are NCCL's)"
        return Decision("node checks", "off", source, why)
    fails = "; ".join(c.short for c in nodechecks.CHECKS if c.name in on)
    why = (
        f"each worker's preflight session reports its node; {fails}: exit 69 before any "
        'rank (docs/configuration.md, "Node checks")'
        if on and preflight
        else "needs preflight's ssh sessions"
        if on
        else "disabled"
    )
    return Decision("node checks", ", ".join(on) if on and preflight else "off", source, why)
