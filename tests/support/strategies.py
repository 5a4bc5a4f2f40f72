"""The fuzz targets' common ground (tests/test_fuzz_*.py, one module per target): the
hypothesis settings profile, and the strategies for what an attacker controls — names,
addresses, users, keys, JSON, exchange records — with the oracles that check them.

The rule, per target: any input gives a valid result or the documented error type (with
its exit code), never another exception; and a writer never emits a line an attacker
controls beyond the validated fields (no newline, no extra ssh option, no option prefix).

Bugs the targets found stay as `@example`s and, for the exchange, as
tests/test_fuzz_exchange_regressions.py.

Run with `--hypothesis-show-statistics` to see how many examples each target ran.
"""

from __future__ import annotations

import base64
import json
import re
import string
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from mpi_bootstrap.core import names, records
from mpi_bootstrap.ssh.netx import Record
from tests.support import resources

# Deterministic (same examples every run, no example database to commit or ignore) and no
# per-example deadline: this 2-core machine is shared with the slow suites.
settings.register_profile(
    "mpi-bootstrap-fuzz",
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
FUZZ = settings.get_profile("mpi-bootstrap-fuzz")


def fuzz(max_examples: int) -> Callable[[Any], Any]:
    """The fuzz profile with `max_examples`, for a test that is then a fuzzer: marked
    `fuzz`, not `unit` (tests/support/resources.py), as its thousands of examples take
    seconds each."""
    profile = settings(FUZZ, max_examples=max_examples)

    def fuzzer(test: Any) -> Any:
        test = profile(test)
        setattr(test, resources.FUZZER, True)
        return test

    return fuzzer


def outcome(label: str) -> None:
    """Count `label` in --hypothesis-show-statistics (how often each path was reached)."""
    if currently_in_test_context():
        event(label)


# ---------------------------------------------------------------- shared strategies

# Pieces an attacker would try in a name, a key or a record field.
NASTY = [
    "\n",
    "\r",
    "\r\n",
    " ",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\u2028",
    "\u00a0",
    "\x00",
    "\x1b",
    '"',
    "'",
    "`",
    ",",
    "#",
    "*",
    "?",
    "!",
    "@",
    "|",
    "%",
    "[",
    "]",
    ":",
    "=",
    "\\",
    "$(id)",
    "ü",
    "\ufeff",
    "\u200b",
    "\udcff",
    "Match all",
    "ProxyCommand sh -c id",
    'command="id"',
    "\n  ProxyCommand sh -c id",
    "\n  LocalCommand id",
    "\nHost *",
    'from="*",no-pty ',
    "%eth0",
    "%\n",
]
KEY_TYPES = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
]
KEY_LINE = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) "
    r"([A-Za-z0-9+/]+={0,3})"
)
NASTY_CHARS = set(string.whitespace) | {'"', "'", "`", ",", "#"}


def inert(text: str) -> bool:
    """No whitespace, control character, quote, comma or '#': safe as one config token."""
    return (
        bool(text)
        and text.isascii()
        and text.isprintable()
        and not any(c in NASTY_CHARS for c in text)
    )


@st.composite
def tainted(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """A value from `base` with a nasty piece inserted somewhere."""
    text = draw(base)
    piece = draw(st.sampled_from(NASTY) | st.text(max_size=3))
    at = draw(st.integers(0, len(text)))
    return text[:at] + piece + text[at:]


# Built from alphabets, not from_regex: several times faster to draw.
LDH = string.ascii_lowercase + string.digits
labels = st.builds(
    lambda a, rest: (a + rest).rstrip("-"), st.sampled_from(LDH), st.text(LDH + "-", max_size=15)
)
long_labels = st.builds(
    lambda n, k: ".".join(["a" * n] * k), st.integers(61, 64), st.integers(1, 5)
)
_plain_names = st.lists(labels, min_size=1, max_size=4).map(".".join)
dns_names = st.one_of(
    _plain_names,
    _plain_names,
    _plain_names,
    st.lists(labels, min_size=1, max_size=4).map(lambda ls: ".".join(ls).upper() + "."),
    long_labels,
)
zones = st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=15)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
zoned = st.builds(lambda a, z: f"{a}%{z}", ipv6, zones | st.sampled_from(NASTY) | st.text())
valid_hosts = st.one_of(dns_names, ipv4, ipv6, zoned)
any_hosts = st.one_of(
    valid_hosts, tainted(valid_hosts), st.text(max_size=30), st.sampled_from(NASTY)
)
users = st.builds(
    lambda a, rest: a + rest,
    st.sampled_from(string.ascii_lowercase + "_"),
    st.text(LDH + "_.-", max_size=31),
)
public_keys = st.builds(
    lambda t, blob: f"{t} {base64.b64encode(blob).decode()}",
    st.sampled_from(KEY_TYPES),
    st.binary(min_size=12, max_size=120),
)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


good_hostnames = st.one_of(dns_names, ipv4, ipv6, st.builds(lambda a, z: f"{a}%{z}", ipv6, zones))


# ---------------------------------------------------------------- exchange records

RECORD_KEYS = {"v", "host", "addresses", "port", "host_key", "user"}
record_dicts = st.builds(
    lambda host, addrs, port, key, user: {
        "v": 1,
        "host": host,
        "addresses": addrs,
        "port": port,
        "host_key": key,
        "user": user,
    },
    st.lists(labels, min_size=1, max_size=3).map(".".join),
    st.lists(st.one_of(ipv4, ipv6, st.builds(lambda a, z: f"{a}%{z}", ipv6, zones)), max_size=3),
    st.integers(1, 65535),
    public_keys,
    users,
)
field_junk = {
    "v": st.sampled_from([2, 0, "1", 1.0, True, None, [1]]),
    "host": st.one_of(
        tainted(dns_names), dns_names.map(lambda n: n.rstrip(".") + "."), ipv4, st.just("a" * 254)
    ),
    "port": st.one_of(
        st.sampled_from([0, 65536, -1, True, 22.0, "22", None, 2**64]), st.integers()
    ),
    "host_key": st.one_of(
        tainted(public_keys),
        public_keys.map(lambda k: k + " me@host"),
        public_keys.map(lambda k: "restrict " + k),
    ),
    "user": st.one_of(tainted(users), st.sampled_from(["", "Root", "a" * 33, "-x"])),
    "addresses": st.one_of(
        st.lists(ipv4, min_size=17, max_size=20),
        st.lists(tainted(ipv4), min_size=1, max_size=2),
        st.lists(zoned, min_size=1, max_size=2),
        ipv4,
        st.just([["10.0.0.1"]]),
        st.just(["fe80::1%\n  X y"]),
    ),
}


# A record's optional list of the interfaces NCCL could use there (core/nccl.py):
# names, plausible and not, duplicates and too many.
IFACE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
iface_lists = st.one_of(
    st.lists(st.from_regex(IFACE_NAME, fullmatch=True), max_size=4),
    st.lists(st.sampled_from(["lo", "eth0", "net1", "net1 ", "a" * 16, "", "x\n", "n;id"])),
    st.lists(st.text(max_size=17), max_size=3),
    st.builds(lambda n: [f"net{i}" for i in range(n)], st.integers(60, 70)),
    st.sampled_from([None, "net1", {"net1": 1}, [1], [["lo"]]]),
)


@st.composite
def near_valid_records(draw: st.DrawFn) -> object:
    """A valid record with (usually) one field broken, dropped, or one added (the
    optional `ifaces` among them)."""
    record: dict[str, Any] = draw(record_dicts)
    field = draw(st.sampled_from(sorted(RECORD_KEYS)))
    how = draw(st.sampled_from(["keep", "junk", "junk", "json", "drop", "extra", "ifaces"]))
    if how == "ifaces":
        record["ifaces"] = draw(iface_lists)
        return record
    if how == "junk":
        record[field] = draw(field_junk[field])
    elif how == "json":
        record[field] = draw(json_values)
    elif how == "drop":
        del record[field]
    elif how == "extra":
        record[draw(st.text(max_size=8))] = draw(json_values)
    return record


def record_is_valid(d: object) -> bool:
    """The record format, written down independently of records.record_from."""
    return (
        isinstance(d, dict)
        and set(d) - {"ifaces"} == RECORD_KEYS
        and ("ifaces" not in d or ifaces_are_valid(d["ifaces"]))
        and type(d["v"]) is int
        and d["v"] == 1
        and isinstance(d["host"], str)
        and names.is_dns_name(d["host"])
        and not d["host"].endswith(".")
        and type(d["port"]) is int
        and 1 <= d["port"] <= 65535
        and isinstance(d["host_key"], str)
        and names.is_public_key(d["host_key"])
        and isinstance(d["user"], str)
        and names.is_user_name(d["user"])
        and isinstance(d["addresses"], list)
        and len(d["addresses"]) <= 16
        and all(isinstance(a, str) and names.is_ip_literal(a) for a in d["addresses"])
    )


def ifaces_are_valid(v: object) -> bool:
    """At most 64 distinct interface names."""
    return (
        isinstance(v, list)
        and len(v) <= 64
        and all(isinstance(n, str) and IFACE_NAME.fullmatch(n) for n in v)
        and len(set(v)) == len(v)
    )


def check_record(record: Record) -> None:
    outcome("Record")
    assert all(inert(x) for x in (record.host, *record.addresses, record.user))
    assert all(inert(x) for x in record.ifaces or ())
    kind, blob = record.host_key.split(" ")
    assert inert(kind) and inert(blob)
    assert type(record.port) is int and 1 <= record.port <= 65535
    assert records.decode(json.dumps(record.to_dict()), "again") == record
