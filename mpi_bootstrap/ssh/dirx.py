"""The `dir` exchange: one directory every pod of the job mounts (a compose volume, an RWX
volume). Standard library only (the worker's resident supervisor reads `job-done`).

    <host>.json  each worker's record, written atomically
    job-key/     the job's key pair (`id`, `id.pub`), made once by the first pod to come
    job-done     `done SHA256:<fingerprint of the job's key>`, after a successful job
    .lock        flock(2): making, adopting and cleaning the key, one pod at a time

What each is accepted as, and how a job is told from the one before it (by its key):
docs/exchanges.md, "The dir exchange" (tests/test_attacks.py::TestDirExchangeReuse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator

from mpi_bootstrap.core.errors import ConfigError, WriteError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import fingerprint, is_dns_name, is_public_key
from mpi_bootstrap.core.records import DONE_FILE, KEY_DIR, MAX_MESSAGE, Record, RecordError, decode
from mpi_bootstrap.system.files import atomic_write, read_regular
from mpi_bootstrap.system.retry import LOCAL, retry_until

LOCK_FILE = ".lock"
LOCK_SECONDS = 10.0
MAX_KEY = 64 * 1024
SETTING = "MPI_BOOTSTRAP_EXCHANGE_DIR"


@dataclasses.dataclass(frozen=True)
class JobKey:
    """The job's key pair as read from `job-key/` (the private text never logged)."""

    private: str = dataclasses.field(repr=False)
    public: str
    fingerprint: str


class DirExchange:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.uid = os.geteuid()

    # ------------------------------------------------------------ records

    def path(self, host: str) -> str:
        if not is_dns_name(host) or host.endswith("."):
            raise RecordError(f"{host!r} is not a hostname")
        return os.path.join(self.dir, f"{host}.json")

    def publish(self, record: Record) -> str:
        path = self.path(record.host)
        atomic_write(path, json.dumps(record.to_dict()) + "\n", 0o644)
        return path

    def withdraw(self, host: str) -> None:
        """Remove `host`'s record (a restarting worker's old port is no use to anyone)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(host))

    def _load(self, path: str) -> Record | None:
        """The record in `path`; None if absent; RecordError if it is not a record."""
        try:
            raw = read_regular(path, MAX_MESSAGE, owner=self.uid)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RecordError(f"{path}: {exc}") from None
        return decode(raw, path)

    def read(self, host: str) -> Record | None:
        """The record for `host` (its full name, or the first label), or None if absent.
        A record whose `host` is not the name it is filed under is refused."""
        for name in dict.fromkeys([host, host.split(".", 1)[0]]):
            record = self._load(self.path(name))
            if record is not None:
                if record.host.lower() != name.lower():
                    raise RecordError(
                        f"{self.path(name)}: its record is for {record.host!r}, not {name!r}"
                    )
                return record
        return None

    def read_by_address(self, address: str) -> Record | None:
        for entry in sorted(os.listdir(self.dir)):
            if entry.endswith(".json"):
                with contextlib.suppress(RecordError):
                    record = self._load(os.path.join(self.dir, entry))
                    if record is not None and address in record.addresses:
                        return record
        return None

    # ------------------------------------------------------------ the job's key

    def job_key(self, make: Callable[[str], str], log: Log) -> JobKey:
        """The job's key, made now if there is none (or only a finished job's).

        `make(path)` writes a new private key at `path` (and path.pub) and returns the
        public key. Both go into a fresh directory renamed to `job-key`, so a reader that
        takes no lock never sees half a key pair.
        """
        with self._lock():
            key = self._read_key()
            done = self._done_fingerprint()
            if key is not None and done == key.fingerprint:
                log(
                    "exchange dir reset",
                    dir=self.dir,
                    finished_job=key.fingerprint,
                    reason="job-done names this key: its job is over; its records, key "
                    "and mark are removed and a new key is made",
                )
                self._clean()
                key = None
            elif done is not None:
                log("stale job-done removed", dir=self.dir, names=done)
                self._unlink(DONE_FILE)
            if key is None:
                key = self._make(make)
                log("job key made", dir=self.dir, fingerprint=key.fingerprint)
            return key

    def peek_job_key(self) -> JobKey | None:
        """The current job's key if there is one (no lock, nothing written: --explain,
        doctor); None if there is none yet or only a finished job's."""
        key = self._read_key()
        if key is not None and self._done_fingerprint() == key.fingerprint:
            return None
        return key

    def _read_key(self) -> JobKey | None:
        path = os.path.join(self.dir, KEY_DIR)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP (a symlink), ENOTDIR (a file)
            raise self._refuse(path, f"not a directory of its own ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if st.st_uid != self.uid:
                raise self._refuse(
                    path, f"it belongs to uid {st.st_uid}, not to this user ({self.uid})"
                )
            if stat.S_IMODE(st.st_mode) != 0o700:
                raise self._refuse(path, f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700")
            try:
                private = read_regular(
                    "id", MAX_KEY, dir_fd=fd, owner=self.uid, private=True
                ).decode()
                public = read_regular("id.pub", MAX_KEY, dir_fd=fd, owner=self.uid).decode()
            except (OSError, UnicodeDecodeError) as exc:
                raise self._refuse(
                    path, f"its key files are not this user's private files ({exc})"
                ) from None
        finally:
            os.close(fd)
        public = " ".join(public.split()[:2])
        if not is_public_key(public):
            raise self._refuse(path, "id.pub is not an OpenSSH public key")
        return JobKey(private, public, fingerprint(public))

    def _refuse(self, path: str, why: str) -> ConfigError:
        return ConfigError(
            [
                f"{SETTING}: refusing {path}: {why} — another user may have "
                "made it, and the workers would let its owner log in; remove "
                "it, and make the exchange directory writable by the job's "
                "user only"
            ]
        )

    def _done_fingerprint(self) -> str | None:
        """The key fingerprint `job-done` names; None if there is no (usable) mark."""
        try:
            text = read_regular(os.path.join(self.dir, DONE_FILE), 256, owner=self.uid).decode(
                "ascii"
            )
        except (OSError, UnicodeDecodeError):
            return None
        words = text.split()
        return words[1] if len(words) == 2 and words[0] == "done" else "(unreadable)"

    def _make(self, make: Callable[[str], str]) -> JobKey:
        final = os.path.join(self.dir, KEY_DIR)
        tmp = os.path.join(self.dir, f".{KEY_DIR}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp, 0o700)
        except OSError as exc:
            raise WriteError(
                f"{SETTING}: cannot create the job's key in {self.dir}: {exc.strerror or exc}"
            ) from None
        try:
            os.chmod(tmp, 0o700)  # whatever the umask
            make(os.path.join(tmp, "id"))
            try:
                os.rename(tmp, final)
            except OSError as exc:
                raise WriteError(
                    f"{SETTING}: cannot create {final}: {exc.strerror or exc}"
                ) from None
        finally:
            if os.path.isdir(tmp):
                for name in os.listdir(tmp):
                    os.unlink(os.path.join(tmp, name))
                os.rmdir(tmp)
        key = self._read_key()
        assert key is not None  # noqa: S101 - just renamed into place, under the lock
        return key

    def _clean(self) -> None:
        """Remove a finished job's records, key and mark (the mark last: an interrupted
        clean is finished by the next pod)."""
        for entry in os.listdir(self.dir):
            if entry.endswith(".json"):
                self._unlink(entry)
        key_dir = os.path.join(self.dir, KEY_DIR)
        for name in ("id", "id.pub"):
            self._unlink(os.path.join(KEY_DIR, name))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(key_dir)
        self._unlink(DONE_FILE)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self.dir, name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise WriteError(
                f"{SETTING}: cannot remove {os.path.join(self.dir, name)}: {exc.strerror or exc}"
            ) from None

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        path = os.path.join(self.dir, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse(path, "it is a symlink") from None
            raise WriteError(f"{SETTING}: cannot open {path}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid:
                raise self._refuse(
                    path, f"it is not a regular file of this user's (uid {st.st_uid})"
                )

            def take() -> bool | None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None
                return True

            if not retry_until(time.monotonic() + LOCK_SECONDS, take, every=LOCAL):
                raise WriteError(f"{SETTING}: {path} stayed locked for {LOCK_SECONDS:g} s")
            yield
        finally:
            os.close(fd)  # releases the lock
