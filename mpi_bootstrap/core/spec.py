"""What the agent hands the resident PID 1 (proc/handoff.py → pid1/resident.py): one
frozen, typed spec instead of loose string keys, so that mypy sees both sides of the
exec. It travels as JSON in a memfd; `decode` rebuilds it field by field and refuses
anything that is not of the declared type (a spec is ours, but a typo must fail at the
hand-off, not in the middle of a job). Pure; standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar, Union


@dataclasses.dataclass(frozen=True)
class Termination:
    """Where the termination message goes (system/termlog.py), and whether to create it."""

    path: str
    create: bool


@dataclasses.dataclass(frozen=True)
class Restart:
    """The worker's sshd is a service: restarted at most `limit` times in `window` s."""

    limit: int
    window: float


@dataclasses.dataclass(frozen=True)
class Marker:
    """A file whose text says something (the dir exchange's `job-done`): the worker
    stops when it reads `text` there; the launcher writes `text` there on success."""

    path: str
    text: str


@dataclasses.dataclass(frozen=True)
class NetExchange:
    """The worker's `net` exchange (ssh/netserver.py): its listening socket's descriptor,
    the token, its record, and the authorized_keys file a hello writes."""

    fd: int
    token: str = dataclasses.field(repr=False)
    record: dict[str, Any]
    authorized_keys: str
    base_keys: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Peer:
    """A worker the launcher watches (core/liveness.py): its watch's UDP endpoint, its
    boot id, and its sshd's port (what a confirmation connects to)."""

    name: str
    address: str
    port: int
    boot: str
    sshd_port: int


@dataclasses.dataclass(frozen=True)
class Monitor:
    """The launcher's side of liveness (pid1/monitor.py)."""

    key: str = dataclasses.field(repr=False)
    bound: float
    bind: str
    peers: tuple[Peer, ...]


@dataclasses.dataclass(frozen=True)
class Watch:
    """The worker's side of liveness (pid1/watch.py): the address its UDP socket binds,
    the grace after a lost launcher (the bound comes with each launcher's claim)."""

    bind: str
    sshd_port: int
    grace: float
    exit_on_loss: bool


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything the resident PID 1 needs: the main child (or the one to adopt) and the
    duties it carries beside it."""

    argv: tuple[str, ...]
    env: dict[str, str]
    role: str = "launcher"
    grace: float = 10.0
    group: bool = False
    log_level: str = "info"
    log_format: str = "json"
    inherited: tuple[int, ...] | None = None  # signals the agent was started with ignored
    adopt: int | None = None  # a child already running (it survives the exec)
    stderr_fd: int | None = None  # its stderr pipe's read end
    tty: bool = False  # it holds the terminal
    explain_failure: bool = False  # tee its stderr and explain a known failure
    restart: Restart | None = None
    stop: Marker | None = None  # worker: stop when this says so
    done: Marker | None = None  # launcher: write this after a success
    termination: Termination | None = None
    net: NetExchange | None = None
    control: str | None = None  # a worker's control FIFO (pid1/control.py)
    gate_dir: str | None = None  # the launch gate's marks, removed at the end
    monitor: Monitor | None = None
    watch: Watch | None = None


def encode(spec: Spec) -> bytes:
    return json.dumps(dataclasses.asdict(spec)).encode()


T = TypeVar("T")


def decode(data: bytes | str, cls: type[T] = Spec) -> T:  # type: ignore[assignment]
    """The spec `encode` wrote; ValueError naming the field that is not as declared."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"the hand-off spec is not JSON: {exc}") from None
    return typing.cast(T, _value(cls, raw, cls.__name__))


def _value(kind: Any, raw: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if raw is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _value(inner[0], raw, where)
    if dataclasses.is_dataclass(kind):
        return _dataclass(kind, raw, where)
    if origin is tuple:
        item = typing.get_args(kind)[0]
        if not isinstance(raw, list):
            raise ValueError(f"{where}: not a list")
        return tuple(_value(item, v, f"{where}[{i}]") for i, v in enumerate(raw))
    if origin is dict:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: not an object")
        value_kind = typing.get_args(kind)[1]
        return {str(k): _value(value_kind, v, f"{where}.{k}") for k, v in raw.items()}
    return _scalar(kind, raw, where)


def _scalar(kind: Any, raw: Any, where: str) -> Any:
    if kind is Any:
        return raw
    if kind is float and type(raw) in (int, float):
        return float(raw)
    if kind in (int, str, bool) and type(raw) is kind:
        return raw
    raise ValueError(f"{where}: {raw!r} is not {getattr(kind, '__name__', kind)}")


def _dataclass(cls: Any, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: not an object")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    return cls(
        **{name: _value(hints[name], value, f"{where}.{name}") for name, value in raw.items()}
    )
