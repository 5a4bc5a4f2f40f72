"""DNS wait: concurrency, pacing, the deadline, and error kinds (resolver faked here;
the real dnsmasq runs in the benchmarks and in the cluster tests)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from mpi_bootstrap.core import model
from mpi_bootstrap.system import dns

# When the late record appears, after the first round: long enough for the wait to re-ask
# the missing name several times first, so that its pacing can be measured.
LATE_RECORD_AFTER_S = 0.6


class FakeResolver:
    """Answers from a table that tests change while the wait runs; counts calls."""

    def __init__(self, present: set[str], delay: float = 0.0) -> None:
        self.present = set(present)
        self.delay = delay
        self.calls: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def __call__(self, name: str) -> model.Answer:
        with self.lock:
            self.calls.append((time.monotonic(), name))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                time.sleep(self.delay)
            if name in self.present:
                return model.Answer(name, addresses=("10.9.9.9",))
            return model.Answer(
                name, error_kind=model.NOT_FOUND, detail="Name or service not known"
            )
        finally:
            with self.lock:
                self.active -= 1

    def count(self, name: str) -> int:
        return sum(1 for _, n in self.calls if n == name)


class TestWait:
    """wait_for resolves every name, never re-asks a resolved one, and keeps to its budget."""

    def test_one_round_when_all_resolve(self) -> None:
        """When every name resolves, each is looked up exactly once: no extra load on DNS."""
        names = [f"h{i}" for i in range(50)]
        fake = FakeResolver(set(names))
        result = dns.wait_for(names, lookup=fake, deadline=5, interval=3)
        assert result.ok
        assert result.lookups == 50
        assert sorted(n for _, n in fake.calls) == sorted(names)

    def test_duplicates_asked_once(self) -> None:
        """A host listed several times is looked up only once."""
        fake = FakeResolver({"a"})
        result = dns.wait_for(["a", "a", "a"], lookup=fake, deadline=5, interval=3)
        assert result.lookups == 1

    def test_concurrency_bound(self) -> None:
        """No more lookups run at once than the concurrency limit, and they do run in parallel."""
        names = [f"h{i}" for i in range(40)]
        fake = FakeResolver(set(names), delay=0.02)
        dns.wait_for(names, lookup=fake, deadline=5, interval=3, concurrency=4)
        assert fake.max_active <= 4
        assert fake.max_active >= 2  # lookups did overlap

    def test_late_record_found_quickly_and_resolved_not_asked_again(self) -> None:
        """A record that appears late is found within 0.5 s, resolved names are not asked again, and
        the re-asking keeps to the 20/s budget."""
        names = [f"h{i}" for i in range(8)]
        fake = FakeResolver(set(names[:7]))
        appeared: list[float] = []

        def add_late() -> None:
            time.sleep(LATE_RECORD_AFTER_S)  # the fake DNS server's schedule, not a wait
            appeared.append(time.monotonic())
            fake.present.add("h7")

        t = threading.Thread(target=add_late)
        t.start()
        result = dns.wait_for(names, lookup=fake, deadline=10, interval=3)
        done = time.monotonic()
        t.join()
        assert result.ok
        assert all(fake.count(n) == 1 for n in names[:7])
        # Budget max(20, 8/3) = 20/s: the late host is re-asked about every 50 ms.
        assert done - appeared[0] < 0.5
        after_first_round = [c for c, _ in fake.calls[8:]]
        if len(after_first_round) >= 2:
            span = after_first_round[-1] - after_first_round[0]
            assert (len(after_first_round) - 1) / span <= 20 * 1.25

    def test_budget_scales_with_hosts(self) -> None:
        """The re-poll budget is at least 20/s and grows to hosts/interval for large jobs."""
        assert dns.lookup_rate(8, 3) == 20
        assert dns.lookup_rate(4096, 3) == pytest.approx(4096 / 3)

    def test_deadline(self) -> None:
        """A name that never resolves ends the wait at the deadline as NOT_FOUND, asked at a
        paced rate, not in a busy loop."""
        fake = FakeResolver({"a"})
        start = time.monotonic()
        result = dns.wait_for(["a", "b"], lookup=fake, deadline=0.5, interval=3)
        elapsed = time.monotonic() - start
        assert not result.ok
        assert result.unresolved == ("b",)
        assert result.answers["b"].error_kind == model.NOT_FOUND
        assert 0.45 <= elapsed < 1.5
        # paced: about 20 per second, not a busy loop
        assert fake.count("b") <= 0.5 * 20 + 3

    def test_zero_deadline_is_one_round(self) -> None:
        """A zero deadline asks each name once and reports the missing one, without retrying."""
        fake = FakeResolver({"a"}, delay=0.05)
        result = dns.wait_for(["a", "b"], lookup=fake, deadline=0, interval=3)
        assert result.lookups == 2
        assert result.unresolved == ("b",)

    def test_stuck_lookup_does_not_hold_the_deadline(self) -> None:
        """A lookup that hangs does not hold the wait past its deadline; it is TEMPORARY."""
        fake = FakeResolver(set(), delay=5)
        start = time.monotonic()
        result = dns.wait_for(["slow"], lookup=fake, deadline=0.3, interval=3)
        assert time.monotonic() - start < 1.5
        assert result.answers["slow"].error_kind == model.TEMPORARY
        assert "no answer before the deadline" in result.answers["slow"].detail

    def test_lookup_exception_is_an_answer(self) -> None:
        """A resolver that raises gives an OTHER answer instead of crashing the wait."""

        def broken(name: str) -> model.Answer:
            raise RuntimeError("boom")

        result = dns.wait_for(["a"], lookup=broken, deadline=0, interval=3)
        assert result.answers["a"].error_kind == model.OTHER

    def test_on_answer_in_order(self) -> None:
        """on_answer sees each name's first answer with no previous one, then a name that
        resolves on a later round with its earlier failure as the previous answer."""
        seen: list[tuple[str, bool, bool | None]] = []
        fake = FakeResolver({"a"})

        def lookup(name: str) -> model.Answer:
            answer = fake(name)
            fake.present.add(name)  # every name resolves from its second lookup on
            return answer

        dns.wait_for(
            ["a", "b"],
            lookup=lookup,
            deadline=5,
            interval=0.05,
            on_answer=lambda a, prev: seen.append(
                (a.name, a.ok, None if prev is None else prev.ok)
            ),
        )
        assert sorted(seen[:2]) == [("a", True, None), ("b", False, None)]
        assert seen[2:] == [("b", True, False)]


class TestSystemResolver:
    """getaddrinfo errors are sorted into kinds; transient ones are named as such."""

    @pytest.mark.parametrize(
        ("errno", "kind"),
        [
            (socket.EAI_NONAME, model.NOT_FOUND),
            (socket.EAI_AGAIN, model.TEMPORARY),
            (socket.EAI_FAIL, model.SERVER_FAILURE),
            (socket.EAI_SERVICE, model.OTHER),
        ],
    )
    def test_kinds(self, tmp_path: Path, mocker: MockerFixture, errno: int, kind: str) -> None:
        """Each getaddrinfo error maps to its kind (not found, temporary, server failure,
        other), and only the transient kinds are marked transient."""
        conf = tmp_path / "resolv.conf"
        conf.write_text("search a.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n")
        mocker.patch("socket.getaddrinfo", side_effect=socket.gaierror(errno, "msg"))
        answer = dns.SystemResolver(str(conf))("x")
        assert answer.error_kind == kind
        assert answer.transient == (kind in model.TRANSIENT_KINDS)

    def test_no_nameserver(self, tmp_path: Path, mocker: MockerFixture) -> None:
        """A temporary failure with no nameserver in resolv.conf is reported as NO_NAMESERVER."""
        conf = tmp_path / "resolv.conf"
        conf.write_text("search svc.cluster.local\n")
        mocker.patch("socket.getaddrinfo", side_effect=socket.gaierror(socket.EAI_AGAIN, "m"))
        assert dns.SystemResolver(str(conf))("x").error_kind == model.NO_NAMESERVER

    def test_real_localhost(self) -> None:
        """The real system resolver resolves localhost to a loopback address."""
        answer = dns.SystemResolver()("localhost")
        assert answer.ok
        assert answer.addresses[0] in ("127.0.0.1", "::1")


def test_no_thread_left_behind() -> None:
    """Idle lookup threads end with the wait (the launcher may wait more than once)."""
    before = threading.active_count()
    fake = FakeResolver({f"h{i}" for i in range(20)})
    dns.wait_for([f"h{i}" for i in range(20)], lookup=fake, deadline=5, interval=3)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
