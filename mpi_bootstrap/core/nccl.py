"""Which interfaces NCCL will use, decided the way NCCL decides it: the one place the
agent reads NCCL_SOCKET_IFNAME and NCCL_IB_HCA (the record, the plan, the data check,
`--explain` and the doctor all ask `rule(...)` and `Rule.select(...)`). Pure. The forms,
NCCL's rule when unset, and the values the agent refuses (64) where NCCL would silently
take fewer entries or none: docs/configuration.md, "The data NIC, as NCCL chooses it".

NCCL's code followed (NVIDIA/nccl): src/misc/utils.cc `parseStringList` (split at `,`,
empty entries vanish; `NAME[:PORT[:RAIL[:PLANE]]]`) and `matchIf`/`matchIfList`/`matchPort`
(a prefix, or the whole name after `=`; a port matches when either side has none);
src/os/linux.cc `ncclOsFindInterfaces` (`^` excludes; RUNNING interfaces with an address,
in getifaddrs' order); src/misc/socket.cc `ncclFindInterfaces` (the unset rule, less its
NCCL_COMM_ID subnet match); src/transport/net_ib/init.cc (NCCL_IB_HCA, the same syntax).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
IB_HCA = "NCCL_IB_HCA"
MAX_IFS = 16  # src/include/socket.h: the most interfaces NCCL's socket transport takes
MAX_IFACE_NAME = 15  # Linux IFNAMSIZ less its NUL: no interface has a longer name
MAX_HCA_NAME = 63  # NCCL's netIf.prefix[64] less its NUL
# What NCCL does when NCCL_SOCKET_IFNAME is unset (socket.cc `ncclFindInterfaces`), one
# list after another until one selects something.
UNSET_STEPS = ("ib", "^docker,lo,virbr", "docker", "lo", "virbr")
_ENTRY = re.compile(r"[A-Za-z0-9_.-]+")  # what an interface or RDMA device is named here


@dataclasses.dataclass(frozen=True)
class IfList:
    """One parsed NCCL list: `^` (exclude), `=` (exact names), entries (name, port)."""

    text: str
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]

    def matches(self, name: str, port: int | None = None) -> bool:
        """Does NCCL take `name` (with `port`, for an RDMA device) under this list?"""
        hit = any(
            (name == want if self.exact else name.startswith(want))
            and (port is None or have is None or port == have)
            for want, have in self.entries
        )
        return hit != self.exclude

    def select(self, names: Sequence[str], limit: int = MAX_IFS) -> tuple[str, ...]:
        """The names NCCL takes, in the order given (NCCL's), each once, at most `limit`."""
        return tuple(dict.fromkeys(n for n in names if self.matches(n)))[:limit]

    def describe(self) -> str:
        """In words, for --explain: `every one but lo*, docker0*`, `exactly net1`."""
        names = ", ".join(
            n + ("" if self.exact else "*") + (f":{p}" if p is not None else "")
            for n, p in self.entries
        )
        return (
            f"every one but {names}"
            if self.exclude
            else f"exactly {names}"
            if self.exact
            else f"those named {names}"
        )


def parse(value: str, variable: str = SOCKET_IFNAME) -> IfList:
    """`value` as NCCL reads it; ValueError naming `variable` when malformed."""
    text, exclude, exact = value, False, False
    if text.startswith("^"):
        exclude, text = True, text[1:]
    if text.startswith("="):
        exact, text = True, text[1:]
    longest = MAX_HCA_NAME if variable == IB_HCA else MAX_IFACE_NAME
    if not text:
        raise ValueError(f"{variable}={value!r}: no name after {value!r}")
    entries = []
    for entry in text.split(","):
        name, _, rest = entry.partition(":")
        port = rest.split(":", 1)[0]  # NCCL reads RAIL and PLANE after it: not names
        if not name:
            raise ValueError(
                f"{variable}={value!r}: an empty entry (NCCL would skip it: "
                "a stray comma or colon?)"
            )
        if len(name) > longest:
            raise ValueError(
                f"{variable}={value!r}: {name[:20]!r}… is longer than any "
                f"{'RDMA device' if variable == IB_HCA else 'interface'} "
                f"name can be ({longest} characters)"
            )
        if not _ENTRY.fullmatch(name):
            raise ValueError(
                f"{variable}={value!r}: {name!r} is not an interface name "
                "(letters, digits and _ . - only)"
            )
        if port and not (port.isascii() and port.isdigit() and int(port) < 1 << 16):
            raise ValueError(f"{variable}={value!r}: port {port[:8]!r} is not a number")
        entries.append((name, int(port) if port else None))
    return IfList(value, exclude, exact, tuple(entries))


def given(environ: Mapping[str, str], variable: str = SOCKET_IFNAME) -> str | None:
    """The value NCCL takes from the environment; None where NCCL acts as if unset (an
    NCCL_SOCKET_IFNAME of one character or none: socket.cc reads it only when longer)."""
    value = environ.get(variable)
    if value is None or (variable == SOCKET_IFNAME and len(value) <= 1):
        return None
    return value


def problems(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the NCCL lists in `environ` (core/config.py: exit 64)."""
    out = []
    for variable in (SOCKET_IFNAME, IB_HCA):
        value = given(environ, variable)
        if value is not None and not (variable == IB_HCA and value == ""):
            try:
                parse(value, variable)
            except ValueError as exc:
                out.append(str(exc))
    return out


def unset_rule(names: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """What NCCL takes with NCCL_SOCKET_IFNAME unset, and which of its steps chose it."""
    for step in UNSET_STEPS:
        found = parse(step).select(names)
        if found:
            return found, f"{SOCKET_IFNAME} unset: NCCL's own rule, {_STEP_WORDS[step]}"
    return (), f"{SOCKET_IFNAME} unset: NCCL's own rule finds no interface at all"


_STEP_WORDS = {
    "ib": "ib* first",
    "^docker,lo,virbr": "no ib*: every interface but docker*, lo*, virbr*",
    "docker": "nothing but docker*, lo*, virbr*: docker*",
    "lo": "nothing but lo*, virbr*: lo*",
    "virbr": "nothing but virbr*",
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """What NCCL will be told, and why: `value`, the NCCL_SOCKET_IFNAME the ranks get
    (None: unset, NCCL's own rule), and `why`, for --explain and logs."""

    value: str | None
    why: str
    by_agent: bool = False  # the agent sets `value` (the user did not)

    def select(self, names: Sequence[str]) -> tuple[tuple[str, ...], str]:
        """The interfaces NCCL uses on a pod that has `names` (in NCCL's order), and
        the rule that chose them, in words."""
        if self.value is None:
            return unset_rule(names)
        spec = parse(self.value)
        return spec.select(names), f"{SOCKET_IFNAME}={self.value} takes {spec.describe()}"


def rule(
    configured: str | None,
    environ: Mapping[str, str],
    names: Sequence[str],
    candidates: Sequence[str],
) -> Rule:
    """The NCCL_SOCKET_IFNAME the ranks get: the user's (NCCL reads it as it is), else
    the interface MPI_BOOTSTRAP_DATA_IFACE names, else the first of `candidates` that
    `names` has, else none (NCCL's own rule)."""
    value = given(environ)
    if value is not None:
        why = "the user's"
        if configured:
            why += f"; MPI_BOOTSTRAP_DATA_IFACE={configured} is not what NCCL reads"
        return Rule(value, why)
    # Set by the agent as an exact name: a prefix `net1` would also take net10…net19. Left
    # unset, NCCL would take ib*, else every interface but docker*/lo*/virbr*: the pod
    # network too, whose traffic the data NIC is there to spare (UNSET_STEPS).
    if configured:
        return Rule(exact(configured), "MPI_BOOTSTRAP_DATA_IFACE names it", by_agent=True)
    found = next((n for n in candidates if n in names), None)
    if found is not None:
        return Rule(exact(found), f"the first of {', '.join(candidates)} present", by_agent=True)
    return Rule(None, f"unset, and none of {', '.join(candidates)} here")


def data_of(nics: Sequence[str], control: str) -> tuple[str, ...]:
    """The data NICs among the interfaces NCCL uses: all but the control interface (the
    pod network, which preflight's ssh crosses; the data check tests the others)."""
    return tuple(n for n in nics if n != control)


def exact(*names: str) -> str:
    """A list that selects exactly these names (`=`: no prefix matching, so mlx5_1 does
    not also take mlx5_10, nor net1 net10)."""
    return "=" + ",".join(dict.fromkeys(names))


def ib_hca(devices: Sequence[str]) -> str:
    """NCCL_IB_HCA naming exactly these RDMA devices."""
    return exact(*sorted(set(devices)))


def hca_select(value: str, devices: Sequence[str]) -> tuple[str, ...]:
    """The RDMA devices an NCCL_IB_HCA value selects among `devices` (any port: the
    agent sees devices, not their ports)."""
    if value == "":
        return tuple(devices)  # NCCL's empty list matches every device
    spec = parse(value, IB_HCA)
    return tuple(dict.fromkeys(d for d in devices if spec.matches(d)))
