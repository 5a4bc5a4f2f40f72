"""The value parsers of the settings table (core/settings/): each takes the raw text
of a flag or variable and returns its value, or raises ValueError with a short reason
(core/config.py names the flag or variable). Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from mpi_bootstrap.core import tokens
from mpi_bootstrap.core.names import (
    is_dns_name,
    is_env_name,
    is_iface_name,
    is_kex_list,
    is_plain_path,
    is_user_name,
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def digits(text: str, most: int = 18) -> int | None:
    """A number a peer (or a user's variable) wrote: ASCII digits only, at most `most` of
    them, else None. str.isdigit takes `²`, which int() refuses (a worker's node report
    of `SHM ² ²` once ended the launcher with a traceback, 70: tests/test_nodecheck.py);
    and a number of a thousand digits is no size anything here checks."""
    ok = 0 < len(text) <= most and text.isascii() and text.isdigit()
    return int(text) if ok else None


def path(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    if "\0" in raw:
        raise ValueError("contains a NUL byte")
    return raw


def path_or_off(raw: str) -> str:
    """A path, or empty: off."""
    if "\0" in raw:
        raise ValueError("contains a NUL byte")
    if raw and not raw.startswith("/"):
        raise ValueError(f"{raw!r} must be an absolute path (or empty: off)")
    return raw


def plain_dir(raw: str) -> str:
    """A directory whose paths go into ssh and sshd configs (and `ssh -F PATH`)."""
    path(raw)
    if not is_plain_path(raw):
        raise ValueError(
            f"{raw!r} must be an absolute path of letters, digits and "
            "_ . / @ + - only (it is written into ssh and sshd configs)"
        )
    return raw.rstrip("/") or "/"


def seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{raw!r} must be a finite number ≥ 0")
    return value


def bound(raw: str) -> float:
    """0 (off), or at least 3 s: pings go once a second, and a bound must outlast a few."""
    value = seconds(raw)
    if 0 < value < 3:
        raise ValueError(f"{raw!r} must be 0 (off) or at least 3 seconds")
    return value


def positive_seconds(raw: str) -> float:
    value = seconds(raw)
    if value <= 0:
        raise ValueError(f"{raw!r} must be > 0")
    return value


def positive_int(raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{raw!r} must be ≥ 1")
    return value


def boolean(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{raw!r} is not a boolean (true/false)")


def choice(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        low = raw.strip().lower()
        if low not in choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(choices)}")
        return low

    parse.choices = tuple(choices)  # type: ignore[attr-defined]
    return parse


def subset(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        items = tuple(i for i in re.split(r"[,\s]+", raw.strip()) if i)
        if wrong := [i for i in items if i not in choices]:
            raise ValueError(f"{wrong[0]!r} is not one of {', '.join(choices)}")
        return items

    return parse


def domain(raw: str) -> str:
    value = raw.strip().strip(".")
    if not is_dns_name(value):
        raise ValueError(f"{raw!r} is not a DNS domain")
    return value.lower()


def port(raw: str) -> int:
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{raw!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"{raw!r} is not 0..65535")
    return value


def token(raw: str) -> str:
    return tokens.check(raw)


def user(raw: str) -> str:
    if not is_user_name(raw):
        raise ValueError(f"{raw!r} is not a user name")
    return raw


def kex(raw: str) -> str:
    value = raw.strip()
    if not is_kex_list(value):
        raise ValueError(f"{raw!r} is not an OpenSSH KexAlgorithms list (names and commas)")
    return value


def iface(raw: str) -> str:
    if not is_iface_name(raw):
        raise ValueError(f"{raw!r} is not an interface name")
    return raw


def patterns(raw: str) -> tuple[str, ...]:
    """`A,B PREFIX_*`: names, or prefixes ending in '*'; commas or spaces separate."""
    out: list[str] = []
    for item in re.split(r"[,\s]+", raw.strip()):
        if not item:
            continue
        name = item[:-1] if item.endswith("*") else item
        if item != "*" and not is_env_name(name):
            raise ValueError(f"{item!r} is not a variable name, NAME* prefix or *")
        out.append(item)
    return tuple(out)
