"""What each chaos run may end with (tests/bench/chaos.py; docs/benchmarks.md "Chaos"):
data, one row per fault × where × moment. A run whose outcome the row does not allow is
printed as "not as documented"; the bench never asserts. Update the rows, not the code,
when the agent's behaviour changes.

Launch faults (a launch of `sh -c 'sleep 1'` on every worker): the launcher's exit codes.
69: a check failed (no rank started); 68: a name did not resolve by the deadline; 143:
SIGTERM; 0: the fault did not touch the launch (it came after its part, or the agent got
past it: sshd restarted before preflight's retry); N: mpirun's own non-zero code, when a
rank or daemon was lost while ranks ran — or 0 when the fault came after that worker's
ranks had ended and its daemon had reported (`ranks running` is every moment after
`checks passed`, the job's last instants included: seed 383140092's run 40 took eth0
down 10 ms before mpirun exited 0).

Job faults (ranks that allreduce every 0.2 s for long: tests/support/ticker.c), on a
worker or on the launcher: `Expect` gives the launcher's exit codes (RUNNING: still
running when the harness gave up, GIVE_UP_S after the fault), whether ranks may be left
on the workers at the end (`ranks`), and the most seconds the run may take to get there
(`within_s`): for a worker fault, from the fault to the launcher's exit; for a fault on
the launcher, from the fault until no rank is left on any worker.

The job rows below are what the agent does with its liveness check on (the defaults:
MPI_BOOTSTRAP_LIVENESS_SECONDS=30, MPI_BOOTSTRAP_LAUNCHER_GRACE_SECONDS=30; docs/
troubleshooting.md "While ranks run"). A worker cut off, dropping every packet or frozen
for good is declared lost within the bound and the launcher exits 75 naming it (its ranks
on that worker go when its own watch misses the launcher, bound + grace after the fault,
so the harness may still see them); a killed worker resets mpirun's connections, and the
verification round after mpirun's exit names it (75) in seconds; a freeze shorter than
the bound's suspicion (25 s) ends nothing. The launcher cut off or dropping every packet
loses every worker (75), and each worker ends the ranks of a launcher it has not heard
from for bound + grace; a launcher frozen for good never exits (the harness's
`still running`), its ranks end all the same. Before this check (core/liveness.py),
the cut-off, loss100 and frozen rows read `still running`, ranks left, for as long as the
harness waited.
"""

from __future__ import annotations

import dataclasses

N = "N"  # mpirun's own non-zero exit code (not one of the agent's: 0, 68, 69, 143, 75)
RUNNING = "still running"  # when the harness gave up on it
AGENT_CODES = (0, 68, 69, 75, 143)
BEFORE, RUNNING_MOMENT = "before checks", "ranks running"

LAUNCH_FAULTS = (
    "kill9-pid1",
    "kill-sshd",
    "eth0-down",
    "dns-removed",
    "sigstop-20s",
    "fill-state",
    "net1-down",
    "sigterm",
)
LAUNCH_OUTCOMES: dict[tuple[str, str], set[int | str]] = {
    ("kill9-pid1", BEFORE): {69},
    ("kill9-pid1", RUNNING_MOMENT): {0, N},
    ("kill-sshd", BEFORE): {0, 69},
    ("kill-sshd", RUNNING_MOMENT): {0},
    ("eth0-down", BEFORE): {69, 68},
    ("eth0-down", RUNNING_MOMENT): {0, N},
    ("dns-removed", BEFORE): {0, 68},
    ("dns-removed", RUNNING_MOMENT): {0},
    ("sigstop-20s", BEFORE): {0, 69},
    ("sigstop-20s", RUNNING_MOMENT): {0, N},
    ("fill-state", BEFORE): {0},
    ("fill-state", RUNNING_MOMENT): {0},
    ("net1-down", BEFORE): {0, 69},
    ("net1-down", RUNNING_MOMENT): {0},
    ("sigterm", BEFORE): {143},
    ("sigterm", RUNNING_MOMENT): {143},
}

JOB_FAULTS = ("cut-off", "loss100", "frozen-20s", "frozen", "killed")
WHERE = ("worker", "launcher")
LEFT, GONE, EITHER = "left", "gone", "either"


@dataclasses.dataclass(frozen=True)
class Expect:
    codes: frozenset[int | str]
    ranks: str = EITHER  # LEFT / GONE / EITHER: ranks on the workers when the run ended
    within_s: float | None = None  # the bound on the detection time; None: no bound


def expect(*codes: int | str, ranks: str = EITHER, within_s: float | None = None) -> Expect:
    return Expect(frozenset(codes), ranks, within_s)


BOUND_S = 30 + 10  # the liveness bound, the launcher's teardown (≤ 5 s) and the harness's poll
STRANDED_S = 30 + 30 + 10  # bound + grace: a worker's watch ends the ranks of a lost launcher

JOB_OUTCOMES: dict[tuple[str, str, str], Expect] = {
    # A worker ---------------------------------------------------------------------------
    ("cut-off", "worker", BEFORE): expect(69, 68, 75),
    ("cut-off", "worker", RUNNING_MOMENT): expect(75, within_s=BOUND_S),
    ("loss100", "worker", BEFORE): expect(69, 68, 75),
    ("loss100", "worker", RUNNING_MOMENT): expect(75, within_s=BOUND_S),
    ("frozen-20s", "worker", BEFORE): expect(0, 69),
    ("frozen-20s", "worker", RUNNING_MOMENT): expect(0),  # the job goes on to its end
    # (`before checks` is before the launcher logged `checks passed`: a freeze after that
    # worker's own checks, its daemon started beside them, is found by the liveness check.)
    ("frozen", "worker", BEFORE): expect(69, 75),
    ("frozen", "worker", RUNNING_MOMENT): expect(75, within_s=BOUND_S),
    ("killed", "worker", BEFORE): expect(69, 75),
    ("killed", "worker", RUNNING_MOMENT): expect(75, ranks=GONE, within_s=BOUND_S),
    # The launcher -----------------------------------------------------------------------
    ("cut-off", "launcher", BEFORE): expect(69, 68, 75),
    ("cut-off", "launcher", RUNNING_MOMENT): expect(75, ranks=GONE, within_s=STRANDED_S),
    ("loss100", "launcher", BEFORE): expect(69, 68, 75),
    ("loss100", "launcher", RUNNING_MOMENT): expect(75, ranks=GONE, within_s=STRANDED_S),
    ("frozen-20s", "launcher", BEFORE): expect(0, 69),
    ("frozen-20s", "launcher", RUNNING_MOMENT): expect(0),
    ("frozen", "launcher", BEFORE): expect(RUNNING, ranks=GONE),
    ("frozen", "launcher", RUNNING_MOMENT): expect(RUNNING, ranks=GONE, within_s=STRANDED_S),
    ("killed", "launcher", BEFORE): expect(137, ranks=GONE),
    ("killed", "launcher", RUNNING_MOMENT): expect(137, ranks=GONE),
}


def launch_allowed(fault: str, moment: str, code: int) -> bool:
    ok = LAUNCH_OUTCOMES[(fault, moment)]
    return code in ok or (N in ok and code not in AGENT_CODES)


def job_problems(
    row: tuple[str, str, str], code: int | str, ranks_left: bool, took_s: float | None
) -> list[str]:
    """What in a job run's outcome its row (fault, where, moment) does not allow (nothing:
    as documented)."""
    e = JOB_OUTCOMES[row]
    problems = []
    mpirun_own = isinstance(code, int) and code not in AGENT_CODES
    if code not in e.codes and not (N in e.codes and mpirun_own):
        problems.append(f"ended {code}, documented {sorted(map(str, e.codes))}")
    if e.ranks != EITHER and ranks_left != (e.ranks == LEFT):
        problems.append(f"ranks {'left' if ranks_left else 'gone'}, documented {e.ranks}")
    if e.within_s is not None and (took_s is None or took_s > e.within_s):
        problems.append(f"took {took_s} s, documented within {e.within_s} s")
    return problems
