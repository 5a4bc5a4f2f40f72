"""Programs the PID 1 tests run under the supervisor. `python child.py MODE ARGS…`

report          handle every forwarded signal: print READY, then GOT <NAME> per signal;
                exit 0 after SIGUSR2 (the last one the test sends)
orphans N       orphan N grandchildren that exit at once, wait until the namespace holds
                no zombie (or 10 s), print ZOMBIES <count>, exit 0 if none remain
leftover CODE   leave a grandchild that ignores SIGTERM, print its PID, exit CODE
race CODE N     start N children that exit together with us; exit CODE
orphan-ppid     orphan one grandchild that prints its new parent PID and exits; exit 0
report-all      handle every catchable signal but SIGCHLD: READY, then GOT <number> per
                signal; exit 0 after SIGUSR2
burst           count SIGUSR1/SIGHUP/SIGWINCH; READY; after SIGUSR2 print COUNTS, exit 0
flood N ENDING  write N bytes of numbered lines to stderr, the last one `END`, and end:
                ok (exit 0), fail (exit 3), term (READY, then the flood when SIGTERM
                comes, then death by it), leftover (a grandchild that ignores SIGTERM
                floods when it comes and sleeps; we exit 0 at once)
flood-report N  write N bytes of numbered lines to stderr, then as `report`
tty-int         count SIGINTs; READY; read a line from stdin; print INTS <count>; exit 0
tty-read        READY; read a line from stdin; print READ <line>; exit 0
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable


def report() -> None:
    def handler(signum: int, _frame: object) -> None:
        print(f"GOT {signal.Signals(signum).name}", flush=True)
        if signum == signal.SIGUSR2:
            sys.exit(0)

    for s in (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    ):
        signal.signal(s, handler)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        signal.pause()
    sys.exit(3)


def zombies() -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if stat[stat.rfind(b")") + 2 :].split()[0] == b"Z":
                count += 1
    return count


def orphans(n: int) -> None:
    for _ in range(n):
        pid = os.fork()
        if pid == 0:  # middle process: fork the grandchild, then exit at once
            if os.fork() == 0:
                os._exit(0)  # the grandchild, now an orphan, exits
            os._exit(0)
        os.waitpid(pid, 0)  # reap the middle process ourselves
    deadline = time.monotonic() + 10
    left = zombies()
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = zombies()
    print(f"ZOMBIES {left}", flush=True)
    sys.exit(0 if left == 0 else 1)


def leftover(code: int) -> None:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
        os._exit(0)
    print(f"LEFTOVER {pid}", flush=True)
    sys.exit(code)


def race(code: int, n: int) -> None:
    start = time.monotonic() + 0.2
    for _ in range(n):
        if os.fork() == 0:
            time.sleep(max(0.0, start - time.monotonic()))
            os._exit(0)
    time.sleep(max(0.0, start - time.monotonic()))
    os._exit(code)


def orphan_ppid() -> None:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        middle = os.getpid()
        if os.fork() == 0:
            deadline = time.monotonic() + 10
            while os.getppid() == middle and time.monotonic() < deadline:
                time.sleep(0.005)  # wait to be re-parented
            print(f"PPID {os.getppid()}", flush=True)
            os.write(wfd, b"x")
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(wfd)
    os.read(rfd, 1)  # the orphan has reported
    time.sleep(0.1)  # and exits (to be reaped by the agent) before we do
    sys.exit(0)


def report_all() -> None:
    def handler(signum: int, _frame: object) -> None:
        print(f"GOT {signum}", flush=True)
        if signum == signal.SIGUSR2:
            sys.exit(0)

    for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}:
        signal.signal(s, handler)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        signal.pause()
    sys.exit(3)


def burst() -> None:
    counts = {signal.SIGUSR1: 0, signal.SIGHUP: 0, signal.SIGWINCH: 0}

    def count(signum: int, _frame: object) -> None:
        counts[signal.Signals(signum)] += 1

    def done(_signum: int, _frame: object) -> None:
        print("COUNTS " + " ".join(f"{k.name}={v}" for k, v in counts.items()), flush=True)
        sys.exit(0)

    for s in counts:
        signal.signal(s, count)
    signal.signal(signal.SIGUSR2, done)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        signal.pause()
    sys.exit(3)


def flood_stderr(size: int) -> None:
    out = bytearray()
    n = 0
    while len(out) < size:
        out += f"line {n:08d} {'x' * 40}\n".encode()
        n += 1
    out += b"END\n"
    view = memoryview(out)
    while view:
        view = view[os.write(2, view) :]


def flood(size: int, ending: str) -> None:
    if ending == "ok":
        flood_stderr(size)
        sys.exit(0)
    if ending == "fail":
        flood_stderr(size)
        sys.exit(3)
    if ending == "term":

        def on_term(_signum: int, _frame: object) -> None:
            flood_stderr(size)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        print("READY", flush=True)
        time.sleep(60)
        sys.exit(3)
    if ending == "leftover":
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, lambda *_: flood_stderr(size))
            time.sleep(120)
            os._exit(0)
        sys.exit(0)
    sys.exit(f"unknown ending {ending}")


def tty_int() -> None:
    ints = 0

    def on_int(_signum: int, _frame: object) -> None:
        nonlocal ints
        ints += 1

    signal.signal(signal.SIGINT, on_int)
    print("READY", flush=True)
    sys.stdin.readline()
    print(f"INTS {ints}", flush=True)
    sys.exit(0)


def tty_read() -> None:
    print("READY", flush=True)
    print(f"READ {sys.stdin.readline().strip()}", flush=True)
    sys.exit(0)


def flood_report(size: int) -> None:
    flood_stderr(size)
    report()


# Each mode, run with the arguments after it.
MODES: dict[str, Callable[[list[str]], None]] = {
    "report": lambda _args: report(),
    "orphans": lambda args: orphans(int(args[0])),
    "leftover": lambda args: leftover(int(args[0])),
    "race": lambda args: race(int(args[0]), int(args[1])),
    "orphan-ppid": lambda _args: orphan_ppid(),
    "report-all": lambda _args: report_all(),
    "burst": lambda _args: burst(),
    "flood": lambda args: flood(int(args[0]), args[1]),
    "flood-report": lambda args: flood_report(int(args[0])),
    "tty-int": lambda _args: tty_int(),
    "tty-read": lambda _args: tty_read(),
}


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode not in MODES:
        sys.exit(f"unknown mode {mode}")
    MODES[mode](args)


if __name__ == "__main__":
    main()
