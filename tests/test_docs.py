"""README stays true: every setting, variable and exit code the code has is documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_bootstrap.config import SETTINGS
from mpi_bootstrap.errors import ExitStatus

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_setting_documented(setting: object) -> None:
    for env in setting.envs:  # type: ignore[attr-defined]
        assert f"`{env}`" in README, env
    if setting.flag:  # type: ignore[attr-defined]
        assert f"`{setting.flag}`" in README  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", [s for s in ExitStatus if s not in (0, 128)])
def test_exit_code_documented(status: ExitStatus) -> None:
    assert f"| {int(status)} |" in README


def test_first_lines_give_the_two_commands() -> None:
    head = README.splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
