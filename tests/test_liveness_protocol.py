"""The liveness protocol's pure parts (core/liveness.py) and the typed hand-off spec
(core/spec.py): what a datagram must be to count, what a claim's answer says, and that
what crosses the exec into the resident PID 1 is exactly what was declared."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpi_bootstrap.core import liveness as lv
from mpi_bootstrap.core import spec
from mpi_bootstrap.pid1 import monitor, tree, watch

KEY = secrets.token_hex(32)
OTHER = secrets.token_hex(32)


W0, W1 = lv.worker_key(KEY, "10.250.0.11"), lv.worker_key(KEY, "10.250.0.12")
SID = lv.session_id(KEY)


class TestDatagrams:
    """Only a datagram signed with that worker's key of the session, of our form, counts;
    nothing else raises."""

    def test_round_trip(self) -> None:
        data = lv.encode(W0, SID, "ping", 7)
        sid, msg = lv.session_of(data)  # type: ignore[misc]
        assert sid == SID and msg["t"] == "ping" and msg["n"] == 7
        assert lv.authentic(W0, msg)

    def test_another_sessions_key_does_not_verify(self) -> None:
        other = lv.worker_key(OTHER, "10.250.0.11")
        _, msg = lv.session_of(lv.encode(other, SID, "stop", 9, why="job over"))  # type: ignore[misc]
        assert not lv.authentic(W0, msg)

    def test_another_workers_key_does_not_verify(self) -> None:
        """A pong of worker 1 is no pong of worker 0, and a ping for worker 1 no ping for
        worker 0 (SECURITY.md, promise 36): each worker's datagrams have a key of their
        own, from the session's key and its watch's address."""
        for kind in ("ping", "pong"):
            _, msg = lv.session_of(lv.encode(W1, SID, kind, 9))  # type: ignore[misc]
            assert lv.authentic(W1, msg) and not lv.authentic(W0, msg)

    @pytest.mark.parametrize(
        "change", [{"n": 8}, {"t": "stop"}, {"why": "job over"}, {"b": "0" * 16}, {"mac": "0" * 64}]
    )
    def test_any_change_breaks_the_mac(self, change: dict[str, object]) -> None:
        _, msg = lv.session_of(lv.encode(W0, SID, "ping", 7))  # type: ignore[misc]
        assert not lv.authentic(W0, {**msg, **change})

    @pytest.mark.parametrize(
        "raw",
        [
            b"",
            b"x" * (lv.MAX_DATAGRAM + 1),
            b"[]",
            b'{"v": 1, "t": "ping", "s": "0123456789abcdef", "n": 1}',
            b'{"v": 2, "t": "ping", "s": "short", "n": 1}',
            b'{"v": 2, "t": "ping", "s": "0123456789abcdef", "n": 0}',
            b'{"v": 2, "t": "ping", "s": "0123456789abcdef", "n": true}',
            b'{"v": 2, "t": "ping", "s": "0123456789abcdef", "n": 9007199254740993}',
            b'{"v": 2, "t": 5, "s": "0123456789abcdef", "n": 1}',
            b"[" * 100000,
        ],
    )
    def test_not_ours(self, raw: bytes) -> None:
        assert lv.session_of(raw) is None

    @given(st.binary(max_size=600))
    def test_any_bytes(self, raw: bytes) -> None:
        found = lv.session_of(raw)
        if found is not None:
            assert not lv.authentic(W0, found[1])

    @given(
        st.dictionaries(
            st.text(max_size=5),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                ),
                max_leaves=8,
            ),
            max_size=8,
        )
    )
    def test_any_json(self, body: dict[str, object]) -> None:
        data = json.dumps({"v": lv.VERSION, "t": "ping", "s": SID, "n": 1, **body})
        found = lv.session_of(data.encode())
        if found is not None:
            assert lv.authentic(W0, found[1]) is False or "mac" in body


class TestTiming:
    """The bound: suspect after most of it, confirmed in at most CONFIRM_S of it."""

    @pytest.mark.parametrize(("bound", "suspect"), [(30, 25), (6, 4), (3, 2)])
    def test_split(self, bound: float, suspect: float) -> None:
        t = lv.Timing(bound)
        assert t.suspect_after == suspect and t.suspect_after + t.confirm == bound


class TestClaimAnswer:
    """The worker's answer to a claim, as its PID 1 writes it and preflight reads it."""

    def test_round_trip(self) -> None:
        c = lv.Claimed("10.250.0.11", 40000, "0123456789abcdef", 2222, 3, ("orted", "python"))
        assert lv.parse_claimed(lv.claimed_text(c)) == c

    @pytest.mark.parametrize(
        "text",
        [
            "none",
            "",
            "addr=10.0.0.1 port=0 boot=0123456789abcdef sshd=22 ended=0 names=",
            "addr=10.0.0.1 port=1 boot=0123456789abcdef sshd=70000 ended=0 names=",
            "addr=10.0.0.1 port=1 boot=XYZ sshd=22 ended=0 names=",
            "addr=10.0.0.1;rm port=1 boot=0123456789abcdef sshd=22 ended=0 names=",
            "addr=10.0.0.1 port=1 boot=0123456789abcdef sshd=22 ended=0 names=a b",
        ],
    )
    def test_anything_else_is_said_not_taken(self, text: str) -> None:
        assert isinstance(lv.parse_claimed(text), str)

    def test_names_are_words_only(self) -> None:
        c = lv.Claimed("::1", 1, "0123456789abcdef", 22, 2, ("ok", "bad name\nx", "x" * 65))
        assert lv.parse_claimed(lv.claimed_text(c)).names == ("ok",)  # type: ignore[union-attr]

    def test_the_key_line(self) -> None:
        """The key and the launcher's bound, one line; nothing else is ever written."""
        assert lv.claim_line(KEY, 30.0) == KEY + " 30\n"
        with pytest.raises(ValueError):
            lv.claim_line("not a key\nclaim x 1", 30.0)
        with pytest.raises(ValueError):
            lv.claim_line(KEY, -1)


class TestSpec:
    """The hand-off spec crosses the exec whole, and anything not as declared is refused
    naming the field."""

    def full(self) -> spec.Spec:
        return spec.Spec(
            argv=("mpirun", "-np", "2"),
            env={"PATH": "/bin"},
            role="launcher",
            grace=2,
            inherited=(13,),
            adopt=42,
            stderr_fd=5,
            restart=spec.Restart(5, 60.0),
            stop=spec.Marker("/x/job-done", "done\n"),
            termination=spec.Termination("/dev/termination-log", False),
            net=spec.NetExchange(3, "t" * 16, {"host": "a", "port": 1}, "/s/ak", ("k1",)),
            monitor=spec.Monitor(
                KEY,
                30.0,
                "10.0.0.1",
                (spec.Peer("w0", "10.0.0.2", 4000, "0123456789abcdef", 2222),),
            ),
            control="/s/control",
            watch=spec.Watch("10.0.0.2", 2222, 30.0, False),
        )

    def test_round_trip(self) -> None:
        s = self.full()
        assert spec.decode(spec.encode(s)) == dataclasses.replace(s, grace=2.0)

    def test_secrets_not_in_repr(self) -> None:
        assert KEY not in repr(self.full()) and "t" * 16 not in repr(self.full())

    @pytest.mark.parametrize(
        ("change", "where"),
        [
            ({"grace": "10"}, "Spec.grace"),
            ({"adopt": 1.5}, "Spec.adopt"),
            ({"argv": "mpirun"}, "Spec.argv"),
            (
                {"monitor": {"key": KEY, "bound": 1, "bind": "x", "peers": [{"name": 1}]}},
                "Spec.monitor.peers[0]",
            ),
            ({"typo": 1}, "unknown fields"),
        ],
    )
    def test_not_as_declared(self, change: dict[str, object], where: str) -> None:
        raw = {**json.loads(spec.encode(self.full())), **change}
        with pytest.raises(ValueError, match=where.replace("[", r"\[").replace("]", r"\]")):
            spec.decode(json.dumps(raw))


class TestVerdict:
    """How mpirun's end reads (pid1/verdict.py, core/termination.py): a lost worker in
    mpirun's words is a lost worker, never a start-up failure; Open MPI 5's 0 after it
    lost a daemon is no success; a code above 128 is a signal only if it was one."""

    CAPTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "mpirun-failures"

    def read(self, code: int, name: str) -> tuple[int, object, bytes]:
        from mpi_bootstrap.pid1.verdict import Verdict

        written: list[bytes] = []
        out = type("Out", (), {"write": lambda _self, b: written.append(b)})()
        v = Verdict()
        text = (self.CAPTURES / name).read_bytes()
        got = v.read(code, text, lambda: False, out, lambda *a, **k: None)  # type: ignore[arg-type]
        return got, v, b"".join(written)

    def test_open_mpi_4(self) -> None:
        code, v, said = self.read(205, "openmpi4-worker-lost.txt")
        assert code == 205 and v.host == "job-worker-1"  # type: ignore[attr-defined]
        assert b"lost job-worker-1 while the job ran" in said and b"did not start" not in said

    def test_open_mpi_5_exits_0(self) -> None:
        code, v, said = self.read(0, "openmpi5-worker-lost.txt")
        assert code == 75 and v.host == "job-worker-1"  # type: ignore[attr-defined]
        assert b"mpirun exited 0, but it lost a worker" in said

    def test_a_plain_success_stays(self) -> None:
        assert self.read(0, "openmpi4-unrelated-exit-3.txt")[0] == 0

    def test_no_signal_77(self) -> None:
        from mpi_bootstrap.core import termination

        own = termination.text(role="launcher", code=205, phase="mpirun", error="x", signaled=False)
        assert "exit 205 (mpirun's own exit code)" in own and "signal" not in own
        killed = termination.text(role="launcher", code=137, phase="mpirun", error="x")
        assert "exit 137 (ended by SIGKILL)" in killed


class TestReplySweep:
    """A claim's session that ended mid-claim leaves its reply FIFO behind; the watch
    removes it at the next claim, and once a launch it ends is gone (a session the next
    claim ended was alive at its sweep: tests/test_soak.py counts the state files)."""

    def test_only_the_gone_sessions(self, tmp_path: Path) -> None:
        gone, here = tmp_path / "control-999999999.out", tmp_path / f"control-{os.getpid()}.out"
        for fifo in (gone, here):
            os.mkfifo(fifo, 0o600)
        (tmp_path / "control").write_text("")  # the control FIFO itself: never swept
        watch.sweep(str(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["control", here.name]


class TestEndedNote:
    """The line a worker's PID 1 writes on a session it ends goes to that session's pipe
    only (pid1/tree.py `say`): a process whose stderr is a file, which PID 1 might write
    where the process may not, gets nothing."""

    def test_pipe_only(self, tmp_path: Path) -> None:
        import subprocess

        victim = tmp_path / "victim"
        victim.write_text("untouched\n")
        with victim.open("rb") as ro:  # read-only: the process could not write it
            on_file = subprocess.Popen(["sleep", "30"], stderr=ro)
        on_pipe = subprocess.Popen(["sleep", "30"], stderr=subprocess.PIPE)
        try:
            tree.say(on_file.pid, b"ended\n")
            tree.say(on_pipe.pid, b"ended\n")
            assert victim.read_text() == "untouched\n"
            assert on_pipe.stderr is not None and on_pipe.stderr.readline() == b"ended\n"
        finally:
            for p in (on_file, on_pipe):
                p.kill()
                p.wait()


class TestSilentLauncher:
    """The worker's watch, driven as the resident's loop drives it: asleep until its
    `next_at`, with nothing else to wake it (the net and secret exchanges have no job-done
    poll). A launcher that falls silent is lost at the bound: the watch wakes often enough
    to tell its own pod's stop from the launcher's silence. It woke only at the bound
    before, took each wake-up for a stop of its own pod, and never lost the launcher
    (`make chaos`: a launcher cut off, no worker ended its ranks)."""

    def test_lost_at_the_bound(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from mpi_bootstrap.pid1.control import Control

        fifo = tmp_path / "control"
        os.mkfifo(fifo, 0o600)
        clock = [1000.0]
        monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
        said: list[str] = []
        control = Control(str(fifo), lambda event, /, **_: said.append(event), {})
        w = watch.WatchService(
            spec.Watch("127.0.0.1", 22, grace=5.0, exit_on_loss=False),
            lambda event, /, **_: said.append(event),
            {},
            control,
            sshd=lambda: 0,
            stop=lambda why, code: None,
        )
        try:
            w.bound = 10.0  # the launcher's, from its claim
            w.heard_from(clock[0])  # the launcher's ping: armed
            while w.lost_at is None and clock[0] < 1000.0 + 60:
                at = w.next_at()
                assert at is not None
                clock[0] = at
                w.tick(at)
            assert w.lost_at == pytest.approx(1010.0, abs=1.5) and "launcher lost" in said
        finally:
            w.udp.close()
            os.close(control.fd)


class TestControlFraming:
    """The control FIFO's lines are whole writes: bytes another writer left without a
    newline (security review 5, finding 5b: one byte glued to a new launcher's claim,
    which was refused and never answered) cannot spoil the next request."""

    def test_a_stray_write_does_not_eat_the_next_request(self, tmp_path: Path) -> None:
        from mpi_bootstrap.pid1.control import Control

        fifo = tmp_path / "control"
        os.mkfifo(fifo, 0o600)
        said: list[str] = []
        control = Control(str(fifo), lambda event, /, **_: said.append(event), {})
        got: list[list[str]] = []
        control.verbs["claim"] = lambda words: got.append(words) or None
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(writer, b"X")
            control.read()
            os.write(writer, b"claim KEY 30 1234\n")
            control.read()
            os.write(writer, b"junkclaim K2 30 99\n")
            control.read()
        finally:
            os.close(writer)
            os.close(control.fd)
        assert got == [["KEY", "30", "1234"], ["K2", "30", "99"]]
        assert said.count("control resynced") == 2


class TestRoundTrips:
    @given(st.lists(st.floats(min_value=0, max_value=3), min_size=1, max_size=200))
    def test_quantiles_by_the_ms(self, seconds: list[float]) -> None:
        """The monitor's round trips (pid1/monitor.py): p50 and p99 within a ms of the
        samples' own, a second or more counted as 1000 ms."""
        trips = monitor._RoundTrips()
        for s in seconds:
            trips.add(s)
        ms = sorted(min(int(s * 1000), 1000) for s in seconds)
        assert trips.count() == len(seconds)
        for q in (0.5, 0.99):
            assert trips.quantile(q) == next(m for i, m in enumerate(ms) if i + 1 >= q * len(ms))
