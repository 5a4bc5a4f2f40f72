"""Programs the PID 1 tests run under the supervisor. `python child.py MODE ARGS…`

report          handle every forwarded signal: print READY, then GOT <NAME> per signal;
                exit 0 after SIGUSR2 (the last one the test sends)
orphans N       orphan N grandchildren that exit at once, wait until the namespace holds
                no zombie (or 10 s), print ZOMBIES <count>, exit 0 if none remain
leftover CODE   leave a grandchild that ignores SIGTERM, print its PID, exit CODE
race CODE N     start N children that exit together with us; exit CODE
orphan-ppid     orphan one grandchild that prints its new parent PID and exits; exit 0
"""

from __future__ import annotations

import os
import signal
import sys
import time


def report() -> None:
    def handler(signum: int, _frame: object) -> None:
        print(f"GOT {signal.Signals(signum).name}", flush=True)
        if signum == signal.SIGUSR2:
            sys.exit(0)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
              signal.SIGUSR1, signal.SIGUSR2):
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
            if stat[stat.rfind(b")") + 2:].split()[0] == b"Z":
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


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "report":
        report()
    elif mode == "orphans":
        orphans(int(args[0]))
    elif mode == "leftover":
        leftover(int(args[0]))
    elif mode == "race":
        race(int(args[0]), int(args[1]))
    elif mode == "orphan-ppid":
        orphan_ppid()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
