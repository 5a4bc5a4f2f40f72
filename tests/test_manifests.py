"""container/k8s/: every MPIJob, JobSet and Volcano Job validates strictly against the
project's own schema of its API (tests/schemas/: the MPIJob v2beta1, JobSet v1alpha2 and
Volcano's Job v1alpha1, over one pod template, pod.yaml): unknown fields are errors at
every level the schemas model, as `kubectl apply --validate=strict` would make them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "tests" / "schemas"
MANIFESTS = sorted((ROOT / "container" / "k8s").glob("*.yaml"))
# (apiVersion, kind) → the schema's $id (its file: tests/schemas/<id>.yaml)
KINDS = {
    ("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v1alpha2",
    ("batch.volcano.sh/v1alpha1", "Job"): "volcano-job-v1alpha1",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "clustertrainingruntime-v1alpha1",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjob-v1alpha1",
}


def _validators() -> dict[str, jsonschema.protocols.Validator]:
    schemas = {p.stem: yaml.safe_load(p.read_text()) for p in SCHEMAS.glob("*.yaml")}
    registry: Registry = Registry().with_resources(
        (s["$id"], Resource.from_contents(s)) for s in schemas.values()
    )
    out = {}
    for name in KINDS.values():
        cls = jsonschema.validators.validator_for(schemas[name])
        cls.check_schema(schemas[name])
        out[name] = cls(schemas[name], registry=registry)
    return out


@pytest.fixture(scope="module")
def validators() -> dict[str, jsonschema.protocols.Validator]:
    return _validators()


@pytest.fixture(scope="module")
def validator(
    validators: dict[str, jsonschema.protocols.Validator],
) -> jsonschema.protocols.Validator:
    return validators["mpijob-v2beta1"]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def mpijobs(path: Path) -> list[dict[str, Any]]:
    return [d for d in documents(path) if d.get("kind") == "MPIJob"]


def errors(validator: jsonschema.protocols.Validator, job: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)
    ]


def test_every_manifest_is_checked() -> None:
    """The glob finds the MPIJobs, the JobSet and the Volcano Job (a moved directory cannot
    make the suite vacuous)."""
    assert {p.name for p in MANIFESTS} >= {
        "nccl-allreduce.yaml",
        "dranet-allreduce.yaml",
        "intel-mpi.yaml",
        "mpich.yaml",
        "jobset.yaml",
        "volcano.yaml",
        "trainer-v2.yaml",
        "no-sshd.yaml",
    }


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(
    path: Path, validators: dict[str, jsonschema.protocols.Validator]
) -> None:
    """Each job is valid against its API's schema; an MPIJob uses the agent as README
    says."""
    docs = documents(path)
    checked = [d for d in docs if (d.get("apiVersion"), d.get("kind")) in KINDS]
    assert checked, f"{path.name} has no job of a kind with a schema"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name")
    for doc in checked:
        assert errors(validators[KINDS[doc["apiVersion"], doc["kind"]]], doc) == []
    for job in mpijobs(path):
        for role, spec in job["spec"]["mpiReplicaSpecs"].items():
            for c in spec["template"]["spec"]["containers"]:
                if role == "Worker":  # readiness through the agent
                    assert c["readinessProbe"]["exec"]["command"] == ["mpi-bootstrap", "probe"]
                else:  # the launcher wraps the MPIJob's own mpirun command
                    assert c["args"][0] == "mpirun"


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]  # type: ignore[no-any-return]


# (mutation, the path of the error, a word its message must contain)
WRONG: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "misspelled-spec-field": (
        lambda j: j["spec"].__setitem__("slotPerWorker", j["spec"].pop("slotsPerWorker")),
        "spec",
        "'slotPerWorker' was unexpected",
    ),
    "misspelled-container-field": (
        lambda j: _worker(j)["containers"][0].__setitem__(
            "readinesProbe", {"exec": {"command": ["true"]}}
        ),
        "spec/mpiReplicaSpecs/Worker/template/spec/containers/0",
        "'readinesProbe' was unexpected",
    ),
    "bad-enum": (
        lambda j: j["spec"].__setitem__("mpiImplementation", "OpenMPI5"),
        "spec/mpiImplementation",
        "'OpenMPI5' is not one of",
    ),
    "misspelled-replica": (
        lambda j: j["spec"]["mpiReplicaSpecs"].__setitem__(
            "Workers", j["spec"]["mpiReplicaSpecs"].pop("Worker")
        ),
        "spec/mpiReplicaSpecs",
        "'Workers' was unexpected",
    ),
    "bad-launcher-policy": (
        lambda j: j["spec"].__setitem__("launcherCreationPolicy", "WaitForWorkers"),
        "spec/launcherCreationPolicy",
        "is not one of",
    ),
    "string-slots": (
        lambda j: j["spec"].__setitem__("slotsPerWorker", "1"),
        "spec/slotsPerWorker",
        "is not of type 'integer'",
    ),
    "misspelled-probe-field": (
        lambda j: _worker(j)["containers"][0]["readinessProbe"].__setitem__("period", 2),
        "spec/mpiReplicaSpecs/Worker/template/spec/containers/0/readinessProbe",
        "'period' was unexpected",
    ),
    "misspelled-env-field": (
        lambda j: _worker(j)["containers"][0]["env"].append({"name": "X", "valeu": "1"}),
        "spec/mpiReplicaSpecs/Worker/template/spec/containers/0/env/1",
        "'valeu' was unexpected",
    ),
    "unknown-run-policy": (
        lambda j: j["spec"]["runPolicy"].__setitem__("cleanPodPolicy", "Sometimes"),
        "spec/runPolicy/cleanPodPolicy",
        "is not one of",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_manifest_fails_for_its_reason(
    name: str, validator: jsonschema.protocols.Validator
) -> None:
    """Each deliberate mistake is refused, at its own path and for its own reason (not
    for some other error the mutation happened to cause)."""
    mutate, path, words = WRONG[name]
    job = copy.deepcopy(mpijobs(ROOT / "container" / "k8s" / "nccl-allreduce.yaml")[0])
    assert errors(validator, job) == []
    mutate(job)
    found = errors(validator, job)
    assert len(found) == 1, found
    where, _, message = found[0].partition(": ")
    assert where == path, found
    assert words in message, found


def test_dranet_names_the_interface_nccl_uses() -> None:
    """The DraNet claim names `dranet0`, and both roles tell the agent so."""
    docs = documents(ROOT / "container" / "k8s" / "dranet-allreduce.yaml")
    rct = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    iface = rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["interface"]
    assert iface["name"] == "dranet0"
    job = next(d for d in docs if d["kind"] == "MPIJob")
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        env = {
            e["name"]: e["value"]
            for c in spec["template"]["spec"]["containers"]
            for e in c.get("env", [])
        }
        assert env["MPI_BOOTSTRAP_DATA_IFACE"] == "dranet0"


def test_no_token_in_the_environment() -> None:
    """No manifest puts the net exchange's token in a container's environment: there every
    process the container starts (the readiness probe, `kubectl exec`) holds it."""
    for path in MANIFESTS:
        for job in mpijobs(path):
            for spec in job["spec"]["mpiReplicaSpecs"].values():
                for c in spec["template"]["spec"]["containers"]:
                    names = {e["name"] for e in c.get("env", [])}
                    assert "MPI_BOOTSTRAP_TOKEN" not in names, path.name


def test_net_exchange_token_from_a_secret_volume() -> None:
    """The net exchange's MPIJob gives both roles MPI_BOOTSTRAP_TOKEN_FILE naming a key of a
    Secret volume mounted read-only at its directory, with defaultMode 0400 (not Kubernetes'
    0644), and the Secret it names holds that key."""
    docs = documents(ROOT / "container" / "k8s" / "net-exchange.yaml")
    secret = next(d for d in docs if d["kind"] == "Secret")
    job = next(d for d in docs if d["kind"] == "MPIJob")
    for role, spec in job["spec"]["mpiReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        (c,) = pod["containers"]
        path = Path({e["name"]: e.get("value") for e in c["env"]}["MPI_BOOTSTRAP_TOKEN_FILE"])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
        assert mount["readOnly"] is True, role
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"] == {"secretName": secret["metadata"]["name"], "defaultMode": 0o400}
        assert path.name in secret["stringData"], role


def test_no_sshd_job_runs_the_image_its_header_builds() -> None:
    """no-sshd.yaml: both roles run the one image its header builds with `--build-arg
    SSH_SERVER=agent` (what that does: tests/test_dockerfile.py), the workers say
    MPI_BOOTSTRAP_SSH_SERVER=agent too, and every pod meets Pod Security "restricted" with
    a read-only root and nothing mounted at /run/sshd."""
    path = ROOT / "container" / "k8s" / "no-sshd.yaml"
    header = " ".join(
        ln.lstrip("#").strip().rstrip("\\") for ln in path.read_text().splitlines() if ln[:1] == "#"
    )
    build = header.split("podman build ", 1)[1].split(" .", 1)[0].split()
    assert "SSH_SERVER=agent" in build[build.index("--build-arg") :]
    (job,) = mpijobs(path)
    for role, spec in job["spec"]["mpiReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert all(set(v) == {"name", "emptyDir"} for v in pod["volumes"])
        (c,) = pod["containers"]
        assert c["image"] == build[build.index("-t") + 1], role
        assert c["securityContext"] == {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env.get("MPI_BOOTSTRAP_SSH_SERVER") == ("agent" if role == "Worker" else None)


def test_exchanges_page_shows_the_net_manifest() -> None:
    """docs/exchanges.md shows container/k8s/net-exchange.yaml as it is (a copy cannot drift)."""
    page = (ROOT / "docs" / "exchanges.md").read_text()
    manifest = (ROOT / "container" / "k8s" / "net-exchange.yaml").read_text()
    body = manifest[manifest.index("apiVersion: v1") :]
    assert f"```yaml\n{body}```" in page


def _exit_rules(path: str) -> dict[int, str]:
    """Exit code → what the operator does when the launcher exits with it (the restart
    contract: docs/troubleshooting.md, "Exit codes")."""
    docs = documents(ROOT / "container" / "k8s" / path)
    if path == "volcano.yaml":
        (job,) = [d for d in docs if d["kind"] == "Job"]
        policies = job["spec"]["tasks"][0]["policies"]
        return {p["exitCode"]: p["action"] for p in policies if "exitCode" in p}
    jobsets = [d["spec"] for d in docs if d["kind"] == "JobSet"] or [
        d["spec"]["template"]["spec"] for d in docs if d["kind"] == "ClusterTrainingRuntime"
    ]
    rules = [_jobset_rules(j) for j in jobsets]
    assert all(r == rules[0] for r in rules)  # every runtime (one per MPI) alike
    return rules[0]


def _jobset_rules(jobset: dict[str, Any]) -> dict[int, str]:
    reasons = {
        reason: rule["action"]
        for rule in jobset["failurePolicy"]["rules"]
        for reason in rule["onJobFailureReasons"]
    }
    (launcher,) = [
        j["template"]["spec"] for j in jobset["replicatedJobs"] if j["name"] == "launcher"
    ]
    assert launcher["backoffLimit"] == 0  # a counted failure fails the Job at once
    (container,) = launcher["template"]["spec"]["containers"]
    rules = launcher["podFailurePolicy"]["rules"]
    assert {r["onExitCodes"]["containerName"] for r in rules} == {container["name"]}
    reason = {"FailJob": "PodFailurePolicy", "Count": "BackoffLimitExceeded"}
    return {
        code: reasons[reason[rule["action"]]]
        for rule in launcher["podFailurePolicy"]["rules"]
        for code in rule["onExitCodes"]["values"]
    }


@pytest.mark.parametrize(
    ("path", "restart", "stop"),
    [
        ("jobset.yaml", "RestartJobSet", "FailJobSet"),
        ("trainer-v2.yaml", "RestartJobSet", "FailJobSet"),
        ("volcano.yaml", "RestartJob", "AbortJob"),
    ],
)
def test_restart_contract(path: str, restart: str, stop: str) -> None:
    """A worker lost while the job ran (75) restarts the job; a bad configuration or
    hostfile (64, 65) ends it, since restarting cannot fix it."""
    assert _exit_rules(path) == {75: restart, 64: stop, 65: stop}


@pytest.mark.parametrize(
    ("path", "mutate", "where", "words"),
    [
        (
            "jobset.yaml",
            lambda d: d["spec"]["failurePolicy"]["rules"][0].__setitem__("onJobFailureReason", []),
            "spec/failurePolicy/rules/0",
            "'onJobFailureReason' was unexpected",
        ),
        (
            "jobset.yaml",
            lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"][
                "rules"
            ][1].__setitem__("action", "Restart"),
            "spec/replicatedJobs/0/template/spec/podFailurePolicy/rules/1/action",
            "is not one of",
        ),
        (
            "volcano.yaml",
            lambda d: d["spec"]["tasks"][0]["policies"][1].__setitem__("action", "Retry"),
            "spec/tasks/0/policies/1/action",
            "is not one of",
        ),
    ],
)
def test_operator_schemas_are_strict(
    path: str,
    mutate: Callable[[dict[str, Any]], None],
    where: str,
    words: str,
    validators: dict[str, jsonschema.protocols.Validator],
) -> None:
    """A misspelled field or an action the operator does not know is refused where it is."""
    (doc,) = [
        d
        for d in documents(ROOT / "container" / "k8s" / path)
        if (d["apiVersion"], d["kind"]) in KINDS
    ]
    validate = validators[KINDS[doc["apiVersion"], doc["kind"]]]
    mutate(doc)
    (found,) = errors(validate, doc)
    assert found.startswith(f"{where}: ") and words in found, found
