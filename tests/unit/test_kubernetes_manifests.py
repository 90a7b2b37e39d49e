"""The Kubernetes manifests under ``deploy/kubernetes`` are valid objects of the Kubernetes API.

Every document of every manifest is validated strictly (an unknown field fails, as ``kubectl apply
--validate=strict`` does) against the JSON Schemas of Kubernetes :data:`KUBERNETES_VERSION`, shipped
offline by the ``kubernetes-validate`` package. Beside the schema, the Jobs must hold what a benchmark
in a shared cluster needs: no retry (``backoffLimit: 0``: a second attempt would measure a warmed
cache), a TTL, a non-root pod, resources set, the API key from a Secret and results on the
PersistentVolumeClaim. Each ``kustomization.yaml`` lists files that exist. A broken manifest (an
unknown field, a wrong type) must fail the same check.

The KubeRay ``RayJob`` (``ray.io/v1``, a custom resource) is validated against the ``openAPIV3Schema`` of
KubeRay's CRD, vendored in ``tests/golden/kuberay`` (its README names the source), as strictly: an object schema
that lists its properties refuses any other, as the API server prunes unknown fields of a structural schema.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterator, Mapping
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
"""The oldest Kubernetes the manifests target (batch/v1 Job with ttlSecondsAfterFinished is GA since 1.23)."""

Doc = Mapping[str, object]
CUSTOM_SCHEMAS = {("ray.io/v1", "RayJob"): ROOT / "tests" / "golden" / "kuberay" / "rayjob-v1.openapi.json.xz"}
"""Custom resources: (apiVersion, kind) -> the openAPIV3Schema of the CRD version (vendored)."""


def manifests() -> list[Path]:
    return sorted(path for path in DEPLOY.rglob("*.yaml") if path.name != "kustomization.yaml")


def documents(path: Path) -> Iterator[Doc]:
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if document is not None:
            assert isinstance(document, dict), f"{path}: a document is not a mapping"
            yield document


def strict(schema: object) -> object:
    """An openAPIV3Schema as JSON Schema that refuses unknown fields: ``additionalProperties: false`` on every
    object schema that lists properties and does not preserve unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = bool(out.get("x-kubernetes-preserve-unknown-fields", False))
    return out


def validate(document: Doc) -> None:
    custom = CUSTOM_SCHEMAS.get((str(document.get("apiVersion")), str(document.get("kind"))))
    if custom is None:
        kubernetes_validate.validate(dict(document), KUBERNETES_VERSION, strict=True)
        return
    jsonschema.validate(dict(document), strict(json.loads(lzma.decompress(custom.read_bytes()))))


def test_there_are_manifests() -> None:
    kinds = sorted(str(doc["kind"]) for path in manifests() for doc in documents(path))
    assert kinds == ["ConfigMap", "Job", "Job", "Job", "Job", "PersistentVolumeClaim", "RayJob"]


@pytest.mark.parametrize("path", manifests(), ids=lambda path: str(path.relative_to(DEPLOY)))
def test_manifest_validates_against_the_kubernetes_schema(path: Path) -> None:
    for document in documents(path):
        validate(document)


def jobs() -> list[tuple[Path, Doc]]:
    return [(path, doc) for path in manifests() for doc in documents(path) if doc["kind"] == "Job"]


def _at(document: object, *keys: str | int) -> object:
    for key in keys:
        if isinstance(document, dict):
            document = document[key]
        else:
            assert isinstance(document, list) and isinstance(key, int), f"no {key!r} under {document!r}"
            document = document[key]
    return document


def _mapping(document: object, *keys: str | int) -> dict[str, object]:
    found = _at(document, *keys)
    assert isinstance(found, dict), f"{keys}: not a mapping"
    return found


def _list(document: object, *keys: str | int) -> list[object]:
    found = _at(document, *keys)
    assert isinstance(found, list), f"{keys}: not a list"
    return found


def fit_pod(pod: dict[str, object]) -> tuple[dict[str, object], dict[str, dict[str, object]], list[object]]:
    """Asserts what fits a shared cluster in a pod spec (not root, no privilege escalation, CPU and memory requested
    and limited); its one container, that container's env entries by name, and the claims its volumes mount."""
    assert _at(pod, "securityContext", "runAsNonRoot") is True
    (container,) = _list(pod, "containers")
    assert _at(container, "securityContext", "allowPrivilegeEscalation") is False
    for bound in ("requests", "limits"):
        assert set(_mapping(container, "resources", bound)) == {"cpu", "memory"}
    env = {str(_at(entry, "name")): _mapping(entry) for entry in _list(container, "env")}
    volumes = [_mapping(volume) for volume in _list(pod, "volumes")]
    claims = [
        _at(volume, "persistentVolumeClaim", "claimName") for volume in volumes if "persistentVolumeClaim" in volume
    ]
    return _mapping(container), env, claims


@pytest.mark.parametrize("path,job", jobs(), ids=[str(path.relative_to(DEPLOY)) for path, _ in jobs()])
def test_job_is_fit_for_a_shared_cluster(path: Path, job: Doc) -> None:
    assert _at(job, "spec", "backoffLimit") == 0, path
    assert isinstance(_at(job, "spec", "ttlSecondsAfterFinished"), int)
    pod = _mapping(job, "spec", "template", "spec")
    assert pod["restartPolicy"] == "Never"
    container, env, claims = fit_pod(pod)
    if "KVBENCH_API_KEY" in env or "args" in container:  # a Job that measures an endpoint (a merge reads)
        assert "value" not in env["KVBENCH_API_KEY"], "the API key comes from a Secret, never the manifest"
        assert _at(env["KVBENCH_API_KEY"], "valueFrom", "secretKeyRef", "name") == "kvbench-api-key"
    assert set(claims) == {"kvbench-results"}


def test_kustomizations_list_files_that_exist() -> None:
    found = sorted(DEPLOY.rglob("kustomization.yaml"))
    assert found
    for kustomization in found:
        listed = yaml.safe_load(kustomization.read_text(encoding="utf-8"))["resources"]
        for resource in listed:
            assert (kustomization.parent / resource).is_file(), f"{kustomization}: {resource} does not exist"
    listed = {
        (kustomization.parent / resource).resolve()
        for kustomization in found
        for resource in yaml.safe_load(kustomization.read_text(encoding="utf-8"))["resources"]
    }
    assert listed == {path.resolve() for path in manifests()}, "every manifest is in a kustomization"


def broken_copy(document: Doc, breakage: tuple[str | int | object, ...]) -> Doc:
    """A deep copy of ``document`` with the value at the key path ``breakage[:-1]`` set to ``breakage[-1]``."""
    broken = yaml.safe_load(yaml.safe_dump(dict(document)))
    *keys, last, value = breakage
    target = broken
    for key in keys:
        target = target[key]
    target[last] = value
    return dict(broken)


@pytest.mark.parametrize(
    "breakage",
    [
        ("spec", "backofLimit", 0),  # a misspelt field: strict validation refuses unknown fields
        ("spec", "backoffLimit", "none"),  # a wrong type
        ("spec", "template", "spec", "containers", 0, "resources", "limit", {"cpu": "1"}),
    ],
    ids=["unknown-field", "wrong-type", "nested-unknown-field"],
)
def test_a_broken_manifest_fails_the_check(breakage: tuple[str | int | object, ...]) -> None:
    _, job = jobs()[0]
    broken = broken_copy(job, breakage)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_the_shards_job_runs_one_shard_per_index_and_the_merge_job_merges_them() -> None:
    (job,) = documents(DEPLOY / "shards" / "job.yaml")
    spec = _mapping(job, "spec")
    (container,) = _list(spec, "template", "spec", "containers")
    env = {
        str(_at(entry, "name")): _at(entry, "value") for entry in _list(container, "env") if "value" in _mapping(entry)
    }
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert env["KVBENCH_SHARDS"] == str(spec["completions"])
    script = str(_list(container, "command")[2])
    assert '--shard "$JOB_COMPLETION_INDEX/$KVBENCH_SHARDS"' in script
    assert '--output-dir "/results/$KVBENCH_RUN/shard-$JOB_COMPLETION_INDEX"' in script
    args = [str(arg) for arg in _list(container, "args")]
    assert args[0] == "sweep" and args[args.index("--start-at") + 1] == "$(KVBENCH_START_AT)"
    (merge,) = documents(DEPLOY / "shards" / "merge" / "job.yaml")
    (merger,) = _list(merge, "spec", "template", "spec", "containers")
    assert 'kvbench merge "/results/$KVBENCH_RUN"/shard-*/*/' in str(_list(merger, "command")[2])


def test_the_rayjob_runs_one_shard_per_worker_pod_and_writes_one_run_directory() -> None:
    (job,) = documents(DEPLOY / "ray" / "rayjob.yaml")
    spec = _mapping(job, "spec")
    assert spec["backoffLimit"] == 0 and spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int)
    entrypoint = str(spec["entrypoint"]).split()
    assert entrypoint[:2] == ["kvbench", "sweep"]
    assert entrypoint[entrypoint.index("--ray") + 1] == "auto"
    assert entrypoint[entrypoint.index("-o") + 1].startswith("/results/")
    (group,) = _list(spec, "rayClusterSpec", "workerGroupSpecs")
    workers = int(entrypoint[entrypoint.index("--workers") + 1])
    assert _at(group, "replicas") == _at(group, "minReplicas") == _at(group, "maxReplicas") == workers
    assert _at(group, "rayStartParams", "num-cpus") == "1"  # one shard actor (one CPU) per worker pod
    head = _mapping(spec, "rayClusterSpec", "headGroupSpec")
    assert _at(head, "rayStartParams", "num-cpus") == "0"  # the driver's pod runs no shard
    for pod, mounts_results in (
        (_mapping(head, "template", "spec"), True),
        (_mapping(group, "template", "spec"), False),
    ):
        _, env, claims = fit_pod(pod)
        assert _at(env["KVBENCH_API_KEY"], "valueFrom", "secretKeyRef", "name") == "kvbench-api-key"
        assert claims == (["kvbench-results"] if mounts_results else [])  # the workers stream; only the head writes


@pytest.mark.parametrize(
    "breakage",
    [
        ("spec", "shutdownAfterJobFinish", True),  # a misspelt field
        ("spec", "backoffLimit", "none"),  # a wrong type
        ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "containers", 0, "resource", {}),
    ],
    ids=["unknown-field", "wrong-type", "nested-unknown-field"],
)
def test_a_broken_rayjob_fails_the_check(breakage: tuple[str | int | object, ...]) -> None:
    (job,) = documents(DEPLOY / "ray" / "rayjob.yaml")
    broken = broken_copy(job, breakage)
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
