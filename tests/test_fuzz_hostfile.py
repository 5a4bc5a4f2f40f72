"""Fuzz target: the hostfile parser and renderer (core/hostfile.py). The rule every fuzz
target follows, and the shared strategies: tests/support/strategies.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mpi_bootstrap.core import hostfile, names
from mpi_bootstrap.core.errors import ExitStatus, HostfileError
from tests.support.strategies import dns_names, fuzz, good_hostnames, inert, outcome, tainted, zoned

pytestmark = pytest.mark.timeout(120)


HOSTFILE_PATH = "fuzz/hostfile"
_HOSTFILE_WHERE = re.compile(re.escape(HOSTFILE_PATH) + r"(:[0-9]+)?: ")

bad_hostnames = st.sampled_from(
    [
        "-a",
        "a-",
        "a_b",
        "a..b",
        ".a",
        "[::1",
        "::1]",
        "ü.example",
        "a:b:c",
        "",
        "[]",
        "[a]",
        "[::1]x",
        "1.2.3.4.5.6",
        "fe80::1%eth0",
        'fe80::1%a"b,c',
        "a" * 64,
        "*",
        "a.-b",
    ]
)
hostfile_names = st.one_of(*[good_hostnames] * 6, bad_hostnames, zoned, tainted(dns_names))
counts = st.one_of(
    st.integers(1, 999_999_999).map(str),
    st.integers(1, 64).map(str),
    st.integers(0, 10**10).map(str),
    st.sampled_from(["", "-1", "+1", "01", "1.5", "１", "٣", "1e3", "0x10", "0"]),
)
separators = st.sampled_from([" ", "\t", "  \t ", "\u00a0", "\u3000", "\x1f"])
line_ends = st.sampled_from(
    ["\n"] * 6 + ["\r\n"] * 3 + ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", ""]
)
option_keys = st.sampled_from(
    ["slots", "count", "cpu", "max_slots", "max-slots", "SLOTS", "Max_Slots", "bogus", ""]
)


# The valid shapes are listed twice: most lines should be right, so a file often is.
LINE_SHAPES = [
    *[
        "{name}",
        "{name}{sep}slots={n}",
        "{name}:{n}",
        "[{name}]:{n}",
        "[{name}]",
        "{name}{sep}slots={n}{sep}max_slots={m}",
        "{name}{sep}{key}={n}",
        "",
        "#{name}",
    ]
    * 2,
    "{name}{sep}max-slots={m}{sep}count={n}",
    "[{name}]{sep}slots={n}",
    "{name}:{n}{sep}slots={m}",
    "{name}{sep}slots",
    "{name}{sep}{name}",
    "text",
]


# Shapes of a right line for any name (hydra's `name:N` needs a name without ':').
CLEAN_SHAPES = [
    "{name}",
    "{name}{sep}slots={n}",
    "[{name}]:{n}",
    "[{name}]",
    "{name}{sep}slots={n}{sep}max_slots={m}",
    "{name}{sep}count={n}",
    "{name}{sep}cpu={n}{sep}max-slots={m}",
    "",
    "#{name}",
]


@st.composite
def hostfile_lines(draw: st.DrawFn, earlier: list[str], clean: bool) -> str:
    """One line; a `clean` line is always right (so whole files often are)."""
    name = draw(good_hostnames if clean else hostfile_names)
    if earlier and not clean and draw(st.integers(0, 4)) == 0:  # a duplicate, maybe
        name = draw(st.sampled_from(earlier))  # spelt differently
        name = draw(st.sampled_from([name, name.upper(), name.rstrip(".") + "."]))
    earlier.append(name)
    sep = draw(separators)
    shape = draw(st.sampled_from(CLEAN_SHAPES if clean else LINE_SHAPES))
    if shape == "text":
        line = draw(st.text(max_size=20))
    elif clean:
        n = draw(st.integers(1, 999_999_999))
        line = shape.format(name=name, sep=sep, n=n, m=n + draw(st.integers(0, 10)))
    else:
        line = shape.format(
            name=name,
            sep=sep,
            n=draw(counts),
            key=draw(option_keys),
            m=draw(counts) if "{m}" in shape else "",
        )
    if draw(st.booleans()):
        line = draw(separators) + line + draw(separators)
    if draw(st.integers(0, 3)) == 0:
        line += draw(st.sampled_from(["#", " # two GPUs", "\t#x slots=1", "#\u2028b"]))
    return line


@st.composite
def hostfiles(draw: st.DrawFn) -> bytes | str:
    """Near-valid hostfiles: the three forms, comments, CRLF, BOM, v6, duplicates. Half
    are made of right lines only, so parsing succeeds often and the round trip is checked."""
    clean = draw(st.booleans())
    earlier: list[str] = []
    lines = draw(st.lists(hostfile_lines(earlier, clean), max_size=8))
    text = "".join(line + draw(line_ends) for line in lines)
    if draw(st.booleans()):
        text = "\ufeff" + text
    encoding = draw(
        st.sampled_from(
            ["str", "utf-8"] if clean else ["str", "str", "utf-8", "utf-8", "utf-8", "corrupt"]
        )
    )
    if encoding == "str":
        return text
    data = text.encode("utf-8", "surrogatepass")
    if encoding == "corrupt":
        at = draw(st.integers(0, len(data)))
        data = (
            data[:at]
            + draw(st.sampled_from([b"\xff", b"\x00", b"\xc3", b"\xed\xa0\x80"]))
            + data[at:]
        )
    return data


def check_hostfile(data: bytes | str) -> None:
    try:
        parsed = hostfile.parse(data, HOSTFILE_PATH)
    except HostfileError as exc:
        outcome("HostfileError")
        assert exc.status == ExitStatus.HOSTFILE == 65
        assert _HOSTFILE_WHERE.match(exc.message), exc.message
        assert "\n" not in exc.message and "\r" not in exc.message
        return
    hosts = parsed.hosts
    outcome("parsed")
    assert hosts
    seen: set[str] = set()
    for h in hosts:
        assert names.is_host(h.name) and inert(h.name), h
        assert type(h.slots) is int and h.slots >= 1
        assert h.max_slots is None or h.max_slots >= h.slots
        key = h.name.lower().rstrip(".")
        assert key not in seen
        seen.add(key)
    for form in (hostfile.OPENMPI, hostfile.HYDRA):
        text = hostfile.render(hosts, form)
        assert text.count("\n") == len(text.splitlines()) == len(hosts)
        again = hostfile.parse(text, "rendered").hosts
        assert [(h.name, h.slots) for h in again] == [(h.name, h.slots) for h in hosts]
        if form == hostfile.OPENMPI:
            assert [h.max_slots for h in again] == [h.max_slots for h in hosts]


class TestHostfileFuzz:
    """Any hostfile content parses to valid, re-renderable hosts or is a HostfileError (65)."""

    @fuzz(1500)
    @given(st.binary(max_size=400))
    @example(b"a slots=1\n\xff")
    @example(b"a\n\x00b\n")
    def test_bytes(self, data: bytes) -> None:
        """Any bytes (invalid UTF-8 and NULs included) give valid, re-renderable hosts or a
        one-line HostfileError (65) naming where, never another exception."""
        check_hostfile(data)

    @fuzz(1500)
    @given(st.text(max_size=400))
    def test_text(self, text: str) -> None:
        """Any text gives valid, re-renderable hosts or a HostfileError (65), nothing else."""
        check_hostfile(text)

    @fuzz(1500)
    @given(hostfiles())
    # ipaddress accepts any text after '%': before names.py checked the zone, this was
    # a host named 'fe80::1%a"b,c' (a quote and a comma in a written hostfile).
    @example('fe80::1%a"b,c slots=1\n')
    @example("[fe80::1%eth0]:2\nFE80::2 slots=3 max_slots=4\r\n")
    @example("\ufeffa:999999999\r\nA.\n")
    @example("a" * 63 + "." + ("b" * 63 + ".") * 3)
    def test_grammar(self, data: bytes | str) -> None:
        """Near-valid hostfiles (three forms, CRLF, BOM, IPv6 zones, duplicates) give unique, inert
        hosts that round-trip through both renderings, or a HostfileError (65)."""
        check_hostfile(data)
