"""The agent's own SSH-2 server, for workers whose image has no usable OpenSSH sshd
(`MPI_BOOTSTRAP_SSH_SERVER`, docs/configuration.md "The worker's ssh server"). The worker
starts it where it would start sshd, on the same port with the same host key and the
same authorized keys, and its resident PID 1 supervises it as it would sshd
(worker/main.py). paramiko does the protocol; what is served is ours and is tested
(tests/test_ssh_server.py), as paramiko's maintainers do not support server use.

    python -m mpi_bootstrap.ssh.server CONFIG_JSON

It serves exactly what mpirun's remote starts need, and nothing else (SECURITY.md 40):
- public-key login only, as the one user, with a key of `authorized_keys`;
- `session` channels (a bounded number per connection), each taking `env` requests
  for the variables OpenSSH's `AcceptEnv` lets through (core/env.py ACCEPT_ENV) and one
  `exec`: `/bin/sh -c COMMAND` in a session of its own, with the server's environment
  (the container's) less the loader's and the shell's start-up variables, the channel's
  accepted ones, and the control FIFO (what sshd's `SetEnv` names); stdin, stdout and
  stderr relayed; `exit-status`, or `exit-signal` when the command was killed;
- no pty, shell, subsystem, forwarding of any kind, password or keyboard-interactive;
- bounded: the time before login, connections at once (per peer and in all), channels
  per connection; a channel closed while its command runs ends the command's process
  group after a grace (a daemon that left it, as `orted --daemonize` does, is PID 1's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from mpi_bootstrap.core.env import ACCEPT_ENV
from mpi_bootstrap.core.remote import CONTROL_ENV, SERVER_BANNER

# paramiko's ssh_config support imports `invoke` (for `Match exec`), which a server never
# uses: 130 ms and 7 MB of every worker's start, spared.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]
import paramiko  # noqa: E402
from paramiko.common import (  # noqa: E402
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_FAILED_RESOURCE_SHORTAGE,
    OPEN_SUCCEEDED,
)

AUTH_SECONDS = 10  # from the connection to a login
PER_PEER = 32  # connections at once from one address
CONNECTIONS = 512  # connections at once
CHANNELS = 64  # sessions open at once on one connection
GRACE = 2.0  # a channel closed: its command's group gets this long after SIGTERM
CHUNK = 32768
# Never passed on from the container's environment: what makes the loader or a shell run
# code. Its library path stays (CUDA images set it); a client's variables are only those
# AcceptEnv names, as with sshd (LD_LIBRARY_PATH among them: hydra's proxies need it).
DROPPED = ("LD_", "BASH_ENV", "ENV", "BASH_FUNC_", "PROMPT_COMMAND", "PS4", "SHELLOPTS")
KEPT = ("LD_LIBRARY_PATH",)


@dataclasses.dataclass(frozen=True)
class Settings:
    port: int
    listen: tuple[str, ...]  # addresses ("": every address)
    host_key: str  # path of the private key
    authorized_keys: str  # path: "type base64 [comment]" lines
    user: str
    control: str | None = None  # the worker's control FIFO, named to every session

    @classmethod
    def read(cls, path: str) -> Settings:
        with open(path, encoding="utf-8") as fh:
            raw: dict[str, Any] = json.load(fh)
        return cls(
            int(raw["port"]),
            tuple(str(a) for a in raw["listen"]),
            str(raw["host_key"]),
            str(raw["authorized_keys"]),
            str(raw["user"]),
            raw.get("control"),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self)) + "\n"


def host_key(path: str) -> paramiko.PKey:
    """The host key, whatever its type (the agent's ed25519, the Secret's RSA or ECDSA)."""
    return paramiko.PKey.from_path(path)


def authorized(path: str) -> frozenset[str]:
    """The authorized keys as `type base64`, read at each login (a `net` hello rewrites
    the file while the server runs)."""
    with open(path, encoding="utf-8") as fh:
        return frozenset(" ".join(line.split()[:2]) for line in fh if line.strip())


def session_env(base: Mapping[str, str], asked: Mapping[str, str], s: Settings) -> dict[str, str]:
    """A command's environment: the container's less what makes code run, the variables
    the client sent that AcceptEnv lets through, the login's own, and the control FIFO."""
    env = {k: v for k, v in base.items() if k in KEPT or not k.startswith(DROPPED)}
    env.update(asked)  # what AcceptEnv lets through (_Login.check_channel_env_request)
    env.update({"USER": s.user, "LOGNAME": s.user, "SHELL": "/bin/sh"})
    env.setdefault("HOME", "/")
    if s.control:
        env[CONTROL_ENV] = s.control
    return env


class _Login(paramiko.ServerInterface):
    """What one connection may do (module docstring)."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.lock = threading.Lock()
        self.channels = 0  # open now: a channel's end gives its place back (done)
        self.env: dict[int, dict[str, str]] = {}
        self.execs: dict[int, str] = {}  # by channel: Server.channels polls it

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        offered = f"{key.get_name()} {key.get_base64()}"
        try:
            ok = username == self.s.user and offered in authorized(self.s.authorized_keys)
        except OSError:
            ok = False
        return AUTH_SUCCESSFUL if ok else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind != "session":
            return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        with self.lock:
            if self.channels >= CHANNELS:
                return OPEN_FAILED_RESOURCE_SHORTAGE
            self.channels += 1
        return OPEN_SUCCEEDED

    def done(self, channel: paramiko.Channel) -> None:
        with self.lock:
            self.channels -= 1
            self.env.pop(channel.get_id(), None)
            self.execs.pop(channel.get_id(), None)

    def check_channel_env_request(
        self, channel: paramiko.Channel, name: bytes, value: bytes
    ) -> bool:
        key, text = _text(name), _text(value)
        if key is None or text is None or not any(fnmatch.fnmatchcase(key, p) for p in ACCEPT_ENV):
            return False
        self.env.setdefault(channel.get_id(), {})[key] = text
        return True

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = _text(command)
        if text is None or channel.get_id() in self.execs:
            return False
        self.execs[channel.get_id()] = text
        return True

    def check_global_request(self, kind: str, msg: paramiko.Message) -> bool:
        return False  # keepalive@openssh.com: a failure reply is an answer


def _text(raw: bytes | str) -> str | None:
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def _exit_signal(channel: paramiko.Channel, signum: int) -> None:
    """RFC 4254's `exit-signal`, which paramiko has no call for."""
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    m.add_int(channel.remote_chanid)
    m.add_string("exit-signal")
    m.add_boolean(False)
    m.add_string(signal.Signals(signum).name.removeprefix("SIG"))
    m.add_boolean(False)
    m.add_string("")
    m.add_string("")
    transport = channel.get_transport()
    if transport is not None:  # paramiko's one way to send a request it has no call for
        transport._send_user_message(m)  # type: ignore[attr-defined]


def _copy_in(channel: paramiko.Channel, proc: subprocess.Popen[bytes]) -> None:
    """The client's stdin into the command's, until either ends."""
    assert proc.stdin is not None  # noqa: S101 - PIPE
    with contextlib.suppress(OSError, EOFError):
        while data := channel.recv(CHUNK):
            proc.stdin.write(data)
            proc.stdin.flush()
    with contextlib.suppress(OSError):
        proc.stdin.close()


def _copy_out(fd: int, send: Any) -> None:
    with contextlib.suppress(OSError, EOFError):
        while data := os.read(fd, CHUNK):
            send(data)


def run(channel: paramiko.Channel, command: str, env: dict[str, str]) -> None:
    """One exec: the command in a session of its own, relayed until it ends; then its
    status. The channel closed first (the client gone): its group ended after GRACE."""
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=env,
            cwd=env.get("HOME", "/") if os.path.isdir(env.get("HOME", "/")) else "/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        channel.sendall_stderr(f"mpi-bootstrap: cannot run /bin/sh: {exc}\n".encode())
        channel.send_exit_status(127)
        channel.close()
        return
    assert proc.stdout is not None and proc.stderr is not None  # noqa: S101 - PIPE
    threading.Thread(target=_copy_in, args=(channel, proc), daemon=True).start()
    outs = [
        threading.Thread(target=_copy_out, args=(proc.stdout.fileno(), channel.sendall)),
        threading.Thread(target=_copy_out, args=(proc.stderr.fileno(), channel.sendall_stderr)),
    ]
    for t in outs:
        t.daemon = True
        t.start()
    while proc.poll() is None:
        transport = channel.get_transport()
        if channel.closed or transport is None or not transport.is_active():
            _end_group(proc)
            break
        time.sleep(0.05)
    code = proc.wait()
    for t in outs:
        t.join(GRACE)
    with contextlib.suppress(OSError, EOFError):
        if code < 0:
            _exit_signal(channel, -code)
        else:
            channel.send_exit_status(code)
        channel.shutdown_write()
        channel.close()


def _session(ch: paramiko.Channel, command: str, env: dict[str, str], login: _Login) -> None:
    try:
        run(ch, command, env)
    finally:
        login.done(ch)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """The command's process group: SIGTERM, then SIGKILL after GRACE."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _offer_rfc_names(transport: paramiko.Transport) -> None:
    """curve25519-sha256 by its RFC 8731 name too, the one the launcher's ssh config
    offers (core/kex.py): paramiko knows only the libssh name of the same exchange (the
    name is not part of what is hashed)."""
    info = dict(getattr(transport, "_kex_info", {}))  # paramiko's table of exchanges
    if "curve25519-sha256" not in info and "curve25519-sha256@libssh.org" in info:
        info["curve25519-sha256"] = info["curve25519-sha256@libssh.org"]
        setattr(transport, "_kex_info", info)  # noqa: B010 - a private attribute
        kex = transport.get_security_options().kex
        transport.get_security_options().kex = (
            ("curve25519-sha256", *kex)
            if kex[0] != "mlkem768x25519-sha256"
            else (kex[0], "curve25519-sha256", *kex[1:])
        )


class Server:
    def __init__(self, s: Settings, env: Mapping[str, str]) -> None:
        self.s, self.env = s, dict(env)
        self.key = host_key(s.host_key)
        self.lock = threading.Lock()
        self.peers: dict[str, int] = {}

    def listeners(self) -> list[socket.socket]:
        out = []
        for address in self.s.listen or ("",):
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, self.s.port))
            sock.listen(128)
            out.append(sock)
        return out

    def serve(self) -> None:
        socks = self.listeners()
        while True:
            ready, _, _ = select.select(socks, [], [])
            for sock in ready:
                with contextlib.suppress(OSError):
                    conn, peer = sock.accept()
                    self.take(conn, str(peer[0]))

    def take(self, conn: socket.socket, peer: str) -> None:
        with self.lock:
            total = sum(self.peers.values())
            if self.peers.get(peer, 0) >= PER_PEER or total >= CONNECTIONS:
                conn.close()
                return
            self.peers[peer] = self.peers.get(peer, 0) + 1
        threading.Thread(target=self.connection, args=(conn, peer), daemon=True).start()

    def connection(self, conn: socket.socket, peer: str) -> None:
        transport = paramiko.Transport(conn)
        try:
            transport.local_version = f"SSH-2.0-{SERVER_BANNER}_{paramiko.__version__}"
            transport.banner_timeout = transport.auth_timeout = AUTH_SECONDS
            transport.handshake_timeout = AUTH_SECONDS
            transport.add_server_key(self.key)
            _offer_rfc_names(transport)
            login = _Login(self.s)
            transport.start_server(server=login)
            deadline = time.monotonic() + AUTH_SECONDS
            while not transport.is_authenticated():
                if time.monotonic() > deadline or not transport.is_active():
                    return
                time.sleep(0.02)
            self.channels(transport, login)
        except (paramiko.SSHException, OSError, EOFError):
            pass
        finally:
            transport.close()
            with self.lock:
                self.peers[peer] -= 1

    def channels(self, transport: paramiko.Transport, login: _Login) -> None:
        """Each session channel as it comes: its command run once it asked for one."""
        waiting: list[paramiko.Channel] = []
        while transport.is_active():
            channel = transport.accept(0.1)
            if channel is not None:
                waiting.append(channel)
            for ch in list(waiting):
                command = login.execs.get(ch.get_id())
                if command is not None:
                    waiting.remove(ch)
                    env = session_env(self.env, login.env.get(ch.get_id(), {}), self.s)
                    threading.Thread(
                        target=_session, args=(ch, command, env, login), daemon=True
                    ).start()
                elif ch.closed:
                    waiting.remove(ch)
                    login.done(ch)


def main(argv: list[str]) -> int:
    settings = Settings.read(argv[0])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Server(
        settings, {k: v for k, v in os.environ.items() if not k.startswith("MPI_BOOTSTRAP_")}
    ).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
