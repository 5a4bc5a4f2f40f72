"""container/k8s/: every MPIJob validates strictly against the project's own schema of
the MPIJob v2beta1 API (tests/schemas/mpijob-v2beta1.yaml): unknown fields are errors at
every level the schema models, as `kubectl apply --validate=strict` would make them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "tests" / "schemas" / "mpijob-v2beta1.yaml"
MANIFESTS = sorted((ROOT / "container" / "k8s").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = yaml.safe_load(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)  # type: ignore[no-any-return]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def mpijobs(path: Path) -> list[dict[str, Any]]:
    return [d for d in documents(path) if d.get("kind") == "MPIJob"]


def errors(validator: jsonschema.protocols.Validator, job: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)
    ]


def test_every_manifest_is_checked() -> None:
    """The glob finds the four MPIJobs (a moved directory cannot make the suite vacuous)."""
    assert {p.name for p in MANIFESTS} >= {
        "nccl-allreduce.yaml",
        "dranet-allreduce.yaml",
        "intel-mpi.yaml",
        "mpich.yaml",
    }


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path, validator: jsonschema.protocols.Validator) -> None:
    """Each MPIJob is valid v2beta1, and uses the agent as README says."""
    jobs = mpijobs(path)
    assert jobs, f"{path.name} has no MPIJob"
    for doc in documents(path):
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name")
    for job in jobs:
        assert errors(validator, job) == []
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


def test_exchanges_page_shows_the_net_manifest() -> None:
    """docs/exchanges.md shows container/k8s/net-exchange.yaml as it is (a copy cannot drift)."""
    page = (ROOT / "docs" / "exchanges.md").read_text()
    manifest = (ROOT / "container" / "k8s" / "net-exchange.yaml").read_text()
    body = manifest[manifest.index("apiVersion: v1") :]
    assert f"```yaml\n{body}```" in page
