"""12 launches against the same 4 worker pods, for each exchange: every kind of run three
times (`make soak` runs 200 on 16): every run ends with its documented exit code, and,
from the first sample (after one of each kind) to the last, nothing the pods hold grows —
processes, fds, sshd's children, authorized_keys, state and exchange files, the
launcher's sockets — USS by at most 1 MiB a pod (tests/support/longrun.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.longrun import EXPECTED, Soak, flat, run_soak

# tests/support/longrun.py's cluster (its jobs run the mpirun on PATH: Debian's Open MPI 4).
pytestmark = [pytest.mark.usefixtures("netns"), pytest.mark.timeout(600)]


@pytest.mark.parametrize("exchange", ["dir", "net"])
def test_twelve_launches(exchange: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="mpib-soak-", dir="/run"))  # tests keep state under /run
    soak = None
    said: list[str] = []
    try:
        soak = Soak(work, 4, exchange)
        outcomes = run_soak(soak, 12, 4, say=said.append, together=True)
        wrong = [
            (o.run, o.kind, o.code, EXPECTED[o.kind], o.stderr_tail) for o in outcomes if not o.ok
        ]
        assert not wrong, wrong
        assert all(s["job_processes_left"] == 0 for s in soak.samples), said
        assert all(s["launcher_processes"] == 0 for s in soak.samples), said
        # from the first sample (after run 4, every kind has run once) to the last
        assert flat(soak.samples) == [], (said, soak.new_files())
    finally:
        if soak is not None:
            soak.close()
        shutil.rmtree(work, ignore_errors=True)
