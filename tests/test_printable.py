"""core/errors.py `printable`, wherever the agent prints for a person. The third outside
review's finding 5: a fake sshd on a worker's address sent terminal control sequences in
its banner, and `doctor` printed them raw — they erased the real problem line on the
operator's terminal and wrote a forged `ok`. Every string a peer, a record, a nameserver
or mpirun supplies is now escaped where the agent prints for a person: the doctor's
findings, stderr's failure messages and their details (the DNS dump), `--explain`, the
failure explainer, the console log. Each surface is fed ANSI CSI and OSC sequences, `\\r`
and `\\b` for real where it can be: a fake SSH server in the pod's own network namespace,
a hostfile, a fake mpirun. mpirun's and the ranks' own output, which the agent copies
through, is the user's and stays as it is. SECURITY.md cites these classes."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpi_bootstrap.core import failures
from mpi_bootstrap.core import log as corelog
from mpi_bootstrap.core.errors import printable
from mpi_bootstrap.doctor.finding import Finding
from mpi_bootstrap.system import log as syslog
from tests.conftest import Pod
from tests.support.onepod import launcher

# Up a line, erase it, back two characters, a forged verdict, an OSC window title: one
# word (no whitespace, so that a parser may take it for a host name or a version) ...
WORD = "\x1b[1A\x1b[2K\b\bok\x1b]0;owned\x07"
WORD_ESCAPED = "\\x1b[1A\\x1b[2K\\x08\\x08ok\\x1b]0;owned\\x07"
SH_WORD = r"\033[1A\033[2K\b\bok\033]0;owned\007"  # printf's spelling of WORD
# ... and, in free text, a carriage return, C1's CSI (U+009B), a right-to-left override.
EVIL = f"{WORD}\r forged \x9b2K \u202e"
ESCAPED = f"{WORD_ESCAPED}\\r forged \\x9b2K \\u202e"


def raw_controls(text: str) -> list[str]:
    """The characters in `text` that would drive a terminal (all but newlines and tabs)."""
    return [c for c in text if not c.isprintable() and c not in "\n\t"]


# ------------------------------------------------------------------ each renderer


class TestRenderers:
    """Each place that writes for a person, given a peer's words."""

    def test_printable(self) -> None:
        assert printable(f"a{EVIL}\n\tb") == f"a{ESCAPED}\n\tb"
        assert printable("x\ny", lines=False) == "x\\ny"
        assert printable("plain — é …") == "plain — é …"
        assert printable(printable(EVIL)) == printable(EVIL)  # escaping twice changes nothing

    def test_finding_line(self) -> None:
        line = Finding(f"w{EVIL}", "ssh port", True, f"answers SSH-2.0-x{EVIL}\nok fake").line()
        assert not raw_controls(line) and "\n" not in line and ESCAPED in line

    def test_explanation(self) -> None:
        found = failures.explain(f"ssh: Could not resolve hostname evil{WORD}: x\n")
        assert found is not None and found.signature == "could-not-resolve"
        text = found.text(255)
        assert not raw_controls(text) and f"evil{WORD_ESCAPED}." in text

    def test_fail(self, capsys: pytest.CaptureFixture[str]) -> None:
        from mpi_bootstrap import cli

        cli._fail(f"worker unreachable: {EVIL}\nmpi-bootstrap: all good", f"detail {EVIL}\nnext")
        err = capsys.readouterr().err
        assert not raw_controls(err)
        assert err.splitlines()[0].endswith("\\nmpi-bootstrap: all good")
        assert err.splitlines()[2] == "next"

    @pytest.mark.parametrize("console", [True, False])
    def test_resident_log_line(self, console: bool) -> None:
        """The resident's log line (core/log.py), console or JSON."""
        line = corelog.line(f"event{EVIL}", "info", "launcher", {"host": EVIL}, console=console)
        assert not raw_controls(line) and line.endswith("\n") and line.count("\n") == 1

    def test_console_log(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """structlog's console renderer before the hand-off; its own colours stay."""
        out = io.StringIO()
        monkeypatch.setattr(out, "isatty", lambda: True, raising=False)
        log = syslog.configure("console", "info", "launcher", stream=out)
        log(f"MPI{EVIL}", version=EVIL, n=3)
        text = out.getvalue()
        assert ESCAPED in text
        # The renderer's own colour codes (ESC [ … m) are all that is left of ESC.
        assert all(text[i + 1] == "[" for i, c in enumerate(text) if c == "\x1b")
        assert "\x1b]" not in text and not {"\r", "\b", "\x07", "\x9b"} & set(text)

    def test_a_newline_starts_no_line(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A peer's newline in a log value starts no line of its own that could read as
        the agent's (`… [info] checks passed`): one line an event."""
        forged = "x\n2026-01-01T00:00:00.000000Z [info     ] checks passed"
        out = io.StringIO()
        monkeypatch.setattr(out, "isatty", lambda: True, raising=False)
        syslog.configure("console", "info", "launcher", stream=out)("MPI", version=forged)
        assert out.getvalue().count("\n") == 1 and "\n2026" not in out.getvalue()
        line = corelog.line("MPI", "info", "launcher", {"version": forged}, console=True)
        assert line.count("\n") == 1  # --explain's: tests/test_plan.py TestRender


# ------------------------------------------------------------------ for real


SERVER = """
import socket, sys
banner = sys.argv[1].encode("latin-1")
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    conn.sendall(banner)
    conn.close()
"""


@pytest.fixture
def fake_sshd(pod: Pod) -> Iterator[int]:
    """A fake sshd in the pod's own network namespace, on both loopbacks, sending an SSH
    banner laced with escapes; its port."""
    banner = f"SSH-2.0-OpenSSH_9.2 {WORD}\rok localhost: fine\r\n"
    p = subprocess.Popen(
        [*pod.netns.prefix(), sys.executable, "-c", SERVER, banner],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        yield int(p.stdout.readline())
    finally:
        p.kill()  # ours, by its PID
        p.wait()


@pytest.fixture
def fake_mpirun(tmp_path: Path) -> str:
    """An mpirun whose `--version` and whose failure (ssh's, as Open MPI relays it) carry
    escapes."""
    path = tmp_path / "mpirun"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then\n'
        f"  printf 'mpirun (Open MPI) 4.1.4{SH_WORD}\\r\\n'; exit 0\n"
        "fi\n"
        f"printf 'ssh: Could not resolve hostname evil{SH_WORD}: Name or service not "
        "known\\n' >&2\n"
        "exit 255\n"
    )
    path.chmod(0o755)
    return str(path)


class TestForReal:
    """The agent for real, each surface fed escapes by what it reads."""

    def test_doctor_ssh_banner(self, pod: Pod, fake_sshd: int) -> None:
        """The review's attack: a fake sshd's banner reaches the doctor's findings escaped,
        on one line."""
        hostfile = pod.tmp / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        code, out, err = pod.agent(
            "--hostfile",
            str(hostfile),
            "--exchange",
            "secret",
            "--sshd-port",
            str(fake_sshd),
            "--log-format",
            "json",
            "doctor",
        )
        assert code in (0, 1), err
        banner = [line for line in out.splitlines() if "answers SSH-2.0-OpenSSH_9.2" in line]
        assert banner == [
            f"ok localhost: ssh port: localhost:{fake_sshd} answers "
            f"SSH-2.0-OpenSSH_9.2 {WORD_ESCAPED}\\rok localhost: fine"
        ], out
        assert not raw_controls(out), out

    def test_dns_dump(self, pod: Pod) -> None:
        """The DNS wait's dump quotes the hostfile: its text reaches stderr escaped (the
        log lines are JSON, which escapes them too)."""
        hostfile = pod.tmp / "hostfile"
        comment = f"# workers{WORD} \x9b2K \u202e"  # (a \r would end the line)
        hostfile.write_text(f"{comment}\nghost-0.job.default.svc slots=1\n")
        code, _, err = launcher(pod, hostfile)
        assert code == 68, err
        assert printable(comment) in err and not raw_controls(err)

    def test_explain_and_console_log(self, pod: Pod, fake_mpirun: str) -> None:
        """--explain names mpirun's version as it said it, escaped; so does the console
        log, whose line about the MPI quotes it too."""
        hostfile = pod.tmp / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        code, out, err = pod.agent(
            "--hostfile",
            str(hostfile),
            "--mpirun",
            fake_mpirun,
            "--log-format",
            "console",
            "--explain",
            "launcher",
            "--",
            "true",
        )
        assert code == 0, err
        assert f"openmpi 4.1.4{WORD_ESCAPED} (orte)" in out, out
        assert not raw_controls(out), out
        assert not raw_controls(err), err

    def test_failure_explainer(self, pod: Pod, fake_mpirun: str) -> None:
        """mpirun fails with ssh's words: the explanation names the host escaped, while
        mpirun's own line is copied through as it was."""
        hostfile = pod.tmp / "hostfile"
        hostfile.write_text("localhost slots=1\n")
        code, _, err = launcher(pod, hostfile, "--mpirun", fake_mpirun)
        assert code == 255, err
        lines = err.split("\n")
        said = [ln for ln in lines if ln.startswith("mpi-bootstrap: mpirun exited 255.")]
        assert len(said) == 1, err
        explanation = said[0] + lines[lines.index(said[0]) + 1]
        assert f"ssh could not resolve evil{WORD_ESCAPED}." in explanation
        assert not raw_controls(explanation)
        assert any(WORD in ln for ln in lines)  # mpirun's own output, untouched
