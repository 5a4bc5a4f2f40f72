"""Hostfiles: read the three forms, validate, rewrite names, write the form an MPI needs.

Forms read (one host per line; `#` comments, blank lines and CRLF allowed):
- Open MPI:  `host slots=N [max_slots=M]`  (MPI Operator: `pi-worker-0.pi.default.svc slots=1`)
- hydra:     `host:N`                      (MPI Operator for Intel MPI and MPICH)
- bare:      `host`                        (Volcano, discover_hosts.sh) — one slot
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from mpi_bootstrap.core.errors import HostfileError
from mpi_bootstrap.core.names import DNS_NAME_PATTERN, is_dns_name, is_ip_literal

OPENMPI = "openmpi"
HYDRA = "hydra"

# Hostfiles are small; a bigger one is almost certainly the wrong file.
MAX_BYTES = 64 * 1024 * 1024
_SLOTS_KEYS = {"slots", "count", "cpu"}  # Open MPI accepts all three spellings
_MAX_KEYS = {"max_slots", "max-slots"}
_INT = re.compile(r"[0-9]{1,9}")  # fullmatch (`$` allows a final newline)
# The two shapes MPI Operator writes, checked in one match; anything else takes the
# careful path that names what is wrong.
_FAST = re.compile(f"({DNS_NAME_PATTERN})" r"(?:[ \t]+slots=([0-9]{1,9})|:([0-9]{1,9}))?")


class Host(NamedTuple):
    """One host line. A NamedTuple, not a dataclass: 100,000 of them are made per parse."""

    name: str
    slots: int
    max_slots: int | None = None
    line: int = 0


@dataclasses.dataclass(frozen=True)
class Hostfile:
    path: str
    text: str
    hosts: tuple[Host, ...]

    @property
    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def summary(self) -> str:
        """`N hosts, M slots`, and what a line without slots (Volcano's form) gets."""
        bare = re.search(r"^\s*[^#\s:]+\s*(#.*)?$", self.text, re.M)
        note = " (a line without slots: 1; slots=N, host:N or MPI_BOOTSTRAP_NP)" if bare else ""
        return f"{len(self.hosts)} hosts, {self.total_slots} slots{note}"


def _decode(data: bytes, path: str) -> str:
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise HostfileError(f"{path}:{line}: binary data (NUL byte); not a text hostfile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise HostfileError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
        ) from None
    return text


def parse(data: bytes | str, path: str = "<hostfile>") -> Hostfile:
    """Parse hostfile content. Raises HostfileError with `path:line: reason`."""
    text = (data if isinstance(data, str) else _decode(data, path)).removeprefix("\ufeff")
    hosts: list[Host] = []
    first_seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = (raw.split("#", 1)[0] if "#" in raw else raw).strip()
        if not line:
            continue
        m = _FAST.fullmatch(line)
        count = int(m.group(2) or m.group(3) or 1) if m else 0
        if m and count >= 1 and len(m.group(1)) <= 253:
            host = Host(m.group(1), count, None, lineno)
        else:
            host = _parse_line(line, path, lineno)
        key = host.name.lower().rstrip(".")
        if key in first_seen:
            raise HostfileError(
                f"{path}:{lineno}: duplicate host {host.name!r} (first at line {first_seen[key]})"
            )
        first_seen[key] = lineno
        hosts.append(host)
    if not hosts:
        raise HostfileError(f"{path}: no hosts (the file is empty or only comments)")
    return Hostfile(path=path, text=text, hosts=tuple(hosts))


def _parse_line(line: str, path: str, lineno: int) -> Host:
    where = f"{path}:{lineno}"
    tokens = line.split()
    first, options = tokens[0], tokens[1:]
    name, slots_text = _split_hydra(first)
    _check_name(name, where)
    slots: int | None = None
    max_slots: int | None = None
    if slots_text is not None:
        slots = _count(slots_text, where, "slots")
        if options:
            raise HostfileError(
                f"{where}: unexpected {options[0]!r} after {first!r} "
                "(use `host:N` or `host slots=N`, not both)"
            )
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep:
            raise HostfileError(f"{where}: unexpected {opt!r}; expected slots=N or max_slots=N")
        key = key.lower()
        if key in _SLOTS_KEYS:
            slots = _count(value, where, key)
        elif key in _MAX_KEYS:
            max_slots = _count(value, where, key)
        else:
            raise HostfileError(f"{where}: unknown option {key!r}; expected slots=N or max_slots=N")
    if slots is None:
        slots = 1
    if max_slots is not None and max_slots < slots:
        raise HostfileError(f"{where}: max_slots={max_slots} is less than slots={slots}")
    return Host(name=name, slots=slots, max_slots=max_slots, line=lineno)


def _split_hydra(token: str) -> tuple[str, str | None]:
    """`host:N` → (host, "N"); a bare IPv6 literal has colons but no slot count."""
    if token.startswith("["):  # [v6]:N or [v6]
        end = token.find("]")
        if end > 0:
            rest = token[end + 1 :]
            inner = token[1:end]
            if rest.startswith(":"):
                return inner, rest[1:]
            if not rest:
                return inner, None
        return token, None
    if token.count(":") == 1:
        name, _, count = token.partition(":")
        return name, count
    return token, None


def _count(text: str, where: str, key: str) -> int:
    if not _INT.fullmatch(text):
        raise HostfileError(f"{where}: {key} must be a whole number ≥ 1, not {text!r}")
    value = int(text)
    if value < 1:
        raise HostfileError(f"{where}: {key} must be ≥ 1, not {text!r}")
    return value


def _check_name(name: str, where: str) -> None:
    if is_ip_literal(name):
        return
    if not is_dns_name(name):
        raise HostfileError(
            f"{where}: {name!r} is not a valid hostname "
            "(RFC 1123 letters, digits, '-' and '.') or IP address"
        )


# ---------------------------------------------------------------- rewriting


def fqdn(name: str, cluster_domain: str) -> str:
    """`x.svc` → `x.svc.<cluster_domain>`; anything else unchanged. Idempotent."""
    if name[-4:].lower() == ".svc" and not is_ip_literal(name):
        return f"{name}.{cluster_domain}"
    return name


def lookup_name(name: str, rewrite: str, cluster_domain: str) -> str:
    """The name the DNS wait (and the doctor) asks for: what mpirun will use, before any
    IP rewrite. `ip` mode looks the FQDN form up, so it also works where only
    `.svc.<domain>` resolves (MPI Operator clusters whose DNS refuses the short `.svc`
    form)."""
    return fqdn(name, cluster_domain) if rewrite in ("fqdn", "ip") else name


def rename(hostfile: Hostfile, names: Mapping[str, str]) -> tuple[Host, ...]:
    """The hosts with names replaced; an error if two hosts end up as one."""
    out: list[Host] = []
    seen: dict[str, Host] = {}
    for host in hostfile.hosts:
        new = names.get(host.name, host.name)
        key = new.lower()
        if key in seen:
            other = seen[key]
            raise HostfileError(
                f"{hostfile.path}:{host.line}: {host.name!r} becomes {new!r}, the same as "
                f"{other.name!r} (line {other.line}); two lines would be one host"
            )
        renamed = Host(new, host.slots, host.max_slots, host.line)
        seen[key] = host
        out.append(renamed)
    return tuple(out)


# ---------------------------------------------------------------- writing


def render(hosts: Iterable[Host], form: str) -> str:
    """The hostfile text in `form` (OPENMPI or HYDRA), one host per line."""
    lines: list[str] = []
    for h in hosts:
        if form == HYDRA:
            name = f"[{h.name}]" if ":" in h.name else h.name
            lines.append(f"{name}:{h.slots}")
        else:
            extra = f" max_slots={h.max_slots}" if h.max_slots is not None else ""
            lines.append(f"{h.name} slots={h.slots}{extra}")
    return "\n".join(lines) + "\n"
