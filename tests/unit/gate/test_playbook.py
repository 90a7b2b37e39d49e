"""The rollout playbook: stages, attached runs, gates judged from stored files, and what is next."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.gate.playbook import (
    PlaybookError,
    attach_run,
    load_playbook,
    playbook_status,
    save_playbook,
    starter_playbook,
)
from kvbench.cli import app
from tests.resultfiles import make_probe_run, make_soak_dir


def attached_to_endpoint(run_dir: Path) -> Path:
    """The run, as if measured against an endpoint kvbench attached to (the production service)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["engine"] = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def new_playbook(tmp_path: Path, **gates: float) -> Path:
    path = tmp_path / "playbook.yaml"
    playbook = starter_playbook("Acme chat")
    stages = playbook.stages
    if "min_speedup" in gates:
        stages = stages.model_copy(
            update={"poc": stages.poc.model_copy(update={"gate": stages.poc.gate.model_copy(update=gates)})}
        )
    save_playbook(playbook.model_copy(update={"stages": stages}), path)
    return path


def test_new_playbook_starts_at_baseline(tmp_path: Path) -> None:
    path = new_playbook(tmp_path)
    status = playbook_status(path)
    assert [s.state for s in status.stages] == ["pending"] * 5
    assert status.current == "baseline"
    assert "kvbench run playbook-sim" in status.next_step
    assert f"kvbench playbook attach {path} baseline RUN_DIR" in status.next_step


def test_walk_through_every_stage(tmp_path: Path) -> None:
    path = new_playbook(tmp_path)
    runs = tmp_path / "runs"
    baseline = make_probe_run(runs, name="baseline", speedup=4.0)
    attach_run(path, "baseline", baseline)
    status = playbook_status(path)
    assert status.stage("baseline").state == "done"
    assert "AMG-OFF t2 at 8000 tokens" in status.stage("baseline").evidence
    assert status.current == "poc"

    attach_run(path, "poc", make_probe_run(runs, name="poc", speedup=1.5))
    poc = playbook_status(path).stage("poc")
    assert poc.state == "failed" and re.search(r"= 1\.[45]\d× at 8000 tokens t2$", poc.evidence), poc.evidence
    attach_run(path, "poc", make_probe_run(runs, name="poc", speedup=5.0))
    status = playbook_status(path)
    assert status.stage("poc").state == "done" and status.current == "staging"
    assert "kvbench soak soak-sim --window 4h" in status.next_step

    attach_run(path, "staging", make_soak_dir(runs, name="soak-bad", error_burst=True))
    staging = playbook_status(path).stage("staging")
    assert staging.state == "failed" and "error rate" in staging.evidence
    attach_run(path, "staging", make_soak_dir(runs, name="soak-good"))
    assert playbook_status(path).stage("staging").state == "done"

    only_on: list[dict[str, object]] = [{"name": "prod", "offload": "cpu"}]
    attach_run(path, "production", make_probe_run(runs, name="prod-sim", speedup=4.0, arms=only_on))
    simulated = playbook_status(path).stage("production")
    assert simulated.state == "pending" and simulated.provenance == "simulated", simulated
    assert simulated.evidence.startswith("SIMULATED")
    attach_run(path, "production", attached_to_endpoint(make_probe_run(runs, name="prod", speedup=4.0, arms=only_on)))
    status = playbook_status(path)
    production = status.stage("production")
    assert production.state == "done", production.evidence
    assert production.provenance == "measured"
    assert "production (prod)" in production.evidence
    assert status.current == "case_study"
    assert "kvbench report --html --playbook" in status.next_step

    report = tmp_path / "case-study.html"
    report.write_text("<html></html>")
    old = time.time() - 3600
    os.utime(report, (old, old))
    assert playbook_status(path).stage("case_study").state == "pending"  # older than the runs: stale
    os.utime(report, None)
    status = playbook_status(path)
    assert status.current is None and all(s.state == "done" for s in status.stages)

    saved = load_playbook(path)
    assert len(saved.stages.poc.runs) == 2 and not Path(saved.stages.poc.runs[0]).is_absolute()


def test_attach_checks_the_kind_of_run(tmp_path: Path) -> None:
    path = new_playbook(tmp_path)
    soak = make_soak_dir(tmp_path / "runs")
    with pytest.raises(PlaybookError, match="a soak directory cannot be attached to stage poc"):
        attach_run(path, "poc", soak)
    with pytest.raises(PlaybookError, match="unknown stage 'qa'; stages: baseline, poc"):
        attach_run(path, "qa", soak)
    with pytest.raises(PlaybookError, match="not a directory"):
        attach_run(path, "staging", tmp_path / "nope")


def test_invalid_playbook_names_field_and_allowed_values(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nstages:\n  poc:\n    gate: {min_speed: 2}\n")
    with pytest.raises(PlaybookError) as error:
        load_playbook(path)
    message = str(error.value)
    assert str(path) in message and "stages.poc.gate.min_speed" in message
    assert "allowed fields here: arm, min_speedup" in message


def test_cli_init_attach_status(tmp_path: Path) -> None:
    runner = CliRunner()
    path = tmp_path / "pb.yaml"
    assert runner.invoke(app, ["playbook", "init", str(path), "--name", "Demo"]).exit_code == 0
    assert runner.invoke(app, ["playbook", "init", str(path)]).exit_code == 2  # exists
    run = make_probe_run(tmp_path / "runs")
    attached = runner.invoke(app, ["playbook", "attach", str(path), "baseline", str(run)])
    assert attached.exit_code == 0, attached.output
    shown = runner.invoke(app, ["playbook", "status", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "DONE" in shown.output and "PENDING" in shown.output and "Next:" in shown.output
