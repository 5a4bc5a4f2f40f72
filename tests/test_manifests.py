"""container/k8s/: every MPIJob validates against MPI Operator's CRD (v2beta1), with
unknown fields treated as errors — as `kubectl apply --validate=strict` would."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT.parent / "shared" / "schemas" / "kubeflow.org_mpijobs.yaml"
MANIFESTS = sorted((ROOT / "container" / "k8s").glob("*.yaml"))


def strict(node: Any) -> Any:
    """The CRD's OpenAPI schema as JSON Schema where unknown fields are errors."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")
    schema = strict(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)  # type: ignore[no-any-return]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def mpijobs(path: Path) -> list[dict[str, Any]]:
    return [d for d in documents(path) if d.get("kind") == "MPIJob"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path, validator: jsonschema.protocols.Validator) -> None:
    jobs = mpijobs(path)
    assert jobs, f"{path.name} has no MPIJob"
    for doc in documents(path):
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name")
    for job in jobs:
        assert job["apiVersion"] == "kubeflow.org/v2beta1"
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in validator.iter_errors(job)]
        assert errors == []
        for role, spec in job["spec"]["mpiReplicaSpecs"].items():
            for c in spec["template"]["spec"]["containers"]:
                if role == "Worker":  # readiness through the agent
                    assert c["readinessProbe"]["exec"]["command"] == ["mpi-bootstrap", "probe"]
                else:  # the launcher wraps the MPIJob's own mpirun command
                    assert c["args"][0] == "mpirun"


@pytest.mark.parametrize("mutate", [
    lambda j: j["spec"].__setitem__("slotPerWorker", j["spec"].pop("slotsPerWorker")),
    lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    .__setitem__("readinesProbe", {"exec": {"command": ["true"]}}),
    lambda j: j["spec"].__setitem__("mpiImplementation", "OpenMPI5"),
], ids=["misspelled-spec-field", "misspelled-container-field", "bad-enum"])
def test_a_wrong_manifest_fails(mutate: Any, validator: jsonschema.protocols.Validator
                                ) -> None:
    """The validator can fail: a misspelled field is an error, not silently dropped."""
    job = copy.deepcopy(mpijobs(ROOT / "container" / "k8s" / "nccl-allreduce.yaml")[0])
    mutate(job)
    assert list(validator.iter_errors(job))


def test_dranet_names_the_interface_nccl_uses() -> None:
    docs = documents(ROOT / "container" / "k8s" / "dranet-allreduce.yaml")
    rct = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    iface = rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["interface"]
    assert iface["name"] == "dranet0"
    job = next(d for d in docs if d["kind"] == "MPIJob")
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        env = {e["name"]: e["value"] for c in spec["template"]["spec"]["containers"]
               for e in c.get("env", [])}
        assert env["MPI_BOOTSTRAP_DATA_IFACE"] == "dranet0"
