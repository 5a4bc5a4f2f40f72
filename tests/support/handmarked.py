"""A test marked by hand, for tests/test_resources.py, which collects it in a pytest session
of its own (its file's name keeps the suite from collecting it): the session must refuse
it, since markers are derived from the fixtures a test uses."""

from __future__ import annotations

import pytest


@pytest.mark.netns
def test_marked_by_hand() -> None:
    pass
