"""The agent's own SSH server (ssh/server.py, SECURITY.md 40), for worker images with no
usable OpenSSH sshd: each real MPI's job on the simulated cluster through it, and what
a hostile or careless client gets from it, on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import AGENT, RealMPI
from tests.support import logs
from tests.support.cluster import Cluster
from tests.support.job import PODS, WORKERS, Agent, Job, check_allreduce
from tests.support.programs import compile_allreduce

NO_SSHD = {"MPI_BOOTSTRAP_SSHD": "/nonexistent/sshd"}  # an image without OpenSSH's server


@pytest.mark.usefixtures("dnsmasq", "realmpi")
@pytest.mark.timeout(300)
class TestJobs:
    def test_allreduce_without_sshd(self, real_mpi: RealMPI, work: Path, programs: Path) -> None:
        """Workers whose image has no sshd serve ssh themselves (auto): the allreduce runs
        on 2 workers x 2 slots, through preflight, the data check and the launch gate."""
        exe = compile_allreduce(real_mpi, programs)
        with Cluster(PODS, dns=True, pid1=True) as c:
            job = Job(c, work, real_mpi)
            job.workers += [
                Agent(c, p, [AGENT, "worker"], job.env(p, **NO_SSHD)) for p in c.pods[1:]
            ]
            for w in job.workers:
                job.wait_ready(w)
                said = logs.event(w.stderr(), "ssh server")
                assert said is not None and said["server"] == "agent", w.stderr()
            done = job.launch([str(exe)])
            check_allreduce(done, 4, WORKERS)
