"""Files the agent writes: always atomically, never half-written, never through a symlink."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import tempfile

from mpi_bootstrap.core.errors import ConfigError, WriteError


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never half.

    The temporary file lives in the same directory (same filesystem, so rename is atomic)
    and is removed if anything fails (a full disk, a signal): no half-written file is
    ever left behind. Failures are WriteError (exit 73) naming the path.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        # mkstemp: O_EXCL with a random name, so a planted file or symlink is never followed.
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
        )
    except OSError as exc:
        raise WriteError.of(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError.of(path, exc) from None
        raise


def state_dir(
    path: str, setting: str = "MPI_BOOTSTRAP_STATE_DIR", *, create: bool = True, lock: bool = False
) -> str | None:
    """The agent's private directory, made 0700 and a real directory of this user's
    (someone else's could hold an ssh config whose ProxyCommand ssh runs): the path to
    use for it. One that another user could rename away and replace (`swappable`: an
    emptyDir) is held open, and the path is /proc/PID/fd/N, which reaches the directory
    checked whatever is renamed (SECURITY.md 14; tests/test_attacks.py::TestStateDirSwap).
    `create=False` is for readers (`doctor`, the probe): nothing made or changed, None
    where there is none, a swappable one reached where an agent of this user holds it,
    one others may write refused (tests/test_attacks.py::TestDoctorTrustsNoPlantedFile).
    `lock`: the agent that uses it holds it (`hold`)."""
    if path in _held or os.path.join(path, LOCK) in _held:
        return path
    uid = os.geteuid()
    below = path.startswith(tuple(f"{held}/" for held in _held))  # safe as it is
    problem = None if below else swappable(path, uid)  # before anything is made there
    if not create:
        return _read_only(path, setting, uid, problem)
    if problem is not None and "cannot check" in problem:
        raise ConfigError([f"{setting}: {path}: {problem}"])
    st = _lstat(path, setting, True)
    why = st and _refusal(path, st, uid, problem is None)
    if why:
        raise ConfigError([f"{setting}: {path}{why}"])
    if problem is not None:
        path = _hold_open(path, setting, uid)
    else:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            raise WriteError(
                f"{setting}: cannot make {path} private: {exc.strerror or exc}"
            ) from None
    if lock:
        hold(path, setting)
    return path


def _read_only(path: str, setting: str, uid: int, problem: str | None) -> str | None:
    """state_dir for a reader: the path to read it by, None where there is none."""
    if problem is not None:  # reached where the agent, which checked it, holds it
        found = None if "cannot check" in problem else _holder(path, uid)
        if found is None:
            raise ConfigError([f"{setting}: {path}: {problem}, and no agent holds it open"])
        return found
    st = _lstat(path, setting, False)
    why = st and _refusal(path, st, uid, False)
    if why:
        raise ConfigError([f"{setting}: {path}{why}"])
    return path if st else None


def _hold_open(path: str, setting: str, uid: int) -> str:
    """/proc/PID/fd/N of the directory at `path`, opened (not through a link), checked
    and made 0700 as opened, held for the agent's life (and the resident PID 1's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        st = os.fstat(fd)
        if st.st_uid != uid:  # replaced between its check and this open
            os.close(fd)
            raise ConfigError([f"{setting}: {path} belongs to uid {st.st_uid}, not {uid}"])
        os.fchmod(fd, 0o700)
    except OSError as exc:
        raise WriteError(f"{setting}: cannot hold {path} open: {exc.strerror or exc}") from None
    _held[f"/proc/{os.getpid()}/fd/{fd}"] = fd
    return f"/proc/{os.getpid()}/fd/{fd}"


def _holder(path: str, uid: int) -> str | None:
    """/proc/PID/fd/N by which a process of this user (`_hold_open`) holds `path` open."""
    real = os.path.realpath(path)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid == uid:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = f"/proc/{pid}/fd/{fd}"
                    if os.readlink(link) == real and os.path.isdir(link):
                        return link
    return None


LOCK = ".lock"  # in the state directory: held by the agent (and the PID 1 it becomes)
_held: dict[str, int] = {}  # the locks and directories this process holds open, by path


def hold(path: str, setting: str = "MPI_BOOTSTRAP_STATE_DIR") -> None:
    """Hold the state directory (checked by `state_dir`) for as long as this agent and
    the resident PID 1 it becomes live: an exclusive lock on `path/.lock`. The worker's
    PID 1 serves the sessions of its own sshd through FIFOs found by their path there;
    two pods on one directory (a shared /run or volume) read each other's requests, and
    one's claim ended the other's sessions. Another agent's directory: ConfigError (64)."""
    if os.path.join(path, LOCK) in _held:
        return
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(path, LOCK), flags, 0o600)
    except OSError as exc:
        raise WriteError(f"{setting}: cannot lock {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 200).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            [
                f"{setting}: {path} is in use by another agent ({holder}): every pod needs "
                "a state directory of its own (a volume shared by pods is not one)"
            ]
        ) from None
    _held[os.path.join(path, LOCK)] = fd
    with contextlib.suppress(OSError):  # who holds it, for a second agent's message
        os.ftruncate(fd, 0)
        os.write(fd, f"pod {socket.gethostname()}, pid {os.getpid()}\n".encode())


def keep_held() -> None:
    """What `hold` and `state_dir` hold, kept across an exec (the resident, --exec's mpirun)."""
    for fd in _held.values():
        os.set_inheritable(fd, True)


def _lstat(path: str, setting: str, create: bool) -> os.stat_result | None:
    """The directory (made first, 0700, with `create`), not followed if a link; None
    when it does not exist and nothing is to be made."""
    try:
        if create:
            _make_parents(path)
            with contextlib.suppress(FileExistsError):  # not a directory: said later
                os.mkdir(path, 0o700)
        return os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        raise WriteError(f"{setting}: cannot create {path}: it vanished") from None
    except OSError as exc:
        hint = f": {_EMPTYDIR_AT_TMP}" if exc.errno == errno.EROFS else ""
        raise WriteError(
            f"{setting}: cannot {'create' if create else 'check'} {path}: "
            f"{exc.strerror or exc}{hint}"
        ) from None


def _make_parents(path: str) -> None:
    """The directories above `path` that are missing, made 0755 (never writable by
    others, whatever the umask): os.makedirs gives them the umask's mode."""
    missing = []
    here = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(here):
        missing.append(here)
        here = os.path.dirname(here)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another pod's agent made it first
            os.mkdir(directory, 0o755)


def _refusal(path: str, st: os.stat_result, uid: int, chmod: bool) -> str | None:
    """Why state_dir refuses the directory `st` is of (what follows its path), or None.
    `chmod`: it will be made 0700 by path (else held open, or only read)."""
    if not stat.S_ISDIR(st.st_mode):
        return " is not a directory" + (" (a symlink)" if stat.S_ISLNK(st.st_mode) else "")
    if st.st_uid != uid:
        open_to_all = st.st_uid == 0 and st.st_mode & 0o002
        hint = f" ({_EMPTYDIR_AT_TMP}, or set it below the emptyDir)" if open_to_all else ""
        return f" belongs to uid {st.st_uid}, not to this user ({uid}){hint}"
    if not chmod and st.st_mode & _open_bits(st):
        return (
            f": writable by {_writers(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o}): "
            "another user could have put files there"
        )
    return None


def own_file(path: str) -> bool:
    """Is `path` a regular file (not a link) of this user that nobody else may write?
    For a file another program reads by path (`ssh -F`), in a directory `state_dir`
    has accepted: there, nobody else can replace it after this check."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafeFileError(f"{path} is not a regular file of this user that only it may write")
    return True


# What a pod without a writable place needs: the agent makes its own directory there.
_EMPTYDIR_AT_TMP = (
    "add to the pod spec volumes: [{name: tmp, emptyDir: {}}] and, in the container, "
    "volumeMounts: [{name: tmp, mountPath: /tmp}], and leave MPI_BOOTSTRAP_STATE_DIR unset"
)


def _open_bits(st: os.stat_result) -> int:
    """The mode bits by which someone else may write: others', and the group's but the
    agent's own (OpenShift: an arbitrary uid of gid 0, images made g=u)."""
    return 0o002 if st.st_gid == os.getegid() else 0o022


def _writers(mode: int) -> str:
    """Who besides the owner may write what has `mode` (one of its 0o022 bits set)."""
    return "others" if mode & 0o002 else "group"


def _ancestors(path: str) -> list[str]:
    """Every directory above `path`, nearest first, both as written and as resolved:
    a symlink on the way is only as safe as the directory it sits in, and its target's
    directories must be safe too."""
    out: list[str] = []
    for start in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        here = os.path.dirname(start)
        while True:
            if here not in out:
                out.append(here)
            if here == "/":
                break
            here = os.path.dirname(here)
    return out


def swappable(path: str, uid: int) -> str | None:
    """Why another user could replace `path` (rename it away and put their own in its
    place), or None: a directory above it writable by group or others without the sticky
    bit, or owned by a uid other than root and `uid` (its owner can always rename entries).
    The rule of the state directory (SECURITY.md 14) and of the token file (`foreign`)."""
    for directory in _ancestors(path):
        try:
            st = os.stat(directory)
        except FileNotFoundError:
            continue  # made by the agent itself, 0700
        except OSError as exc:
            return f"cannot check {directory}: {exc.strerror or exc}"
        if st.st_uid not in (0, uid):
            return f"{directory} above it belongs to uid {st.st_uid}, who could replace it"
        if st.st_mode & _open_bits(st) and not st.st_mode & stat.S_ISVTX:
            who = _writers(st.st_mode)
            return (
                f"{directory} above it is writable by {who} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}) without the sticky bit, so "
                f"{'any user' if who == 'others' else 'its group'} could rename it away "
                "and put their own in its place (a Kubernetes emptyDir: kubernetes#110835)"
            )
    return None


def foreign(path: str, st: os.stat_result, uid: int) -> str | None:
    """Why a user but root and `uid` could choose what the file `st` is of (at `path`)
    holds, or None: group or others may write it, another uid owns it (and may write it
    whatever its mode), or a directory of its path, as written or resolved, lets another
    user rename their own file over it (`swappable`). The token file's rule (SECURITY.md)."""
    if st.st_mode & 0o022:
        return f"{_writers(st.st_mode)} may write it ({stat.S_IMODE(st.st_mode):04o})"
    if st.st_uid not in (0, uid):
        return f"it belongs to uid {st.st_uid}, who may write it whatever its mode"
    return swappable(path, uid)


def make_fifo(path: str) -> str:
    """A FIFO of this user's, 0600, made afresh at `path` (a restarted agent's old one
    may remain): the one way the agent makes a FIFO (pid1/control.py, system/gate.py)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.mkfifo(path, 0o600)
    return path


def own_fifo(path: str, flags: int) -> int:
    """Open `path`, which must be a FIFO of this user reached without a link (the data
    control FIFO of a worker's PID 1 and the FIFOs its requests make: pid1/control.py)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path}: not a FIFO of this user")
    return fd


class UnsafeFileError(OSError):
    """A file that is not what the agent may read: not a regular file (a FIFO would block
    the reader forever, a symlink could point anywhere), another user's, or too long."""


def read_regular(
    path: str,
    limit: int,
    *,
    dir_fd: int | None = None,
    owner: int | None = None,
    private: bool = False,
) -> bytes:
    """At most `limit` bytes of `path`, opened without following a symlink and without
    blocking (a FIFO named like a record held the launcher forever), checked on the open
    file (no race between the check and the read): a regular file, owned by `owner` if
    given, writable by nobody else, not readable by others if `private`. More than `limit`
    bytes is an error."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{path} is not a regular file")
        if owner is not None and st.st_uid != owner:
            raise UnsafeFileError(f"{path} belongs to uid {st.st_uid}, not {owner}")
        if st.st_mode & 0o022:
            raise UnsafeFileError(f"{path} is writable by others ({stat.S_IMODE(st.st_mode):04o})")
        if private and st.st_mode & 0o077:
            raise UnsafeFileError(
                f"{path} is readable or writable by others ({stat.S_IMODE(st.st_mode):04o})"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnsafeFileError(f"{path} is longer than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)
