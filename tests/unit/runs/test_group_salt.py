"""A probe group that ``--resume`` re-runs after an earlier attempt sent part of it gets the run's salt plus the
attempt: an attached endpoint's tier may still hold that attempt's turn 1. Other groups keep the run's salt."""

from __future__ import annotations

import json
from pathlib import Path

from harness.runs.probe import ProbeRunner
from harness.store.rundir import RunDir
from tests.resultfiles import make_probe_run
from workloads.salt import retry_salt


def test_a_group_an_earlier_attempt_left_unfinished_is_rerun_under_its_own_salt(tmp_path: Path) -> None:
    run_dir = RunDir.open(make_probe_run(tmp_path, name="resumed"))  # attempt 0 sent every group of every arm
    manifest = json.loads(run_dir.manifest_file.read_text())
    manifest.update(manifest_version=2, prompt_salt="5a17")
    run_dir.manifest_file.write_text(json.dumps(manifest))
    runner = ProbeRunner(run_dir.scenario(), run_dir)
    assert runner.attempt == 1
    assert runner.group_salt("AMG-ON", 0, 8000) == retry_salt("5a17", 1) != "5a17"
    assert runner.group_salt("AMG-ON", 1, 8000) == "5a17"  # a repetition no attempt sent: the run's salt
