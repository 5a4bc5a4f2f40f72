"""The data check served by a worker's resident PID 1 (pid1/dataserve.py, on its control
FIFO: pid1/control.py): the session's own shell command (ssh/datacheck.py) against a real
resident supervisor, on loopback, with no Python on the session's PATH. Also what PID 1
refuses (lines it cannot read, links, files that are not FIFOs), the alarm that ends a
request nobody picks up, a session no PID 1 serves, and the sshd versions that can name
the FIFO to a session (`SetEnv`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpi_bootstrap.core.remote import CONTROL_ENV
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.pid1 import dataserve
from mpi_bootstrap.ssh import datacheck, sshd
from mpi_bootstrap.system.files import make_fifo
from tests.support import logs
from tests.support.probes import answers, ask
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(60)
SLEEP = ("--", "sleep", "300")  # the supervisor's main child
CONTROL = "control"


class Served:
    """A resident supervisor serving the request FIFO of a private state directory."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.state.mkdir(mode=0o700)
        self.fifo = make_fifo(str(self.state / CONTROL))
        self.log = tmp / "pid1.log"
        self.bin = tmp / "bin"  # the session's PATH: sh's helpers, and no python3
        self.bin.mkdir()
        for tool in ("cat", "mkfifo"):
            (self.bin / tool).symlink_to(f"/bin/{tool}")
        with self.log.open("w") as err:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "mpi_bootstrap.pid1", "--data-probe", self.fifo, *SLEEP],
                stderr=err,
                env={"PATH": "/usr/bin:/bin"},
            )

    def started(self) -> bool:
        assert self.p.poll() is None, self.log.read_text()
        return logs.event(self.log.read_text(), "child started", partial=True) is not None
        wait_until(self.started, 10, "the supervisor's child")

    def session(self, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """The launcher's command for one session, as a worker's sshd would run it."""
        cmd = datacheck.session_command("lo", "/sys", time.monotonic() + 15)
        env = env if env is not None else {CONTROL_ENV: self.fifo}
        return subprocess.Popen(
            ["/bin/sh", "-c", cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": str(self.bin), **env},
        )

    def request(self, line: str) -> None:
        with open(self.fifo, "w") as fh:
            fh.write(line + "\n")

    def events(self, name: str) -> list[logs.Event]:
        return [e for e in logs.events(self.log.read_text(), partial=True) if e["event"] == name]

    def close(self) -> None:
        self.p.terminate()
        self.p.wait(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    try:
        yield s
    finally:
        s.close()


def end(p: subprocess.Popen[str]) -> int:
    assert p.stdin is not None
    p.stdin.close()
    return p.wait(timeout=10)


class TestServedSessions:
    """Two sessions served by PID 1 probe each other, as the program itself would."""

    def test_two_sessions_and_a_closed_port(self, served: Served) -> None:
        """Each session reports lo and its port, reaches the other at the MTU asked for and
        finds a closed port refused; closing stdin ends it (exit 0) and its copy, and no
        FIFO of theirs is left. PID 1 forked one copy per session and is still running."""
        a, b = served.session(), served.session()
        assert a.stdout is not None and b.stdout is not None
        fa, fb = json.loads(a.stdout.readline()), json.loads(b.stdout.readline())
        assert fa["nic"] == "lo" and "127.0.0.1" in fa["addresses"] and fa["port"] != fb["port"]
        ask(a, [f"b=127.0.0.1:{fb['port']}:1500", "closed=127.0.0.1:1:1500"])
        ask(b, [f"a=127.0.0.1:{fa['port']}:9000"])
        got = answers(a, 2)
        assert (got[0]["ok"], got[0]["reaches"]) == (True, 1500)
        assert (got[1]["ok"], got[1]["kind"]) == (False, "refused")
        assert answers(b, 1)[0]["reaches"] == 9000
        assert (end(a), end(b)) == (0, 0)
        assert sorted(os.listdir(served.state)) == [CONTROL]
        assert len(served.events("data probe served")) == 2 and served.p.poll() is None

    def test_without_the_fifo_it_says_so(self, served: Served) -> None:
        """A session whose sshd names no FIFO (an sshd without SetEnv), or one nobody
        serves, says so in its first line (the launcher leaves that worker out of the
        check, and says so), and exits 0; nothing is served."""
        for env in ({}, {CONTROL_ENV: str(served.state / "gone")}):
            p = served.session(env)
            assert p.stdout is not None and p.stdout.readline() == datacheck.UNSERVED + "\n"
            assert end(p) == 0
        assert served.events("data probe served") == []

    def test_a_copy_is_an_ordinary_child(self, served: Served) -> None:
        """A copy takes signals at their default: SIGTERM ends it (and its session), and PID
        1 neither takes the signal for its own (nothing forwarded, its child still runs)
        nor stops serving; it reaps the copy."""
        a = served.session()
        assert a.stdout is not None and json.loads(a.stdout.readline())["nic"] == "lo"
        copy = int(served.events("data probe served")[0]["pid"])
        os.kill(copy, signal.SIGTERM)  # while its session is still open
        wait_until(lambda: not Path(f"/proc/{copy}").exists(), 10, "the copy ended, reaped")
        assert end(a) == 0 and a.stdout.read() == ""
        b = served.session()
        assert b.stdout is not None and json.loads(b.stdout.readline())["nic"] == "lo"
        assert end(b) == 0 and served.p.poll() is None
        assert served.events("signal forwarded") == []


class TestRefused:
    """What PID 1 will not act on, and what ends a request nobody picks up."""

    @pytest.mark.parametrize(
        "words",
        [
            "lo 20 /sys",  # no PID
            "lo 20 /sys 12 extra",
            "lo;id 20 /sys 12",
            "lo 61 /sys 12",  # longer than any session
            "lo nan /sys 12",
            "lo 20 sys 12",  # not an absolute path
            "lo 20 /sys -12",
            "lo 20 /sys 0x1f",
            "l\u00f6 20 /sys 12",
        ],
    )
    def test_parse(self, words: str) -> None:
        """Words that are not exactly `NIC SECONDS SYSFS PID` (a NIC name, 0 < SECONDS
        <= 60, a plain absolute path, a PID) are refused; the control parses."""
        assert dataserve.parse(words.split(" ")) is None
        assert dataserve.parse(["net1", "20", "/sys", "12"]) == ("net1", 20.0, "/sys", 12)

    def test_bad_lines_then_a_good_session(self, served: Served) -> None:
        """Lines PID 1 cannot read are logged and dropped; it serves the next session."""
        served.request("probe lo 20 /sys\n\xff\xfe garbage\nsession lo 20 /sys 1")
        wait_until(lambda: len(served.events("control refused")) == 3, 10, "3 refusals")
        p = served.session()
        assert p.stdout is not None and json.loads(p.stdout.readline())["nic"] == "lo"
        assert end(p) == 0 and served.p.poll() is None

    def test_links_and_plain_files_not_opened(self, served: Served, tmp_path: Path) -> None:
        """A request whose FIFOs are links (to a file it would write) or plain files: the
        copy opens nothing through a link, writes nothing, and removes the names."""
        victim = tmp_path / "victim"
        victim.write_text("untouched\n")
        (served.state / "probe-4242.in").symlink_to(victim)
        (served.state / "probe-4242.out").symlink_to(victim)
        (served.state / "probe-4243.in").write_text("")
        (served.state / "probe-4243.out").write_text("")
        served.request("probe lo 20 /sys 4242")
        served.request("probe lo 20 /sys 4243")
        wait_until(lambda: sorted(os.listdir(served.state)) == [CONTROL], 10, "no names")
        assert victim.read_text() == "untouched\n" and served.p.poll() is None

    def test_alarm_ends_an_abandoned_request(self, served: Served) -> None:
        """FIFOs that no session ever opens (it died after writing its request): the copy
        blocked on them ends at the alarm, SECONDS + ALARM_SLACK, and removes them."""
        for end_ in ("in", "out"):
            os.mkfifo(served.state / f"probe-4244.{end_}", 0o600)
        served.request("probe lo 1 /sys 4244")
        wait_until(lambda: served.events("data probe served"), 10, "the request read")
        assert len(os.listdir(served.state)) == 3  # the copy waits on them
        wait_until(
            lambda: sorted(os.listdir(served.state)) == [CONTROL],
            1 + dataprobe.ALARM_SLACK + 5,
            "the names removed at the alarm",
        )
        assert served.p.poll() is None


class TestSshdVersion:
    """sshd_config's SetEnv exists from OpenSSH 8.7; an older sshd refuses the whole file."""

    def test_this_sshd_takes_it(self) -> None:
        """Debian's sshd says its version to `-V` and is new enough."""
        found = sshd.version("/usr/sbin/sshd")
        assert found is not None and found >= (9, 0)
        assert sshd.takes_setenv(found)

    @pytest.mark.parametrize(
        ("says", "takes"),
        [
            ("sshd: illegal option -- V\nOpenSSH_8.4p1 Debian-5+deb11u3, OpenSSL 1.1.1w", False),
            ("OpenSSH_8.7p1, OpenSSL 3.0.7", True),
            ("OpenSSH_10.0p2", True),
            ("no version here", False),
        ],
    )
    def test_older_or_unknown_is_left_without(self, tmp_path: Path, says: str, takes: bool) -> None:
        """An sshd before 8.7 (which names its version only in its usage message), or one
        that names none, gets no SetEnv: its sessions start Python for the check instead."""
        fake = tmp_path / "sshd"
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{says}' >&2\nexit 1\n")
        fake.chmod(0o755)
        assert sshd.takes_setenv(sshd.version(str(fake))) is takes
