"""The launcher in the one-pod fixture (tests/conftest.py `pod`): a private network
namespace, no lookup leaving it. Shared by the CLI's and the termination message's tests."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Pod


def launcher(
    pod: Pod,
    hostfile: Path | str,
    *extra: str,
    env: dict[str, str] | None = None,
    program: tuple[str, ...] = ("true",),
) -> tuple[int, str, str]:
    """The launcher in the pod, its program `program` (JSON log, a 1 s DNS deadline)."""
    return pod.agent(
        "--hostfile",
        str(hostfile),
        "--output-hostfile",
        str(pod.tmp / "out-hostfile"),
        "--dns-wait-seconds",
        "1",
        "--log-format",
        "json",
        *extra,
        "launcher",
        "--",
        *program,
        env=env,
    )
