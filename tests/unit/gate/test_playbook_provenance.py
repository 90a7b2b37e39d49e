"""Provenance gates the playbook: staging and production close only on measured evidence of their kind.

A simulated soak passes its criteria but leaves staging pending (SIMULATED, with the way out); a soak measured
on a real engine closes it. Every stage says the provenance of its run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from harness.gate.playbook import attach_run, playbook_status
from tests.resultfiles import make_playbook, make_probe_run, make_soak_dir


def with_engine(run_dir: Path, engine: Mapping[str, object]) -> Path:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["engine"] = dict(engine)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


SIM = {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"}
STAGING_VLLM = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}


def test_a_simulated_soak_leaves_staging_pending_and_a_measured_one_closes_it(tmp_path: Path) -> None:
    path, runs = make_playbook(tmp_path, "Acme")
    attach_run(path, "poc", make_probe_run(runs, name="poc", speedup=5.0))
    status = playbook_status(path)
    assert status.stage("poc").state == "done" and status.stage("poc").provenance == "simulated"
    assert "simulated" in status.stage("poc").provenance_label

    attach_run(path, "staging", with_engine(make_soak_dir(runs, name="soak-sim"), SIM))
    staging = playbook_status(path).stage("staging")
    assert staging.state == "pending" and staging.provenance == "simulated"
    assert staging.evidence.startswith("SIMULATED") and "PASS" in staging.evidence
    assert "staging engine" in staging.next_step

    attach_run(path, "staging", with_engine(make_soak_dir(runs, name="soak-real"), STAGING_VLLM))
    staging = playbook_status(path).stage("staging")
    assert staging.state == "done" and staging.provenance == "measured"


def test_a_production_run_on_an_engine_kvbench_started_is_not_the_production_service(tmp_path: Path) -> None:
    path, runs = make_playbook(tmp_path, "Acme")
    started = {"kind": "vllm", "model": "m"}
    attach_run(path, "production", with_engine(make_probe_run(runs, name="prod", speedup=4.0), started))
    production = playbook_status(path).stage("production")
    assert production.state == "pending" and "not the production service" in production.evidence
