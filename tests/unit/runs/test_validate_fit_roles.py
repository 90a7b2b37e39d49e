"""``kvbench sim validate`` says, per sweep load point or probe length, whether the calibration was fitted on it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.calibrate.validate import length_roles, load_roles
from harness.scenario.spec import parse_scenario
from harness.sim.calibration import SourceRun
from harness.store.rundir import RunDir
from tests.unit.results.test_calibrate import chosen


def _run(path: Path, run_id: str) -> RunDir:
    scenario = parse_scenario(
        {
            "name": "roles",
            "engine": {"kind": "vllm", "model": "synth:llama-3.1-8b"},
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 1, "turns": 2},
        },
        "test",
    )
    run_dir = RunDir.create(path, scenario)
    run_dir.manifest_file.write_text(json.dumps({"run_id": run_id}), encoding="utf-8")
    return run_dir


def test_loads_of_a_source_sweep_are_fit_or_held_out_and_another_sweep_is_out_of_sample(tmp_path: Path) -> None:
    mine, other = _run(tmp_path / "a", "mine"), _run(tmp_path / "b", "other")
    digest = hashlib.sha256(mine.manifest_file.read_bytes()).hexdigest()
    source = SourceRun(path=str(mine.path), run_id="mine", manifest_sha256=digest, gpu="H100", host_link=None)
    calibration = chosen().model_copy(update={"sources": [source], "holdout_loads": [16.0, 24.0]})
    assert load_roles(calibration, mine, [4.0, 12.0, 16.0, 24.0]) == {
        4.0: "fit",
        12.0: "fit",
        16.0: "held out",
        24.0: "held out",
    }
    assert load_roles(calibration, other, [4.0, 16.0]) == {}
    assert load_roles(None, mine, [4.0]) == {}


def test_lengths_of_a_source_probe_are_fit_or_held_out_and_another_run_is_out_of_sample(tmp_path: Path) -> None:
    mine, other = _run(tmp_path / "a", "mine"), _run(tmp_path / "b", "other")
    digest = hashlib.sha256(mine.manifest_file.read_bytes()).hexdigest()
    source = SourceRun(path=str(mine.path), run_id="mine", manifest_sha256=digest, gpu="H200", host_link=None)
    calibration = chosen().model_copy(update={"sources": [source], "fit_context_tokens": [1000, 8000]})
    assert length_roles(calibration, mine, [1000, 2000, 8000]) == {1000: "fit", 2000: "held out", 8000: "fit"}
    assert length_roles(calibration, other, [1000, 2000]) == {1000: "other run", 2000: "other run"}
