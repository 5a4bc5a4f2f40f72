"""Which operator made this pod, and what its conventions say: the pod's role and why, a
launcher's hostfile, and whether the launcher forwards its own environment
(docs/configuration.md, "Operators"). Pure: the environment and the hostname are given.

Only what each operator really puts in a pod counts, read in its source:
- MPI Operator (kubeflow/mpi-operator v0.8.2, `pkg/controller/mpi_job_controller.go`):
  `K_MPI_JOB_ROLE` in every pod.
- Volcano (volcano-sh/volcano ed72c7c, `pkg/controllers/job/plugins/svc/svc.go`):
  `VC_<TASK>_HOSTS`, the comma list of each task's pods, in every pod; the task whose
  list holds this pod's hostname is its own.
- JobSet (kubernetes-sigs/jobset 08dfbdf) sets no variable. Each ReplicatedJob is an
  Indexed Job `<jobset>-<rjob>-<jobIndex>` (`pkg/controllers/jobset_controller.go`; its
  webhook makes every Job Indexed), whose pods Kubernetes names
  `<job>-<completion index>` and gives `JOB_COMPLETION_INDEX`: a hostname that ends in
  `-<rjob>-<n>-<JOB_COMPLETION_INDEX>` is a JobSet's pod, and `<rjob>` its replicated job.
- Kubeflow Trainer v2 (kubeflow/trainer 8c0f505, `pkg/runtime/framework/plugins/mpi/
  mpi.go`) is a JobSet of replicated jobs `launcher` and `node`; in the launcher's pods
  only it sets `OMPI_MCA_orte_default_hostfile` (and three more OMPI_MCA_*), and it puts
  the TrainJob's `trainer.env` in the launcher's container only.
A manifest may also map JobSet's label to `REPLICATED_JOB_NAME` (the downward API).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from mpi_bootstrap.core.settings.base import Source

# A replicated job's or task's word for a pod's part: Trainer v2's `launcher` and `node`,
# JobSet manifests' `worker`, Volcano's example `mpimaster` and `mpiworker`.
ROLE_WORDS = {"launcher": "launcher", "master": "launcher", "worker": "worker", "node": "worker"}
# `<jobset>-<rjob>-<jobIndex>-<podIndex>`: the last word of <rjob> is what is read.
JOBSET_POD = re.compile(r"(?P<head>[a-z0-9-]+)-(?P<word>[a-z0-9]+)-\d+-(?P<pod>\d+)")
TRAINER_HOSTFILE_VAR = "OMPI_MCA_orte_default_hostfile"  # mpi.go, the launcher's only


@dataclasses.dataclass(frozen=True)
class Pod:
    """What this pod's operator says of it."""

    operator: str  # "mpi-operator", "volcano", "trainer", "jobset", or "" (none found)
    # The role its convention gives, as its word is where that names none (refused);
    # None: the convention says nothing of the role.
    role: str | None = None
    source: Source = dataclasses.field(default_factory=lambda: Source("default"))  # the role's
    worker_task: str | None = None  # Volcano: the task named for workers (its hostfile)
    launcher_env: bool = False  # the launcher's environment is the job's (Trainer v2)


def _word(name: str) -> str | None:
    """The role a name's words give (`mpiworker`, `node`, `trainer-launcher`), or None."""
    return next((r for w, r in ROLE_WORDS.items() if w in name.lower()), None)


def _volcano(environ: Mapping[str, str], hostname: str) -> Pod | None:
    """The Volcano task holding this pod, by its hostname, as a Pod; None: not one."""
    tasks = {
        key[3:-6].lower(): {h.split(".")[0] for h in value.split(",")}
        for key, value in environ.items()
        if key.startswith("VC_") and key.endswith("_HOSTS") and len(key) > 9
    }
    own = [t for t, hosts in tasks.items() if hostname in hosts]
    if len(own) != 1:
        return None
    workers = [t for t in tasks if "worker" in t]
    env = f"VC_{own[0].upper()}_HOSTS"
    return Pod(
        "volcano",
        _word(own[0]) or own[0],
        Source("env", env),
        worker_task=workers[0] if len(workers) == 1 else None,
    )


def _jobset(environ: Mapping[str, str], hostname: str) -> Pod | None:
    """A JobSet's pod by its name and JOB_COMPLETION_INDEX (Trainer v2's when its
    replicated job is `node`, or `launcher` with Trainer's hostfile variable)."""
    m = JOBSET_POD.fullmatch(hostname)
    if m is None or environ.get("JOB_COMPLETION_INDEX") != m["pod"]:
        return None
    word = m["word"]
    trainer = word == "node" or (word == "launcher" and TRAINER_HOSTFILE_VAR in environ)
    made = "Kubeflow Trainer v2's" if trainer else "a JobSet's"
    return Pod(
        "trainer" if trainer else "jobset",
        ROLE_WORDS.get(word),
        Source("hostname", f"{hostname} ({made} pod of replicated job {word!r})"),
        launcher_env=trainer and word == "launcher",
    )


def identify(environ: Mapping[str, str], hostname: str) -> Pod:
    """This pod as its operator made it; Pod("") where no operator's sign is found."""
    if role := environ.get("K_MPI_JOB_ROLE"):
        return Pod("mpi-operator", role.strip().lower(), Source("env", "K_MPI_JOB_ROLE"))
    if (name := environ.get("REPLICATED_JOB_NAME")) is not None:
        found = _jobset(environ, hostname)
        return Pod(
            found.operator if found else "jobset",
            _word(name) or name,
            Source("env", "REPLICATED_JOB_NAME"),
            launcher_env=bool(found and found.launcher_env),
        )
    return _volcano(environ, hostname) or _jobset(environ, hostname) or Pod("")


def no_role_advice(pod: Pod) -> str:
    """What to set where no role was found, for the refusal (64)."""
    if pod.operator == "jobset":
        return (
            f"{pod.source} names neither a launcher nor a worker: set "
            "MPI_BOOTSTRAP_ROLE in each replicated job's container (docs/configuration.md, "
            '"Operators")'
        )
    return (
        "no role: give `launcher` or `worker`, or set MPI_BOOTSTRAP_ROLE (no operator's "
        'sign was found: docs/configuration.md, "Operators")'
    )
