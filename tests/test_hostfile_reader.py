"""system/hostfile_reader.py: a hostfile rewritten in place while it is read yields only
whole versions, one that never settles is exit 65, and a settled one is read at once.
(The parser itself: tests/test_hostfile.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpi_bootstrap.core.errors import HostfileError
from mpi_bootstrap.system import hostfile_reader

pytestmark = pytest.mark.timeout(60)


# How long the writer below rests between two rewrites of the hostfile: longer than the
# quiet period the test sets (0.4 s), so whole versions are there to be read.
WRITER_RESTS_S = 0.6


class TestHostfileRewrittenWhileRead:
    """A hostfile rewritten in place, line by line, is never parsed half-written."""

    def test_only_whole_versions_are_parsed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A hostfile rewritten in place while being read yields only whole versions, never a
        half-written host list."""
        # A larger quiet period than the default 0.1 s: a loaded machine may pause the
        # writer mid-rewrite; the property tested is the same.
        monkeypatch.setattr(hostfile_reader, "QUIET_S", 0.4)
        path = tmp_path / "hostfile"
        versions = [[f"pi-worker-{i}.pi.default.svc" for i in range(n)] for n in (3, 7)]
        texts = ["".join(f"{h} slots=1\n" for h in v) for v in versions]
        path.write_text(texts[0])
        # Another process rewrites it in place (truncate, then a line at a time with
        # small gaps), rests (longer than QUIET_S, so that whole versions can be read),
        # and does it again with the other version.
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                """
import sys, time
path, rest, texts = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
n = 0
while True:
    with open(path, "r+") as fh:
        fh.truncate(0)
        for line in texts[n % 2].splitlines(keepends=True):
            fh.write(line)
            fh.flush()
            time.sleep(0.004)
    n += 1
    time.sleep(rest)
""",
                str(path),
                str(WRITER_RESTS_S),
                *texts,
            ]
        )
        try:
            seen = set()
            deadline = time.monotonic() + 8
            reads = 0
            while time.monotonic() < deadline:
                hosts = [h.name for h in hostfile_reader.read(str(path)).hosts]
                assert hosts in versions, f"a half-written hostfile was parsed: {hosts}"
                seen.add(len(hosts))
                reads += 1
            assert seen == {3, 7}, seen  # both versions were read while being rewritten
            assert reads >= 5
        finally:
            writer.kill()
            writer.wait()

    def test_never_settles(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A hostfile that never stops changing gives up after SETTLE_S with exit 65, not a hang."""
        path = tmp_path / "hostfile"
        path.write_text("a slots=1\n")
        monkeypatch.setattr(hostfile_reader, "SETTLE_S", 1.0)
        monkeypatch.setattr(
            hostfile_reader, "QUIET_S", 0.5
        )  # the churn below never pauses that long
        stop = threading.Event()

        def churn() -> None:
            n = 0
            while not stop.is_set():
                path.write_text(f"a slots={n % 9 + 1}\n")
                n += 1
                time.sleep(0.01)

        t = threading.Thread(target=churn, daemon=True)
        t.start()
        try:
            with pytest.raises(HostfileError, match="kept changing while being read") as exc:
                hostfile_reader.read(str(path))
            assert exc.value.status == 65
        finally:
            stop.set()
            t.join()

    def test_old_file_read_at_once(self, tmp_path: Path) -> None:
        """A hostfile not changed lately is read at once, with no quiet-period wait."""
        path = tmp_path / "hostfile"
        path.write_text("a slots=2\n")
        old = time.time() - 60
        os.utime(path, (old, old))
        t0 = time.monotonic()
        assert [h.slots for h in hostfile_reader.read(str(path)).hosts] == [2]
        assert time.monotonic() - t0 < 0.05  # no quiet-period wait for a settled file
