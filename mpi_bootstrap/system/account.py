"""The pod as the agent needs it before it plans, once for either role: its state
directory made and held (system/files.py `state_dir`), and a passwd entry for a uid
without one (OpenShift), which sshd and ssh need: given through nss_wrapper, never by
changing /etc/passwd (docs/configuration.md, "Platforms")."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import grp
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from mpi_bootstrap.core.config import Config
from mpi_bootstrap.core.errors import ConfigError
from mpi_bootstrap.core.log import Log
from mpi_bootstrap.core.names import is_plain_path
from mpi_bootstrap.system import files


def user() -> str:
    """This uid's name: its passwd entry's, else the one `settle` gives it."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"user{os.geteuid()}"


def settle(
    config: Config, environ: Mapping[str, str], log: Log, *, needs_entry: bool = True
) -> tuple[Config, dict[str, str]]:
    """`config` with its state directory held and every path below it moved where it is
    held (/proc/PID/fd/N where others could rename it); `environ` with nss_wrapper's
    variables where the uid has no entry (set in this process's too, for its children).
    Without nss_wrapper that is refused where sshd or ssh will run (`needs_entry`); a
    worker on the agent's own ssh server has no use for either, and goes on without."""
    old, uid = config.state_dir, os.geteuid()
    state = files.state_dir(old, lock=True) or old
    if state != old:
        log("state directory held", path=old, held=state, why=files.swappable(old, uid))
        out = config.output_hostfile
        out = state + out[len(old) :] if out.startswith(old + "/") else out
        config = dataclasses.replace(config, state_dir=state, output_hostfile=out)
    with contextlib.suppress(KeyError):
        pwd.getpwuid(uid)  # an entry of its own
        return config, dict(environ)
    if not needs_entry:
        log("no passwd entry", uid=uid, reason="the agent's own ssh server needs none")
        return config, dict(environ)
    found = glob.glob("/usr/lib*/libnss_wrapper.so") + glob.glob("/usr/lib*/*/libnss_wrapper.so")
    if not found:
        raise ConfigError(
            [
                f"uid {uid} has no passwd entry, which sshd and ssh need, and the image has no "
                "nss_wrapper to give it one: install Debian's libnss-wrapper (RHEL: "
                "nss_wrapper), or run the pod as a uid the image has"
            ]
        )
    home = environ.get("HOME", "/")
    home = home if is_plain_path(home) and ":" not in home else "/"
    gid, passwd, group = os.getegid(), f"{state}/passwd", f"{state}/group"
    files.atomic_write(passwd, _text("/etc/passwd") + f"{user()}:x:{uid}:{gid}::{home}:/bin/sh\n")
    known = gid in {g.gr_gid for g in grp.getgrall()}
    files.atomic_write(group, _text("/etc/group") + ("" if known else f"{user()}:x:{gid}:\n"))
    preload = " ".join(filter(None, [found[0], environ.get("LD_PRELOAD")]))
    added = {"LD_PRELOAD": preload, "NSS_WRAPPER_PASSWD": passwd, "NSS_WRAPPER_GROUP": group}
    log("passwd entry", user=user(), uid=uid, via=found[0])
    os.environ.update(added)
    return config, {**environ, **added}


def _text(path: str) -> str:
    """A system file's lines, each ended by a newline."""
    return "".join(f"{line}\n" for line in Path(path).read_text(errors="replace").splitlines())
