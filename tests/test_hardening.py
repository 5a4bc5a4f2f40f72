"""Unit tests of the hardening pieces, each against the real thing it guards: files
written atomically under a failure or a signal, the state directory's checks, the
interruptible fan-out, children stopped when the agent ends, capture's timeout with a
grandchild, the non-blocking net exchange server, and the hostfile read while it is
rewritten. No namespaces; each runs in seconds."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mpi_bootstrap.core import records
from mpi_bootstrap.core.errors import ConfigError, HostfileError, WriteError
from mpi_bootstrap.core.names import is_plain_path
from mpi_bootstrap.launcher import preflight
from mpi_bootstrap.proc import children
from mpi_bootstrap.ssh import netserver
from mpi_bootstrap.ssh import netx as exchange
from mpi_bootstrap.system import files, hostfile_reader, parallel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh_proc_state() -> Iterator[None]:
    """end_pending() marks the process as stopping: undo it for the next test."""
    yield
    children._stopping = False
    children._pending.clear()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class TestAtomicWrite:
    """A failed or interrupted write leaves the old file whole and no temporary file."""

    def test_interrupted_mid_write(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A signal mid-write leaves the old ssh_config whole and no temporary file beside it."""
        target = tmp_path / "ssh_config"
        target.write_text("old\n")

        def interrupted(_fd: int) -> None:
            raise children.Interrupted(signal.SIGTERM)

        monkeypatch.setattr(os, "fsync", interrupted)
        with pytest.raises(children.Interrupted):
            files.atomic_write(str(target), "new\n" * 1000, 0o600)
        assert target.read_text() == "old\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ssh_config"]

    def test_disk_full_is_73_naming_the_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A full disk is exit 73 naming the file, still an OSError, and leaves no temp file."""

        def full(_fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(WriteError) as exc:
            files.atomic_write(str(tmp_path / "known_hosts"), "x\n")
        assert exc.value.status == 73
        assert f"cannot write {tmp_path}/known_hosts: No space left on device" in str(exc.value)
        assert isinstance(exc.value, OSError)  # the supervisor's `except OSError` still holds
        assert list(tmp_path.iterdir()) == []


class TestStateDir:
    """The state directory is ours and private, or the agent refuses it (64) or says it
    cannot make it (73)."""

    def test_created_private(self, tmp_path: Path) -> None:
        """A new state directory is created 0700, so no other user can read the keys kept in it."""
        files.state_dir(str(tmp_path / "a" / "state"))
        assert (tmp_path / "a" / "state").stat().st_mode & 0o777 == 0o700

    def test_existing_open_one_made_private(self, tmp_path: Path) -> None:
        """An existing 0755 state directory of ours is narrowed to 0700 before keys go into it."""
        d = tmp_path / "state"
        d.mkdir(mode=0o755)
        files.state_dir(str(d))
        assert d.stat().st_mode & 0o777 == 0o700

    @pytest.mark.parametrize("kind", ["file", "symlink"])
    def test_refused(self, tmp_path: Path, kind: str) -> None:
        """A state dir that is a file or a symlink is refused (64), naming it, so nobody else
        decides where the agent's keys and ssh config land."""
        d = tmp_path / "state"
        if kind == "file":
            d.write_text("")
        else:
            (tmp_path / "elsewhere").mkdir()
            d.symlink_to(tmp_path / "elsewhere")
        self.assert_refused(d)

    def test_other_owners_refused(self, tmp_path: Path, root: None) -> None:
        """Another user's directory is refused (64), naming it (only root can make one)."""
        d = tmp_path / "state"
        d.mkdir(mode=0o777)
        os.chown(d, 1000, 1000)
        self.assert_refused(d)

    @staticmethod
    def assert_refused(d: Path) -> None:
        with pytest.raises(ConfigError) as exc:
            files.state_dir(str(d))
        assert exc.value.status == 64
        assert str(d) in exc.value.message

    def test_cannot_create_is_73(self, tmp_path: Path) -> None:
        """A state directory that cannot be created (a file in its path) is exit 73, not a crash."""
        (tmp_path / "file").write_text("")
        with pytest.raises(WriteError) as exc:
            files.state_dir(str(tmp_path / "file" / "state"))
        assert exc.value.status == 73

    @pytest.mark.parametrize(
        "path", ["/tmp/a b", "relative/dir", "/x\nPasswordAuthentication", "/x'y", ""]
    )
    def test_unsafe_paths_are_not_plain(self, path: str) -> None:
        """Relative, empty, spaced, quoted or multi-line paths are not plain, so none can smuggle a
        directive (e.g. PasswordAuthentication) into the ssh or sshd config written from it."""
        assert not is_plain_path(path)


class TestMapAll:
    """The launcher's fan-out keeps order, raises the first failure, and never makes an
    interrupted agent wait for it."""

    def test_order_and_first_error(self) -> None:
        """The fan-out returns results in input order, raises the failure of the earliest item, and
        maps an empty list to an empty list."""
        assert parallel.map_all(lambda x: x * 2, list(range(50)), 4) == list(range(0, 100, 2))

        def fail(x: int) -> int:
            if x in (3, 7):
                raise ValueError(x)
            return x

        with pytest.raises(ValueError, match="3"):
            parallel.map_all(fail, list(range(10)), 3)
        assert parallel.map_all(fail, [], 3) == []

    def test_interrupted_wait_returns_at_once(self) -> None:
        """A signal during the fan-out raises Interrupted within 2 s, not after slow tasks."""
        release = threading.Event()

        def slow(_x: int) -> None:
            release.wait(30)

        def interrupt() -> None:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGUSR1)

        previous = signal.signal(signal.SIGUSR1, children._raise)
        try:
            threading.Thread(target=interrupt, daemon=True).start()
            t0 = time.monotonic()
            with pytest.raises(children.Interrupted):
                parallel.map_all(slow, list(range(8)), 2)
            assert time.monotonic() - t0 < 2
        finally:
            signal.signal(signal.SIGUSR1, previous)
            release.set()


class TestEndPending:
    """Children the agent started and did not hand off are stopped when it ends, and no
    thread can start a new one afterwards."""

    def test_spawned_children_stopped(self) -> None:
        """When the agent ends, every child it spawned is stopped and no new one can start."""
        pids = [
            children.spawn(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, group=False)
            for _ in range(3)
        ]
        assert children.end_pending(grace=1.0) == 3
        assert not any(alive(p) for p in pids)
        with pytest.raises(children.Interrupted):
            children.spawn(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, group=False)
        with pytest.raises(children.Interrupted):
            children.capture(["true"])

    def test_fan_out_with_more_hosts_than_threads(self) -> None:
        """8 captures, 2 at a time, interrupted: every sleep started is gone."""
        started: list[int] = []
        errors: list[BaseException] = []

        def one(_x: int) -> None:
            try:
                children.capture(["sleep", "30"], timeout=60)
            except BaseException as exc:  # the stop shows up here as Interrupted
                errors.append(exc)

        t = threading.Thread(target=parallel.map_all, args=(one, list(range(8)), 2), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while len(children._pending) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started.extend(children._pending)
        children.end_pending(grace=1.0)
        t.join(timeout=10)
        assert not t.is_alive()
        assert not any(alive(p) for p in started)
        me = str(os.getpid())
        leftovers = subprocess.run(
            ["pgrep", "-P", me, "sleep"], capture_output=True, text=True, check=False
        ).stdout.split()
        assert leftovers == []


class TestCapture:
    """capture's timeout holds even when the program's own child keeps the pipe open."""

    def test_timeout_with_grandchild(self) -> None:
        """capture gives up at its timeout (124, output kept) though a grandchild holds the pipe."""
        t0 = time.monotonic()
        code, out = children.capture(["sh", "-c", "sleep 30 & echo started; wait"], timeout=0.5)
        assert code == 124
        assert "started" in out and "timed out after 0.5 s" in out
        assert time.monotonic() - t0 < 4


class NetLoop:
    """The worker's net exchange served by a loop like the supervisor's, on loopback."""

    TOKEN = "unit-test-token-0123456789abcdef"  # noqa: S105 - a test token

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.readers: dict[int, Callable[[], None]] = {}
        self.authorized: list[str] = []
        record = records.Record("w", ("127.0.0.1",), 2222, "ssh-ed25519 " + "A" * 68, "root")
        server = netserver.NetServer(
            self.TOKEN, record, lambda key, _peer: self.authorized.append(key), lambda *a, **k: None
        )
        netserver.Connections(server, self.listener, self.readers)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import select

        while not self.stop.is_set():
            ready, _, _ = select.select(list(self.readers), [], [], 0.05)
            for fd in ready:
                if fd in self.readers:
                    self.readers[fd]()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.listener.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)


@pytest.fixture
def net() -> Iterator[NetLoop]:
    loop = NetLoop()
    yield loop
    loop.close()


class TestNetServer:
    """The exchange never blocks its loop: silent peers are evicted, a hello without a
    newline is answered at end of stream, an oversized message is denied."""

    KEY = "ssh-ed25519 " + "B" * 68

    def test_silent_peers_do_not_stall_a_real_hello(self, net: NetLoop) -> None:
        """40 silent connections neither delay a real hello past 1 s nor stay open beyond
        MAX_CONNECTIONS: idle peers cannot lock the launcher out of a worker."""
        silent = [net.connect() for _ in range(40)]
        t0 = time.monotonic()
        record = exchange.fetch(
            "127.0.0.1", net.port, net.TOKEN, self.KEY, target="w", deadline=time.monotonic() + 5
        )
        assert record.host == "w"
        assert time.monotonic() - t0 < 1.0
        assert net.authorized == [self.KEY]
        # at most MAX_CONNECTIONS stay open on the server side
        assert len(net.readers) <= netserver.MAX_CONNECTIONS + 1  # + the listener
        for s in silent:
            s.close()

    def test_hello_without_newline_then_eof(self, net: NetLoop) -> None:
        """A hello ended by end of stream instead of a newline is still answered with the record."""
        with net.connect() as s:
            challenge = exchange.read_challenge(s.recv(65536).rstrip(b"\n"), "w")
            hello, nonce = exchange.make_hello(net.TOKEN, self.KEY, "w", challenge)
            s.sendall(hello.rstrip(b"\n"))
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(65536)
        assert exchange.read_reply(reply, net.TOKEN, nonce, "w").port == 2222

    def test_oversized_message_denied(self, net: NetLoop) -> None:
        """A message over MAX_MESSAGE is answered `denied` and authorises no key."""
        with net.connect() as s:
            assert json.loads(s.recv(65536))["type"] == "challenge"
            s.sendall(b"x" * (records.MAX_MESSAGE + 4096))
            reply = s.recv(65536)
        assert json.loads(reply) == {"type": "denied"}
        assert net.authorized == []


class TestPreflightRetry:
    """Only ssh's own failure to connect (exit 255) is worth another try."""

    @pytest.mark.parametrize(
        ("code", "output", "expected"),
        [
            (255, "ssh: connect to host w port 22: Connection refused", True),
            (255, "kex_exchange_identification: read: Connection reset by peer", True),
            (255, "Connection closed by 10.0.0.1 port 2222", True),
            (255, "Host key verification failed.", False),
            (255, "w: Permission denied (publickey).", False),
            (1, "my script printed: connection refused", False),
        ],
    )
    def test_transient(self, code: int, output: str, expected: bool) -> None:
        """Only ssh's own connection failures (255: refused, reset, closed) are retried; a host key
        mismatch, a denied key or the program's own exit code fail at once."""
        assert preflight.transient(code, output) is expected


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
