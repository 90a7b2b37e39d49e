"""manifest.json version 2 holds the run's prompt salt: drawn once when the run directory is created, kept by
every ``--resume``, null with ``workload.prompt_salt: fixed``; a version-1 manifest (before salts) still reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import RunDirError
from harness.scenario.spec import Scenario, parse_scenario
from harness.store.manifest import Manifest, prompt_salt_of, read_manifest
from harness.store.manifest_model import ManifestFile


def scenario(salting: str = "per_run") -> Scenario:
    data = {
        "name": "salted",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "ON", "offload": "cpu"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "prompt_salt": salting},
    }
    return parse_scenario(data, "test")


def test_the_salt_is_drawn_once_and_kept_by_resume(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    Manifest.start(path, scenario(), None, attempt=0)
    state, salt = prompt_salt_of(read_manifest(path))
    assert state == "per_run" and salt
    Manifest.start(path, scenario(), None, attempt=1)  # what --resume does
    data = read_manifest(path)
    assert prompt_salt_of(data) == ("per_run", salt)
    assert [a["attempt"] for a in data["attempts"]] == [0, 1]
    ManifestFile.model_validate(json.loads(path.read_text()))
    other = tmp_path / "other.json"
    Manifest.start(other, scenario(), None, attempt=0)
    assert prompt_salt_of(read_manifest(other))[1] != salt  # a new run draws its own


def test_fixed_prompts_have_no_salt(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    Manifest.start(path, scenario("fixed"), None, attempt=0)
    data = read_manifest(path)
    assert data["manifest_version"] == 3 and prompt_salt_of(data) == ("fixed", None)
    ManifestFile.model_validate(json.loads(path.read_text()))


def test_a_version_2_manifest_without_its_salt_is_refused_and_version_1_reads(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    Manifest.start(path, scenario(), None, attempt=0)
    data = json.loads(path.read_text())
    del data["prompt_salt"]
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match=r"manifest.json: prompt_salt: missing \(a manifest of version 2"):
        read_manifest(path)
    data["manifest_version"] = 1
    path.write_text(json.dumps(data))
    assert prompt_salt_of(read_manifest(path)) == ("unrecorded", None)
    ManifestFile.model_validate(data)
    data["prompt_salt"] = "../x"
    data["manifest_version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match="prompt_salt: must be letters and digits"):
        read_manifest(path)
