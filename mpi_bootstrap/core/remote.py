"""What a worker's ssh session must show before mpirun starts there: one POSIX sh script
and its report. The launcher's preflight (real `ssh`) and the doctor (paramiko) run the
same script, so they can never disagree on what "fit for mpirun" means.

The script prints one line per fact:
    DAEMON <name> <path or "missing">   where the MPI's remote daemon would be run from
    LD <LD_LIBRARY_PATH>                what the session received
    PATH <PATH>
    PROGRAM <path or "missing">         the user's program, resolved like execvp
    SHM <KiB> <KiB free>                /dev/shm, NCCL <path> <version>, GPUS <n>: the
                                        node (launcher/nodecheck.py judges them)
    IFACE <index> <name> <state>        every interface; behind one, each RDMA port:
    PORT <iface> <dev/port> <state>     and its pinned GID: GID <iface> <dev/port> <gid> <type>

The launcher's preflight runs `claim()` first (never the doctor: core/liveness.py); it
prints     CLAIM <the answer, or "none" where no PID 1 of ours serves the session>
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from mpi_bootstrap.core.errors import shown
from mpi_bootstrap.core.values import digits


def script(
    daemons: Sequence[str],
    dirs: Sequence[str],
    program: str | None = None,
    ranks_path: str | None = None,
) -> str:
    """The check: each daemon is looked for in `dirs`, then on the session's PATH; the
    program with `ranks_path` (None: the session's own PATH)."""
    checks = []
    for name in daemons:
        paths = " ".join(shlex.quote(f"{d}/{name}") for d in dirs)
        checks.append(
            f'found=""; for p in {paths}; do [ -x "$p" ] && found="$p" && break; done; '
            f'[ -n "$found" ] || found=$(command -v {shlex.quote(name)} 2>/dev/null); '
            f'echo "DAEMON {name} ${{found:-missing}}"'
        )
    checks += ['echo "LD $LD_LIBRARY_PATH"', 'echo "PATH $PATH"']
    if program and "/" not in program:
        # The file execvp would run (`command -v` would name a shell builtin instead).
        path = shlex.quote(ranks_path) if ranks_path else '"$PATH"'
        prog = shlex.quote(program)
        checks.append(
            f'found=""; P={path}; old="$IFS"; IFS=:; for d in $P; do d="${{d:-.}}"; '
            f'if [ -f "$d/"{prog} ] && [ -x "$d/"{prog} ]; then found="$d/"{prog}; '
            'break; fi; done; IFS="$old"; echo "PROGRAM ${found:-missing}"'
        )
    elif program and program.startswith("/"):
        quoted = shlex.quote(program)
        checks.append(
            f'if [ -x {quoted} ]; then echo "PROGRAM "{quoted}; else echo "PROGRAM missing"; fi'
        )
    return "; ".join(checks)


# The node: /dev/shm's size; the libnccl.so.2 the ranks load (LD_LIBRARY_PATH, then the
# loader's cache), its version (its file's name, else its banner); every interface (its
# index and state) and each RDMA port behind one, its state and pinned GID — which of
# them NCCL uses is the launcher's to say, by core/nccl.py's rule (launcher/nodecheck.py:
# a second reading of NCCL_SOCKET_IFNAME here missed the ports of `eth`, `^lo,docker`
# and `ib0,eth0`); IMEX channels; the GPUs. Run where the job's environment has NCCL_*.
def node(sysfs: str = "/sys") -> str:
    """The node's report (`sysfs`: where sysfs is mounted, MPI_BOOTSTRAP_SYSFS)."""
    net = f"{shlex.quote(sysfs)}/class/net"
    return (
        'n=; o="$IFS"; IFS=:; for d in $LD_LIBRARY_PATH; do [ -e "$d/libnccl.so.2" ] && '
        'n="$d/libnccl.so.2" && break; done; IFS="$o"; [ -n "$n" ] || n=$(/sbin/ldconfig -p '
        "2>/dev/null | sed -n 's/^[[:space:]]*libnccl.so.2 .*=> //p' | head -n 1); "
        'if [ -n "$n" ]; then v=$(readlink -f "$n"); v=${v##*/libnccl.so.}; case $v in '
        '2.*.*) ;; *) v=$(grep -aom 1 "NCCL version [0-9][0-9.]*[0-9]" "$n"); v=${v##* };; '
        'esac; echo "NCCL $n ${v:-?}"; df -Pk /dev/shm 2>/dev/null | { read -r _; read -r _ '
        't _ a _; echo "SHM $t $a"; }; '
        f'for f in {net}/*; do i=${{f##*/}}; read -r x <"$f/ifindex" 2>/dev/null || continue; '
        'read -r u <"$f/operstate" 2>/dev/null || u=unknown; echo "IFACE $x $i $u"; '
        'for p in "$f"/device/infiniband/*/ports/*; do [ -r "$p/state" ] || continue; '
        'read -r s <"$p/state"; d=${p#*/infiniband/}; d="${d%%/*}/${p##*/}"; '
        'echo "PORT $i $d ${s#*: }"; [ -z "$NCCL_IB_GID_INDEX" ] || { '
        'g=$(cat "$p/gids/$NCCL_IB_GID_INDEX"); t=$(cat "$p/gid_attrs/types/$NCCL_IB_GID_INDEX"); '
        'echo "GID $i $d ${g:--} $t"; } 2>/dev/null; done; done; fi; '
        '[ -z "$NCCL_MNNVL_ENABLE" ] || { set -- /dev/nvidia-caps-imex-channels/channel*; '
        '[ -e "$1" ] || shift $#; echo "IMEX $#"; }; '
        'set -- /dev/nvidia[0-9]*; [ -e "$1" ] || shift $#; echo "GPUS $#"'
    )


CONTROL_ENV = "MPI_BOOTSTRAP_CONTROL"  # the worker's control FIFO (sshd's SetEnv)
# The agent's own ssh server says so in its banner, `SSH-2.0-mpi-bootstrap_<paramiko's>`
# (ssh/server.py): the doctor names the server that answered by it.
SERVER_BANNER = "mpi-bootstrap"


def claim() -> str:
    """The claim, before the check. Its key and the launcher's liveness bound travel on
    stdin and through the FIFO (echo is the shell's own: no process's argv ever holds
    the key); the answer comes back on a FIFO of this session's own, opened read-write
    first so that PID 1's non-blocking open finds a reader. The shell holds the control
    FIFO open until it is answered: PID 1 takes a claim only from the PID that does
    (pid1/watch.py; the kernel's word, not the line's)."""
    return (
        f'C="${{{CONTROL_ENV}:-}}"; read -r k b; '
        'if [ -p "$C" ] && o="${C%/*}/control-$$.out" && mkfifo -m 600 "$o" '
        '2>/dev/null && exec 4<>"$o" && exec 5>"$C"; then echo "claim $k $b $$" >&5; k=; '
        'IFS= read -r a <&4; exec 4<&- 5>&-; rm -f "$o"; echo "CLAIM $a"; '
        'else k=; echo "CLAIM none"; fi'
    )


@dataclasses.dataclass(frozen=True)
class Report:
    """What the script printed."""

    ran: bool  # False: the remote shell never ran it (a forced command, a broken shell)
    daemons: dict[str, str | None]  # name → path, None where missing
    ld: str
    path: str
    program: str | None  # path, "missing", or None when not asked
    claim: str | None = None  # the worker's answer to a claim, "none", None: not claimed
    shm: tuple[int, int] | None = None  # /dev/shm: KiB, KiB free
    nccl: tuple[str, str] | None = None  # the libnccl.so.2 the ranks load, its version
    gpus: int = 0
    ports: tuple[tuple[str, str, str], ...] = ()  # (interface, device/port, state)
    gids: tuple[tuple[str, str, str, str], ...] = ()  # (interface, device/port, GID, type)
    ifaces: tuple[str, ...] = ()  # the interfaces up, in their index's order (NCCL's)
    imex: int | None = None  # IMEX channels (asked where NCCL_MNNVL_ENABLE is set)
    unparsed: str = ""  # a line that should hold numbers and does not: why (shown)

    @property
    def missing(self) -> list[str]:
        return [name for name, where in self.daemons.items() if where is None]

    def summary(self) -> str:
        found = ", ".join(f"{n} {p or 'missing'}" for n, p in self.daemons.items())
        return f"LD_LIBRARY_PATH={self.ld!r}; {found}; {self.node()}"

    def node(self) -> str:
        n = self.nccl
        nccl = f"NCCL {shown(n[1])} ({shown(n[0], 400)})" if n else "no libnccl.so.2"
        shm = self.shm
        free = f"; /dev/shm {shm[1] >> 10} MiB free of {shm[0] >> 10} MiB" if shm else ""
        return f"{nccl}{free}; {self.gpus} GPUs"


def _numbers(values: dict[str, str], key: str, count: int, bad: list[str]) -> tuple[int, ...]:
    """`count` numbers of the report's `key` line (core/values.py digits); () where the
    line is absent, or (its fault added to `bad`) where it does not hold them."""
    if key not in values:
        return ()
    words = values[key].split()
    found = tuple(n for w in words if (n := digits(w)) is not None)
    if len(words) != count or len(found) != count:
        bad.append(f"{key} {shown(values[key], 40)}: not {count} number{'s' * (count > 1)}")
        return ()
    return found


def parse(output: str) -> Report:
    """What the script printed, as a Report; a number line that does not parse is said
    in `unparsed` (a worker's shell or its `df` print what they like)."""
    daemons: dict[str, str | None] = {}
    values: dict[str, str] = {}
    rdma: dict[str, list[tuple[str, ...]]] = {"PORT": [], "GID": []}
    up: list[tuple[int, str]] = []
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        if key in rdma and len(fields := value.split(" ", 3)) == (3 if key == "PORT" else 4):
            rdma[key].append(tuple(fields))
        if key == "IFACE" and len(fields := value.split(" ")) == 3:
            index, name, state = fields
            if (n := digits(index)) is not None and state in ("up", "unknown"):
                up.append((n, name))
        if key == "DAEMON":
            name, _, where = value.partition(" ")
            daemons[name] = None if where == "missing" else where
        elif key in ("LD", "PATH", "PROGRAM", "CLAIM", "SHM", "NCCL", "GPUS", "IMEX"):
            values[key] = value
    bad: list[str] = []
    shm, gpus, imex = (
        _numbers(values, k, n, bad) for k, n in (("SHM", 2), ("GPUS", 1), ("IMEX", 1))
    )
    nccl = values.get("NCCL", "").rsplit(" ", 1)
    return Report(
        ran=bool(daemons),
        daemons=daemons,
        ld=values.get("LD", ""),
        path=values.get("PATH", "?"),
        program=values.get("PROGRAM"),
        claim=values.get("CLAIM"),
        shm=(shm[0], shm[1]) if shm else None,
        nccl=(nccl[0], nccl[1]) if len(nccl) == 2 else None,
        gpus=gpus[0] if gpus else 0,
        ports=tuple(rdma["PORT"]),  # type: ignore[arg-type]
        gids=tuple(rdma["GID"]),  # type: ignore[arg-type]
        imex=imex[0] if imex else None,
        ifaces=tuple(name for _, name in sorted(up)),
        unparsed="; ".join(bad),
    )
