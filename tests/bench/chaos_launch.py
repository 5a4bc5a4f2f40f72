"""The chaos bench's launch faults (tests/bench/chaos.py): one fault at a random moment of
a launch of `sh -c 'sleep 1'` on every worker, into one worker (or the launcher).

    kill9-pid1   kill -9 the worker pod's PID 1 (the pod is gone)
    kill-sshd    kill -9 the worker's sshd (its supervisor restarts it)
    eth0-down    the worker's eth0 down (from the pod's side)
    dns-removed  the worker's DNS record removed
    sigstop-20s  every process of the worker's pod stopped for 20 s, then continued
    fill-state   the worker's state directory's filesystem filled
    net1-down    the worker's net1 (data NIC) down
    sigterm      SIGTERM to the launcher

Each run must end with an exit code of tests/bench/chaos_outcomes.py's LAUNCH_OUTCOMES
for that fault and moment, within the deadline + 10 s, its message naming the pod at
fault (not for sigterm), with no process of the job left on any pod; then the fault is
undone and a clean run must succeed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from typing import Any

from tests.bench.chaos_outcomes import LAUNCH_OUTCOMES, launch_allowed
from tests.bench.chaos_pods import DEADLINE_S, Chaos, moment_of
from tests.support.dnsmasq import READY_NAME, write_hosts_file
from tests.support.faults import Fault
from tests.support.job import Agent, sshd_of
from tests.support.wait import wait_until


def _nsenter_sh(ch: Chaos, target: str, script: str) -> None:
    """`script` in the worker's mount namespace (its state directory is a tmpfs there)."""
    pid = str(ch.c.pid_of(ch.workers[target].p))
    subprocess.run(
        ["nsenter", "-t", pid, "-m", "sh", "-c", script],
        capture_output=True,
        timeout=30,
        check=False,
    )


def inject(ch: Chaos, fault: str, target: str, launcher: Agent) -> Fault | None:
    pod = ch.pod(target)
    if fault == "kill9-pid1":
        ch.faults.kill_pod(pod)
    elif fault == "kill-sshd":
        with contextlib.suppress(AssertionError, ProcessLookupError):
            os.kill(sshd_of(pod), signal.SIGKILL)
    elif fault in ("eth0-down", "net1-down"):
        pod.netns.exec_checked(["ip", "link", "set", fault[:4], "down"])
    elif fault == "dns-removed":
        set_records(ch, removed={target})
    elif fault == "sigstop-20s":
        return ch.faults.freeze(pod, 20)
    elif fault == "fill-state":
        fill = shlex.quote(str(ch.state(pod) / "fill"))
        _nsenter_sh(ch, target, f"cat /dev/zero > {fill}")
    elif fault == "sigterm":
        launcher.signal(signal.SIGTERM)
    return None


def undo(ch: Chaos, fault: str, target: str, handle: Fault | None) -> None:
    pod = ch.pod(target)
    if fault == "kill9-pid1":
        ch.restart_worker(target)
    elif fault in ("eth0-down", "net1-down"):
        pod.netns.exec_checked(["ip", "link", "set", fault[:4], "up"])
    elif fault == "dns-removed":
        set_records(ch, removed=set())
    elif fault == "sigstop-20s" and handle is not None:
        handle.undo()
    elif fault == "fill-state":
        _nsenter_sh(ch, target, f"rm -f {shlex.quote(str(ch.state(pod) / 'fill'))}")
    if fault != "sigterm":
        ch.wait_ready(ch.workers[target])


def set_records(ch: Chaos, removed: set[str]) -> None:
    """The cluster's DNS records, but those of `removed` (dnsmasq re-reads on SIGHUP)."""
    d = ch.c.dnsmasq
    assert d is not None
    for f in os.listdir(d.hostsdir):
        os.unlink(os.path.join(d.hostsdir, f))
    pods = [p for p in ch.c.pods if p.name not in removed]
    pairs = [(ch.c.fqdn(p.name), p.address) for p in pods]
    pairs += [(ch.c.service, p.address) for p in pods if p is not ch.launcher_pod]
    write_hosts_file(d.hostsdir, "records-chaos", [*pairs, (READY_NAME, "127.0.0.1")])
    os.kill(d.pid, signal.SIGHUP)
    time.sleep(0.2)


def one_run(
    ch: Chaos, run: int, fault: str, target: str, delay: float, *, say: Any = print
) -> dict[str, Any]:
    a = ch.launcher(ch.names)
    t0 = time.monotonic()
    time.sleep(delay)
    at = time.time()
    handle = inject(ch, fault, target, a)
    say(f"run {run}: {fault} on {target} at {delay:.2f} s")
    problems = []
    try:
        code = a.p.wait(timeout=DEADLINE_S + 10 + max(0.0, delay))
    except subprocess.TimeoutExpired:
        problems.append(f"still running {DEADLINE_S + 10} s after the fault")
        a.signal(signal.SIGKILL)
        code = a.p.wait(timeout=30)
    seconds = time.monotonic() - t0
    _, _, err = a.finish(timeout=30)
    moment = moment_of(err, at)
    if not launch_allowed(fault, moment, code):
        problems.append(f"exit {code}, documented {LAUNCH_OUTCOMES[(fault, moment)]}")
    if code != 0 and fault != "sigterm" and target not in err + a.stdout():
        problems.append(f"{target} not named")
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not ch.left(), 15, "the job's processes to go", interval=0.2)
    if ch.left():
        problems.append(f"left: {ch.left()}")
        ch.clear_leftovers()
    undo(ch, fault, target, handle)
    again, again_s, again_err = ch.clean_run()
    if again != 0:
        problems.append(f"the next clean run exited {again}: {again_err[-1500:]}")
    return {
        "run": run,
        "family": "launch",
        "fault": fault,
        "target": target,
        "delay_s": round(delay, 2),
        "moment": moment,
        "code": code,
        "seconds": round(seconds, 2),
        "next_clean_s": round(again_s, 2),
        "problems": problems,
        "tail": "" if not problems else err[-1500:],
    }
