"""container/Dockerfile's build argument SSH_SERVER, without building an image: its
OpenSSH step and its last check run by /bin/sh against stubs (package managers, ssh,
sshd, the agent) that only record how they were called, and its last stages read. The
images themselves are built and run by tests/test_container.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mpi_bootstrap.core.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "container" / "Dockerfile"
# Recorded, not run: `$0 $@` appended to the log the test reads.
STUB = '#!/bin/sh\necho "${0##*/} $*" >> "$STUB_LOG"\n'
OPENSSH_VERSION = '#!/bin/sh\necho "${0##*/} $*" >> "$STUB_LOG"\necho OpenSSH_9.2p1 >&2\n'


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) of each line of the Dockerfile, continuations joined."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [(ln.split(None, 1)[0], ln.split(None, 1)[1]) for ln in text.splitlines() if ln]


def after(instruction: str, args: str) -> str:
    """The RUN that follows `instruction args` in the Dockerfile."""
    steps = instructions()
    start = steps.index((instruction, args))
    return next(a for i, a in steps[start + 1 :] if i == "RUN")


def run(
    script: str, tmp: Path, server: str, have: tuple[str, ...], paths: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`script` (a RUN's) by /bin/sh with SSH_SERVER=`server`, `have` the stubs on its
    PATH (nothing else there) and `paths` its absolute paths moved below `tmp`: its exit
    and the calls the stubs recorded."""
    bin_, log = tmp / "bin", tmp / "calls"
    bin_.mkdir(exist_ok=True)
    for name in ("mkdir", "rm", *have):
        body = OPENSSH_VERSION if name in ("ssh", "sshd") else STUB
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    (bin_ / "grep").symlink_to(shutil.which("grep") or "/bin/grep")  # reads `ssh -V`
    for path, name in paths.items():
        assert path in script, path  # a changed Dockerfile must not reach the machine's
        script = script.replace(path, str(bin_ / name))
    env = {"PATH": str(bin_), "SSH_SERVER": server, "STUB_LOG": str(log)}
    done = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


SSH_STEP = {"/usr/sbin/sshd": "sshd"}
APT = "install -y --no-install-recommends"
# (SSH_SERVER, what the base has) → what the step installs (none: nothing; no mkdir: no
# /run/sshd made)
INSTALLS = {
    ("openssh", ("apt-get",)): f"apt-get {APT} openssh-server openssh-client libnss-wrapper",
    ("openssh", ("apt-get", "ssh", "sshd")): None,
    ("openssh", ("apt-get", "ssh")): f"apt-get {APT} openssh-server openssh-client libnss-wrapper",
    ("openssh", ("apk",)): "apk add --no-cache openssh-server openssh-client",
    # The launcher's ssh needs a passwd entry as sshd does: nss_wrapper stays.
    ("agent", ("apt-get",)): f"apt-get {APT} openssh-client libnss-wrapper",
    ("agent", ("apt-get", "ssh")): None,
    ("agent", ("dnf",)): "dnf install -y openssh-clients",
    ("agent", ("microdnf",)): "microdnf install -y openssh-clients",
    ("agent", ("apk",)): "apk add --no-cache openssh-client",
}


def _id(value: object) -> str:
    return "+".join(value) if isinstance(value, tuple) else str(value)


class TestOpenSSHStep:
    """The step that installs OpenSSH."""

    script = after("ARG", "SSH_SERVER")

    @pytest.mark.parametrize(("server", "have"), sorted(INSTALLS), ids=_id)
    def test_installs(self, server: str, have: tuple[str, ...], tmp_path: Path) -> None:
        """openssh installs the server, its client and nss_wrapper where the base lacks
        either, and makes /run/sshd; agent installs the client (and nss_wrapper) where the
        base lacks it, never the server, and makes no /run/sshd."""
        done, calls = run(self.script, tmp_path, server, have, SSH_STEP)
        assert done.returncode == 0, done.stderr
        want = INSTALLS[server, have]
        installs = [c for c in calls if " install " in c or c.startswith("apk add")]
        assert installs == ([want] if want else []), calls
        assert ("mkdir -p -m 0755 /run/sshd" in calls) == (server == "openssh"), calls

    @pytest.mark.parametrize(
        ("server", "message"),
        [
            ("agent", "add OpenSSH's client to the base image"),
            ("openssh", "add OpenSSH's server and client to the base image"),
            ("sshd", "SSH_SERVER=sshd: openssh or agent"),
        ],
    )
    def test_refuses(self, server: str, message: str, tmp_path: Path) -> None:
        """A base with no package manager, or a value that is neither, fails the build
        saying what to do."""
        done, calls = run(self.script, tmp_path, server, (), SSH_STEP)
        assert done.returncode == 1 and message in done.stderr, done.stderr
        assert calls == []


@pytest.mark.parametrize(("server", "passes"), [("agent", True), ("openssh", False)])
def test_last_check_needs_sshd_for_openssh_only(server: str, passes: bool, tmp_path: Path) -> None:
    """With no sshd in the image, the build's last check passes for agent (the agent's
    server imports instead) and fails for openssh."""
    script = after("COPY", "container/wheelhouse/ /tmp/mpi-bootstrap-wheels/")
    script = after("RUN", script)  # the one after the install
    paths = {"/opt/mpi-bootstrap/bin/python": "python", "/usr/sbin/sshd": "sshd"}
    done, calls = run(script, tmp_path, server, ("mpi-bootstrap", "ssh", "python"), paths)
    assert (done.returncode == 0) == passes, (done.stderr, calls)
    assert calls[0] == "mpi-bootstrap --version"
    if passes:
        assert calls[1:] == ["python -c import mpi_bootstrap.ssh.server", "ssh -V"]


def test_the_image_ends_as_the_stage_ssh_server_names() -> None:
    """The default is openssh, whose stage adds nothing to the image; agent's adds only
    MPI_BOOTSTRAP_SSH_SERVER=agent (a variable and a value of the agent's setting), so a
    base's own sshd cannot make `auto` pick it."""
    (setting,) = [s for s in SETTINGS if "MPI_BOOTSTRAP_SSH_SERVER" in s.envs]
    assert setting.parse("agent") == "agent"
    steps = instructions()
    assert ("ARG", "SSH_SERVER=openssh") in steps
    tail = steps[[i for i, _ in steps].index("ENTRYPOINT") + 1 :]
    assert tail == [
        ("FROM", "image AS ssh-server-openssh"),
        ("FROM", "image AS ssh-server-agent"),
        ("ENV", "MPI_BOOTSTRAP_SSH_SERVER=agent"),
        ("FROM", "ssh-server-${SSH_SERVER:-openssh}"),
    ]
