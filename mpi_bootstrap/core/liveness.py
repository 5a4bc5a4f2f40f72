"""Liveness while ranks run: the launcher's and the workers' resident PID 1s tell each
other they are there, and a silence is named and acted on within a bound. How, what is
seen, and why UDP: docs/troubleshooting.md, "While ranks run".

Why a session key, not the job's token: a fresh random key per launch, handed over the
launcher's authenticated ssh session, works with every exchange (`secret` and `dir` have
no token), and no message of one launch verifies under another's. Within a launch,
counters only move forward (a replayed ping, pong or stop is older than the last taken).
Pure; the sockets are pid1/monitor.py's and pid1/watch.py's. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from mpi_bootstrap.core import sign

VERSION = 2  # 2: each worker's datagrams signed with a key of its own (worker_key)
PING_S = 1.0  # the launcher pings each worker this often
ARM_N = 16  # the counters of the pings that arm each watch before any rank starts (1 to
# ARM_N: pid1/monitor.py `arm`, a new one each round); the resident's monitor counts on from it
CONFIRM_PING_S = 0.25  # while confirming a silence
CONFIRM_S = 5.0  # at most this long of the bound is spent confirming
PAUSE_S = 3.0  # a loop that did not run for this long was stopped or starved itself
MAX_DATAGRAM = 512
MAX_BOUND = 86400.0  # the liveness bound a claim may carry, in seconds
SESSION_KEY = re.compile(r"[0-9a-f]{64}")
SESSION_ID = re.compile(r"[0-9a-f]{16}")
MAX_COUNTER = 2**53  # exact in every JSON reader

# What a confirmed silence looked like (pid1/monitor.py's TCP probe of the worker's sshd).
NO_ANSWER = "no answer"
REFUSED = "refused"
FROZEN = "frozen"
RESTARTED = "restarted"
SUPERSEDED = "superseded"
SEEN = {
    NO_ANSWER: "no answer at all: cut off from the network, its node down, or every packet lost",
    REFUSED: "its sshd's port refuses connections: the pod or its agent is gone",
    FROZEN: "its kernel accepts connections but its agent does not answer: the pod is "
    "frozen or hung (stopped, or starved of memory)",
    RESTARTED: "its agent restarted (a new boot id): the ranks it held are gone",
    SUPERSEDED: "another launcher took it over (a newer launch claimed it)",
}


def session_id(key: str) -> str:
    """The public name of a session: derived from its key, so it cannot be chosen apart
    from it."""
    return sign.derive(bytes.fromhex(key), "mpi-bootstrap session id").hex()[:16]


def worker_key(key: str, worker: str) -> bytes:
    """The key of one worker's datagrams, both ways: the launch's key and the worker's
    watch address (its claim's answer names it), so that a datagram signed for one worker
    verifies for no other — re-sent from another worker's address, or relayed to it
    (SECURITY.md, promise 36)."""
    return sign.derive(bytes.fromhex(key), f"mpi-bootstrap liveness {worker}")


def encode(key: bytes, sid: str, kind: str, n: int, **fields: Any) -> bytes:
    """One datagram of `kind` with counter `n` of session `sid`, signed with `key` (a
    worker's: `worker_key`)."""
    body = {"v": VERSION, "t": kind, "s": sid, "n": n, **fields}
    return json.dumps(sign.signed(key, body), separators=(",", ":")).encode()


def session_of(data: bytes) -> tuple[str, dict[str, Any]] | None:
    """(the session id, the message) of a datagram of our form, not yet authenticated;
    None for anything else. Never raises."""
    if len(data) > MAX_DATAGRAM:
        return None
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("v") != VERSION:
        return None
    sid, n, kind = message.get("s"), message.get("n"), message.get("t")
    if (
        not isinstance(sid, str)
        or not SESSION_ID.fullmatch(sid)
        or type(n) is not int
        or not 0 < n < MAX_COUNTER
        or not isinstance(kind, str)
    ):
        return None
    return sid, message


authentic = sign.valid  # (key, message): is it signed with that worker's key? Never raises


@dataclasses.dataclass(frozen=True)
class Timing:
    """The bound and what it is made of: silence becomes suspect at `suspect_after`, and
    is confirmed until `bound` (at most CONFIRM_S of it, at least a third of it left for
    pings to come back by themselves)."""

    bound: float

    @property
    def confirm(self) -> float:
        return min(CONFIRM_S, self.bound / 3)

    @property
    def suspect_after(self) -> float:
        return self.bound - self.confirm


# What a worker's PID 1 writes on the stderr of each ssh session it ends (pid1/watch.py),
# so that the launcher that opened it says why it ended (failures.explain_ssh), never
# "ssh exited 255" or a data-network fault.
ENDED = "mpi-bootstrap: this session was ended by the agent of "
ENDED_WHY = {
    "earlier launch": "a new launch claimed the worker",
    SUPERSEDED: "a newer launch claimed the worker",
    "job over": "the job is over",
    "worker lost": "the launcher lost another worker",
    "launcher lost": "its launcher was silent for the liveness bound",
}


def ended_note(host: str, reason: str) -> str:
    return f"{ENDED}{host}: {ENDED_WHY.get(reason, reason)}\n"


# ---------------------------------------------------------------- the claim


def claim_line(key: str, bound: float) -> str:
    """What the launcher writes to a preflight session's stdin: the session's key, and
    the bound of silence after which a watch takes its launcher for lost (the launcher's
    one setting: both sides count the same)."""
    if not SESSION_KEY.fullmatch(key) or not 0 <= bound <= MAX_BOUND:
        raise ValueError("not a session key and bound")
    return f"{key} {bound:g}\n"


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A worker's answer to a claim: where its watch listens, who it is, what it ended."""

    address: str
    port: int
    boot: str
    sshd_port: int
    ended: int
    names: tuple[str, ...]


_CLAIMED = re.compile(
    r"addr=(?P<address>[0-9A-Fa-f.:]{2,45}) port=(?P<port>\d{1,5}) boot=(?P<boot>[0-9a-f]{16}) "
    r"sshd=(?P<sshd>\d{1,5}) ended=(?P<ended>\d{1,6}) names=(?P<names>[A-Za-z0-9_.,:+-]{0,512})"
)
NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")


def claimed_text(c: Claimed) -> str:
    """The worker's answer, one line (pid1/watch.py writes it)."""
    names = ",".join(n for n in c.names if NAME.fullmatch(n))
    return (
        f"addr={c.address} port={c.port} boot={c.boot} sshd={c.sshd_port} "
        f"ended={c.ended} names={names[:512].rstrip(',')}"
    )


def parse_claimed(text: str) -> Claimed | str:
    """The worker's answer, or why there is none (a string: what the worker said)."""
    m = _CLAIMED.fullmatch(text.strip())
    if m is None or not 0 < int(m["port"]) <= 65535 or not 0 < int(m["sshd"]) <= 65535:
        return text.strip()[:200] or "no answer"
    names = tuple(n for n in m["names"].split(",") if n)
    return Claimed(m["address"], int(m["port"]), m["boot"], int(m["sshd"]), int(m["ended"]), names)
