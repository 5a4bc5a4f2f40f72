"""The worker role: keys, a private sshd, the record, then the resident supervisor.

state dir → keys → sshd_config → sshd answers → record published → hand-off
(the supervisor keeps sshd alive, serves the net exchange, exits 0 on SIGTERM or
when the launcher marks the job done)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from mpi_bootstrap.core import datanet, nccl, records
from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError, ExitStatus
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import fingerprint
from mpi_bootstrap.core.settings import DATA_IFACE_CANDIDATES
from mpi_bootstrap.core.spec import Restart, Spec, Watch
from mpi_bootstrap.dataplane import probe as dataprobe
from mpi_bootstrap.pid1 import restart
from mpi_bootstrap.proc.handoff import handoff
from mpi_bootstrap.ssh import keys, sides, sshd
from mpi_bootstrap.ssh.sides import Identity
from mpi_bootstrap.system import account, netif
from mpi_bootstrap.system.files import atomic_write, make_fifo, read_regular, state_dir

RECORD_FILE = "record.json"
CONTROL_FIFO = "control"  # launchers' claims (pid1/watch.py), in the state directory


def mounted_keys(config: Config) -> tuple[keys.KeyPair, list[tuple[str, str]]] | None:
    """The key Secret at MPI_BOOTSTRAP_SSH_AUTH_DIR — read with `secret` and `none`, and
    otherwise only when the directory was set explicitly. Its default (~/.ssh) may hold
    keys baked into the image, which everyone who can pull the image has: `net` and
    `dir` bring their own key and never authorise those silently."""
    if not config.ex.mounted and config.source("ssh_auth_dir").kind == "default":
        return None
    return keys.from_secret(config.ssh_auth_dir, config.state_dir)


def needs_exchange(config: Config) -> None:
    """A worker with no way to learn the launcher's key is refused before anything is
    written (its state directory, its host key), saying what it looked for."""
    if config.ex.keyed or mounted_keys(config) is not None:
        return
    where = (
        f"`auto` found none: {config.exchange_reason.removeprefix('auto: ')}"
        if config.source("exchange").kind == "default"
        else f"{config.source('exchange')} is none and nothing is mounted at {config.ssh_auth_dir}"
    )
    raise ConfigError(
        [
            f"the worker has no exchange ({where}); it needs one to authorise the launcher's "
            f"key: secret (the MPIJob's ssh Secret mounted at {config.ssh_auth_dir}, as MPI "
            "Operator does; MPI_BOOTSTRAP_SSH_AUTH_DIR names another path), dir "
            "(MPI_BOOTSTRAP_EXCHANGE_DIR: a volume shared with the launcher) or net "
            "(MPI_BOOTSTRAP_TOKEN_FILE: the same token as the launcher's, from a Secret "
            "volume)"
        ]
    )


def identity(config: Config, log: Log) -> Identity:
    """Keys for this start: the host key, and the client keys sshd will authorise."""
    return sides.of(config.ex).identity(config, mounted_keys(config), log)


def sshd_argv(config: Config, config_path: str) -> list[str]:
    return [config.sshd, "-D", "-e", "-f", config_path]


def _authorize(state: str, ident: Identity, log: Log) -> str:
    """Write authorized_keys; log every key that may log in, and why."""
    path = os.path.join(state, "authorized_keys")
    atomic_write(path, "".join(k + "\n" for k, _ in ident.authorized), 0o600)
    for key, origin in ident.authorized:
        log("key authorized", fingerprint=fingerprint(key), key_type=key.split()[0], origin=origin)
    return path


def _listen(config: Config, log: Log) -> tuple[list[str], str, str]:
    """(addresses sshd listens on, address to probe, address to bind the exchange to)."""
    addresses = netif.addresses(config.control_iface, link_local=False)
    if addresses:
        return addresses, addresses[0], addresses[0]
    log(
        "control interface missing",
        level="warning",
        iface=config.control_iface,
        reason="sshd listens on all addresses",
    )
    return [], "127.0.0.1", "0.0.0.0"  # noqa: S104 - no control interface: listen on all


def _publish(
    config: Config,
    record: records.Record,
    ident: Identity,
    bind_addr: str,
    *,
    authorized_path: str,
    log: Log,
) -> Spec:
    """Make the record known to the launcher; what the resident PID 1 must keep doing
    (the spec's `stop` and `net`, to be completed by the caller)."""
    spec = sides.of(config.ex).publish(
        config, record, ident, bind=bind_addr, authorized=authorized_path, log=log
    )
    # The local copy is what `mpi-bootstrap probe` checks (it is also the dir record).
    atomic_write(
        os.path.join(config.state_dir, RECORD_FILE), json.dumps(record.to_dict()) + "\n", 0o644
    )
    return spec


def data_nic(
    config: Config, environ: Mapping[str, str], log: Log
) -> tuple[datanet.DataNIC | None, tuple[str, ...]]:
    """This pod's data NIC for its record: the first interface NCCL would use here other
    than the control interface, by the rule the launcher applies (core/nccl.py: this
    pod's NCCL_SOCKET_IFNAME, else MPI_BOOTSTRAP_DATA_IFACE, else the first of net1,
    dranet0 present; None without one); and the interfaces NCCL could use here, in its
    order, to which the launcher applies the ranks' own NCCL_SOCKET_IFNAME."""
    names = tuple(n for n in netif.nccl_order() if datanet.NIC_NAME.fullmatch(n))[
        : datanet.MAX_IFACES
    ]
    rule = nccl.rule(config.data_iface, environ, names, DATA_IFACE_CANDIDATES)
    nics, why = rule.select(names)
    data = nccl.data_of(nics, config.control_iface)
    log("data interfaces", nics=list(nics), rule=why, have=list(names))
    if not data:
        return None, names
    report = dataprobe.nic_report(data[0], config.sysfs)
    if "error" in report:
        log("data NIC missing", level="warning", nic=data[0], have=report.get("have"))
        return None, names
    found = datanet.DataNIC(
        data[0], tuple(report["addresses"])[:16], int(report["mtu"]), tuple(report["rdma"])[:16]
    )
    log(
        "data NIC",
        nic=data[0],
        mtu=found.mtu,
        addresses=list(found.addresses),
        rdma=list(found.rdma),
        memlock=report["memlock"],
    )
    return found, names


def control_fifo(
    config: Config, openssh: tuple[int, int] | None, log: Log, own_server: bool = False
) -> str | None:
    """The FIFO through which PID 1 serves ssh sessions (pid1/control.py: the claims of
    launchers, the data check), where its ssh server can name it to the sessions (the
    agent's own, or OpenSSH `openssh`'s `SetEnv`); else no launcher can claim this worker
    nor check its data NIC."""
    if not own_server and not sshd.takes_setenv(openssh):
        log(
            "no SetEnv",
            level="warning",
            sshd=config.sshd,
            reason=f"sshd older than OpenSSH {'.'.join(map(str, sshd.SETENV_SINCE))} has no "
            "SetEnv: no launcher can claim this worker (no liveness) nor check its data NIC",
        )
        return None
    return make_fifo(os.path.join(config.state_dir, CONTROL_FIFO))


def start(config: Config, environ: Mapping[str, str], log: Log) -> NoReturn:
    """Keys, a private sshd, the record published, then the resident PID 1 (module
    docstring)."""
    needs_exchange(config)
    own_server = _server(config, log)
    # Nothing is written before this.
    config, environ = account.settle(config, environ, log, needs_entry=not own_server)
    state = config.state_dir
    for warning in config.token_warnings:
        log("token exposed", level="warning", reason=warning)
    ident = identity(config, log)
    authorized_path = _authorize(state, ident, log)
    listen, probe_addr, bind_addr = _listen(config, log)
    if os.geteuid() == 0 and not own_server:
        _privsep_dir()
    nic, ifaces = data_nic(config, environ, log)
    openssh = None if own_server else sshd.version(config.sshd)
    control = control_fifo(config, openssh, log, own_server)
    env = {k: v for k, v in environ.items() if not k.startswith("MPI_BOOTSTRAP_")}
    short = socket.gethostname().split(".")[0]
    sides.of(config.ex).withdraw(config, short)
    keys_at = {
        "listen": tuple(listen),
        "host_key": ident.host_key_path,
        "authorized_keys": authorized_path,
        "user": account.user(),
        "control": control,
    }
    argv_for = _argv_for(config, own_server, keys_at)
    pid, port, argv = sshd.start(
        argv_for,
        env,
        fixed_port=config.sshd_port or 0,
        probe_address=probe_addr,
        bind_address=bind_addr,
        log=log,
        # The agent's own imports paramiko first (0.2 s of CPU): 64 pods starting on
        # 2 cores took more than sshd's 10 s.
        timeout=30.0 if own_server else 10.0,
    )
    record = records.Record(
        host=short,
        addresses=tuple(listen),
        port=port,
        host_key=ident.host_key_public,
        user=account.user(),
        data=nic,
        ifaces=ifaces,
        openssh=".".join(map(str, openssh)) if openssh else None,
        server="agent" if own_server else None,
    )
    duties = _publish(config, record, ident, bind_addr, authorized_path=authorized_path, log=log)
    grace, leave = config.launcher_grace_seconds, config.exit_on_launcher_loss
    address = probe_addr if listen else bind_addr
    watch = Watch(address, port, grace, leave) if control else None
    _supervise(config, duties, argv=argv, env=env, pid=pid, control=control, watch=watch)


def _argv_for(
    config: Config, own_server: bool, keys_at: dict[str, Any]
) -> Callable[[int], list[str]]:
    """The ssh server's argv for a port, its settings written first: OpenSSH's sshd, or
    the agent's own with the same keys, user, addresses and FIFO (`keys_at`)."""
    if own_server:
        from mpi_bootstrap.ssh import server  # paramiko: imported only where it serves

        return functools.partial(
            _server_argv, config, functools.partial(server.Settings, **keys_at)
        )
    pid_file = os.path.join(config.state_dir, "sshd.pid")
    settings = functools.partial(
        sshd.config_text, pid_file=pid_file, **{**keys_at, "listen": list(keys_at["listen"])}
    )
    return functools.partial(_sshd_argv, config, settings)


def _supervise(
    config: Config,
    duties: Spec,
    *,
    argv: list[str],
    env: dict[str, str],
    pid: int,
    control: str | None,
    watch: Watch | None,
) -> NoReturn:
    """sshd, running (`pid`), handed to the resident PID 1 with the worker's duties."""
    handoff(
        dataclasses.replace(
            duties,
            argv=tuple(argv),
            env=env,
            role="worker",
            grace=config.grace_seconds,
            log_level=config.log_level,
            log_format=config.log_format,
            restart=Restart(restart.LIMIT, restart.WINDOW),
            adopt=pid,
            termination=config.termination(),
            control=control,
            watch=watch,
        )
    )


def _privsep_dir(path: str = "/run/sshd") -> None:
    """OpenSSH's privilege-separation directory: root's sshd needs it, at this path."""
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise ConfigError([
            f"root's sshd needs {path} and the agent cannot make it ({exc.strerror}): make "
            f"it in the image (RUN mkdir -p {path}, as container/Dockerfile does), or add "
            "to the pod spec volumes: [{name: sshd-privsep, emptyDir: {}}] and, in the "
            f"container, volumeMounts: [{{name: sshd-privsep, mountPath: {path}}}]"
        ]) from None  # fmt: skip


def _server(config: Config, log: Log) -> bool:
    """Whether this worker serves ssh itself (ssh/server.py) rather than run OpenSSH's
    sshd: as set, or (`auto`) where the image has no usable sshd — none at --sshd, or
    root's without /run/sshd, which it cannot make (a read-only root)."""
    why = f"MPI_BOOTSTRAP_SSH_SERVER={config.ssh_server}"
    if config.ssh_server == "auto":
        if not os.access(config.sshd, os.X_OK):
            why = f"auto: {config.sshd} is not executable"
        elif os.geteuid() == 0 and not _can_make("/run"):
            why = "auto: root's sshd needs /run/sshd, and it cannot be made"
        else:
            log("ssh server", server="openssh", sshd=config.sshd, reason="auto: it is there")
            return False
    own = config.ssh_server != "openssh"
    log("ssh server", server="agent" if own else "openssh", reason=why)
    return own


def _can_make(parent: str, name: str = "sshd") -> bool:
    """Whether `parent/name` is a directory, or could be made (nothing is made here)."""
    return os.path.isdir(os.path.join(parent, name)) or os.access(parent, os.W_OK | os.X_OK)


def _server_argv(config: Config, settings: Callable[..., Any], port: int) -> list[str]:
    """The agent's own server's argv for `port`, its settings written first."""
    path = os.path.join(config.state_dir, "ssh_server.json")
    atomic_write(path, settings(port=port).to_json(), 0o600)
    # Where this process found the agent, first on the server's path: an image may run it
    # from a directory its python does not search by itself (a script that adds it).
    where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-c", _SERVER_MAIN, os.path.dirname(where), path]


_SERVER_MAIN = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from mpi_bootstrap.ssh.server import main; sys.exit(main(sys.argv[1:]))"
)


def _sshd_argv(config: Config, settings: Callable[..., str], port: int) -> list[str]:
    """sshd's argv for `port`, its config written first (`settings`: the rest of it)."""
    path = os.path.join(config.state_dir, "sshd_config")
    atomic_write(path, settings(port=port), 0o600)
    return sshd_argv(config, path)


def probe(config: Config) -> int:
    """Readiness: 0 once this worker's record is published and its sshd listens (checked
    without connecting: sshd logs every connection). The record is read only from a
    state directory the worker would accept, and only as this user's own file: one
    planted there by someone else would make a failed worker look ready."""
    try:
        state = state_dir(config.state_dir, create=False)
        if state is None:
            print(f"not ready: no state directory {config.state_dir} yet")
            return int(ExitStatus.PEER_UNAVAILABLE)
        raw = read_regular(
            os.path.join(state, RECORD_FILE), records.MAX_MESSAGE, owner=os.geteuid()
        )
        record = records.decode(raw, RECORD_FILE)
    except ConfigError as exc:
        print(f"not ready: the state directory is refused: {'; '.join(exc.problems)}")
        return int(ExitStatus.PEER_UNAVAILABLE)
    except (OSError, records.RecordError) as exc:
        print(f"not ready: no record yet ({exc})")
        return int(ExitStatus.PEER_UNAVAILABLE)
    if why := sides.of(config.ex).unpublished(config, record):
        print(f"not ready: {why}")
        return int(ExitStatus.PEER_UNAVAILABLE)
    address = record.addresses[0] if record.addresses else "127.0.0.1"
    # (By port only: a probe may run in a PID namespace of its own, where sshd's PID is
    # not to be seen.)
    if not sshd.listening(record.port):
        print(f"not ready: nothing listens on port {record.port}")
        return int(ExitStatus.PEER_UNAVAILABLE)
    server = "the agent's ssh server" if record.server else "sshd"
    print(f"ready: {server} on {address}:{record.port}")
    return 0
