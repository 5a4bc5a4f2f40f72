"""Before mpirun, after preflight (and in `doctor`): the data network, tested by the
workers themselves, one session each running dataplane/probe.py's `session` (served by
the worker's PID 1: pid1/dataserve.py; in the launcher, preflight's own session goes on to
run it), all in parallel within the launcher's one deadline. The steps, the pairs, and
the failures (exit 69): docs/troubleshooting.md, "The data-plane check".
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpi_bootstrap.core import datanet, failures, liveness, records
from mpi_bootstrap.core.errors import PeerUnavailableError, shown, some
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.remote import CONTROL_ENV
from mpi_bootstrap.proc import children
from mpi_bootstrap.system import parallel

# A session ends by itself after this, should the launcher vanish. Sessions stay open
# together (each listens while the others probe); their starts and probes are bounded
# like preflight's ssh.
LISTEN_SECONDS = datanet.SESSION_SECONDS
# A worker's data NIC from the interfaces it has (NCCL's rule there): None where NCCL finds
# none, "" where it uses only the control interface (nothing to probe there).
Chooser = Callable[[tuple[str, ...]], "str | None"]
PLAIN = re.compile(r"[A-Za-z0-9_.:/@+-]+")  # words PID 1's request line may carry


def session_command(nic: str, sysfs: str, deadline: float) -> str:
    """The shell command of one worker's session, which ends by itself at the latest a
    few seconds after `deadline` (monotonic). The session asks the worker's PID 1 through
    two FIFOs of its own, and copies them to and from its stdin and stdout: three small
    programs and a fork, no interpreter."""
    seconds = f"{min(LISTEN_SECONDS, max(1.0, deadline - time.monotonic() + 5)):g}"
    if not all(PLAIN.fullmatch(a) for a in (nic, sysfs)):  # PID 1 reads plain words only
        raise ValueError(f"{nic!r}, {sysfs!r}: not plain words")
    return (
        f'F="${{{CONTROL_ENV}:-}}"; if [ -p "$F" ] && i="${{F%/*}}/probe-$$.in" '
        '&& o="${F%/*}/probe-$$.out" && mkfifo -m 600 "$i" "$o" 2>/dev/null; then '
        f'echo probe {nic} {seconds} {sysfs} "$$" >"$F" && '
        f'{{ cat "$o" & cat >"$i"; wait; }}; else echo \'{UNSERVED}\'; fi'
    )


# A session's first line where the worker's PID 1 does not serve the check.
UNSERVED = '{"unserved": "no control FIFO (an sshd before OpenSSH 8.7 has no SetEnv)"}'


def mismatch(nic: str, reports: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Workers whose data NIC's MTU differs from the most common one (`nic`: their NIC's
    name, or the names joined where they differ)."""
    mtus = Counter(f["mtu"] for f in reports.values())
    if len(mtus) < 2:
        return None
    usual = mtus.most_common(1)[0][0]
    odd = [f"{h} ({f['mtu']})" for h, f in reports.items() if f["mtu"] != usual]
    return (
        f"MTU mismatch: {nic} has MTU {usual} on {mtus[usual]} workers but not on "
        f"{some(odd, shown=3)}: jumbo frames must be on every node or none"
    )


class _Run:
    """One ssh session per worker, all at once (dataplane/probe.py says what each does)."""

    def __init__(
        self,
        ssh: Sequence[str],
        hosts: Sequence[str],
        nics: str | Mapping[str, str],
        *,
        sysfs: str,
        env: Mapping[str, str],
        deadline: float,
        opened: Mapping[str, children.Lines],
        published: Mapping[str, datanet.DataNIC],
        value: str | None,
        choose: Chooser | None = None,
    ) -> None:
        self.hosts = list(hosts)
        self.nics = dict.fromkeys(hosts, nics) if isinstance(nics, str) else dict(nics)
        self.ssh, self.sysfs, self.unserved = list(ssh), sysfs, list[str]()
        self.env, self.deadline, self.published = env, deadline, published
        self.value, self.choose = value, choose  # the NCCL_SOCKET_IFNAME that chose the NICs
        self.lines: dict[str, children.Lines] = dict(opened)
        self.sessions: dict[str, Any] = {h: lines.child for h, lines in opened.items()}

    @property
    def label(self) -> str:
        """The data NICs tested, in words (the MTU mismatch's, the log's)."""
        return ", ".join(dict.fromkeys(self.nics[h] for h in self.hosts if self.nics[h]))

    def start(self, host: str) -> tuple[dict[str, Any] | None, str | None]:
        """Its data NIC as the session reports it, or why it cannot take part; where the
        worker lacks the NIC asked for and `choose` picks another of its interfaces (the
        doctor, which reads no records: NCCL's rule on that worker's own), that one."""
        found, why = self._start(host)
        if found is None or found.get("error") != "missing" or self.choose is None:
            return found, why
        nic = self.choose(tuple(found.get("have") or ()))
        if nic is None or nic == self.nics[host]:
            return found, why
        children.close_all([self.sessions.pop(host)], wait=True)
        del self.lines[host]
        self.nics[host] = nic
        if not nic:  # NCCL uses only the control interface there: nothing to probe
            return None, None
        return self._start(host)

    def _start(self, host: str) -> tuple[dict[str, Any] | None, str | None]:
        if host not in self.lines:
            child = children.open_piped(
                [*self.ssh, host, session_command(self.nics[host], self.sysfs, self.deadline)],
                self.env,
            )
            self.sessions[host] = child
            self.lines[host] = children.Lines(child, limit=records.MAX_MESSAGE)
        child = self.sessions[host]
        line = self.lines[host].next(self.deadline)
        if not line:
            code, err = children.close_piped(child, 1.0)
            why = (
                failures.explain_ssh(host, err, code)
                if code == 255 or liveness.ENDED in err
                else f"{host}: the data check did not start (exit {code}: {err.strip()[:200]!r})"
            )
            return None, why
        if line == UNSERVED:  # its PID 1 cannot serve the check: left out, said
            self.unserved.append(host)
            return None, None
        return report(host, line, self.nics[host], self.published.get(host), self.value)

    def send(self, host: str, line: str) -> None:
        """The session's one line: who may probe it, and whom it probes."""
        child = self.sessions[host]
        try:
            child.stdin.write((line + "\n").encode())
            child.stdin.flush()
        except OSError:
            pass  # the session is gone: `results` says so

    def results(self, host: str, peers: frozenset[str]) -> list[tuple[str, str]]:
        """The failures `host` found probing `peers`: (the pair's other worker, what
        failed)."""
        problems: list[tuple[str, str]] = []
        while (line := self.lines[host].next(self.deadline)) is not None:
            result, why = probe_result(host, line, peers)
            if result is None:
                return [*problems, (host, str(why))]
            if "done" in result:
                return problems
            if (why := datanet.probe_problem(self.nics[host], host, result)) is not None:
                problems.append((str(result["peer"]), why))
        err = children.stderr_soon(self.sessions[host])
        why = (
            failures.explain_ssh(host, err, 255)
            if liveness.ENDED in err  # the worker's PID 1 ended it: said as such
            else f"{host}: the data check's session ended before every probe answered "
            "(the deadline, or the worker went away)"
        )
        return [*problems, (host, why)]

    def close(self, wait: bool) -> None:
        """Tell every session to end (its stdin closes: the worker's program closes its
        port and exits); with `wait`, wait for them, else hand them to the process that
        will reap them."""
        children.close_all(self.sessions.values(), wait=wait)


# What a worker's session says is checked before any of it is used (core/datanet.py):
# a line that is not what the protocol allows refuses that worker (exit 69), whatever
# it holds — never an exception in the launcher.
def report(
    host: str, line: str, nic: str, published: datanet.DataNIC | None, value: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """A session's first line: (its data NIC and port, why `host` cannot take part)."""
    try:
        reports = datanet.session_report(json.loads(line), nic)
        if (why := datanet.disagrees(reports, published)) is not None:
            raise ValueError(why)  # a worker changed since it started, or one that lies
    except (ValueError, RecursionError) as exc:
        return None, refused(host, "report", exc, line)
    return reports, datanet.listener_problem(host, reports, value)


def probe_result(
    host: str, line: str, peers: frozenset[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """One line of `host`'s probes: (the result or `{"done": N}`, why it is refused)."""
    try:
        return datanet.probe_line(json.loads(line), peers), None
    except (ValueError, RecursionError) as exc:
        return None, refused(host, "probe result", exc, line)


def refused(host: str, what: str, exc: BaseException, line: str) -> str:
    return (
        f"{host}: the data check's session sent a {what} that is refused "
        f"({shown(str(exc), 160)}): {shown(line, 160)}"
    )


def requests(reports: Mapping[str, Mapping[str, Any]], seed: int) -> dict[str, list[str]]:
    """Each worker's line, by host: `from=` the addresses of the workers that probe it
    (its port answers no one else), then `NAME=ADDR:PORT:MTU` for each peer it probes.
    Every value was validated (datanet.session_report)."""
    ready = list(reports)
    targets: dict[str, list[str]] = {h: [] for h in ready}
    sources: dict[str, set[str]] = {h: set() for h in ready}
    for i, j in datanet.pairs(len(ready), seed):
        peer = reports[ready[j]]
        targets[ready[i]].append(f"{ready[j]}={peer['addresses'][0]}:{peer['port']}:{peer['mtu']}")
        sources[ready[j]].update(reports[ready[i]]["addresses"])
    return {h: [f"from={','.join(sorted(sources[h]))}", *targets[h]] for h in ready if targets[h]}


def _listen(
    r: _Run, hosts: Sequence[str], log: Log
) -> tuple[dict[str, dict[str, Any]], list[str], str | None]:
    """Every session started: its report (data NIC, port), by host; what is wrong with
    them; the first host at fault."""
    found = parallel.map_all(r.start, list(hosts), parallel.SSH_AT_ONCE)
    problems = [why for _, why in found if why]
    at = next((h for h, (_, why) in zip(hosts, found, strict=True) if why), None)
    reports = {h: f for h, (f, why) in zip(hosts, found, strict=True) if f and not why}
    for host, f in reports.items():
        log(
            "data NIC",
            level="debug",
            host=host,
            nic=r.nics[host],
            mtu=f["mtu"],
            addresses=f["addresses"],
            rdma=f["rdma"],
        )
    if r.unserved:
        log("data check not served", level="warning", hosts=some(r.unserved), reason=UNSERVED)
    if (odd := mismatch(r.label, reports)) is not None:
        problems.append(odd)
    return reports, problems, at


def _probe(r: _Run, lines: Mapping[str, list[str]], at: str | None) -> tuple[list[str], str | None]:
    """Every session's probes, once each has its line: the failing pairs (said first
    where one worker is in every one of them), and the host at fault."""
    todo = list(lines)
    failed = parallel.map_all(
        lambda h: r.results(h, frozenset(w.partition("=")[0] for w in lines[h][1:])),
        todo,
        parallel.SSH_AT_ONCE,
    )
    pairs = [
        ({host, peer}, why) for host, found in zip(todo, failed, strict=True) for peer, why in found
    ]
    common = set.intersection(*(p for p, _ in pairs)) if len(pairs) > 1 else set()
    if len(common) == 1:  # one worker in every failing pair: say so first
        at = common.pop()
        return [f"every failing pair involves {at}; {pairs[0][1]}", *(w for _, w in pairs[1:])], at
    return [why for _, why in pairs], at


def _outcome(
    log: Log,
    r: _Run,
    *,
    reports: Mapping[str, Mapping[str, Any]],
    lines: Mapping[str, list[str]],
    problems: list[str],
    at: str | None,
    times: tuple[float, float, float, float],
) -> None:
    """Raise naming every failure, else log what the check found and what it took."""
    if problems:
        raise PeerUnavailableError(
            f"data network: {some(problems)}",
            details="\n".join(problems) if len(problems) > 1 else "",
            phase="data check",
            host=at,
        )
    started, listened, probed, cpu = times
    log(
        "data check ok",
        workers=len(reports),
        nic=r.label,
        probes=sum(len(words) - 1 for words in lines.values()),
        mtu=sorted({f["mtu"] for f in reports.values()}),
        listen_s=round(listened - started, 3),
        probe_s=round(probed - listened, 3),
        elapsed_s=round(time.monotonic() - started, 3),
        cpu_s=round(time.process_time() - cpu, 3),  # this process's, its threads' included
    )


def run(
    hosts: Sequence[str],
    ssh_command: Sequence[str],
    nics: str | Mapping[str, str],
    *,
    sysfs: str,
    env: Mapping[str, str],
    deadline: float,
    log: Log,
    seed: int = 0,
    opened: Mapping[str, children.Lines] | None = None,
    reaper: bool = False,
    published: Mapping[str, datanet.DataNIC] | None = None,
    value: str | None = None,
    choose: Chooser | None = None,
) -> dict[str, dict[str, Any]]:
    """Test the data network among `hosts`, each on its data NIC `nics[host]` (or all on
    `nics`; chosen by NCCL_SOCKET_IFNAME `value`: core/nccl.py); their data NICs as
    found, or raise PeerUnavailableError naming every failure. `opened`: sessions running
    `session_command` (preflight's, which ran it after its check), by host; the others are
    opened here. `published`: the data NICs the workers' records name, which their
    sessions must agree with. Every session is told to end before this returns, and
    waited for unless it passed and `reaper` (this process goes on to reap all its
    children: the resident supervisor), which saves mpirun's start that wait (40 ms at 16
    workers). `choose`: the data NIC of a worker that lacks `nics[host]`, from the
    interfaces it has (None: none; see _Run.start)."""
    started, cpu = time.monotonic(), time.process_time()
    r = _Run(
        ssh_command,
        hosts,
        nics,
        sysfs=sysfs,
        env=env,
        deadline=deadline,
        opened=opened or {},
        published=published or {},
        value=value,
        choose=choose,
    )
    passed = False
    try:
        reports, problems, at = _listen(r, hosts, log)
        lines = requests(reports, seed)
        for host, words in lines.items():  # every line first: a port answers its probers
            r.send(host, " ".join(words))  # only once its own line has come
        listened = time.monotonic()
        failed, at = _probe(r, lines, at)
        problems.extend(failed)
        probed = time.monotonic()
        passed = not problems
    finally:
        r.close(wait=not (passed and reaper))
    times = (started, listened, probed, cpu)
    _outcome(log, r, reports=reports, lines=lines, problems=problems, at=at, times=times)
    return reports
