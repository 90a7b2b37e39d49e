"""The nightly regression gate on real simulator runs.

Each run gets a fresh simulator process (``kvbench sim serve``) behind a scenario of engine kind
``openai`` -- the nightly setup, where kvbench talks to an endpoint it does not manage. The
scenario file is the same for every night; what changes is the server behind it:

* an unchanged rerun (same settings) is never a regression: it passes (exit 0) when its cells are
  quiet enough to detect +10 %, else it is INCONCLUSIVE (exit 3) with the requests per cell it needs;
* a planted regression -- the CPU tier behind the endpoint reads at 1 GB/s instead of 25 GB/s,
  so turn-2 loads take longer -- must be caught (exit 1) in the turn-2 cells and nowhere else;
* a run recorded on other hardware (the stored scenario's hardware label) cannot be compared (exit 2);
* two requests per cell can never reach alpha 0.01: the same planted regression is INCONCLUSIVE
  (exit 3) with the requests per cell it needs, in the console, Markdown, JUnit and JSON alike.

The nights run as ``kvbench`` processes; the first test's three compares run in this process (typer's
``CliRunner``: the same command, exit code and output without three more CLI start-ups of seconds each on
2 cores), the second test's compare as a process.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from kvbench.cli import app
from tests.support import SimulatorLauncher, kvbench

pytestmark = pytest.mark.integration

TIER = {"kind": "cpu", "capacity_gb": 64}
SLOW_TIER = {"kind": "cpu", "capacity_gb": 64, "read_gbps": 1.0}


def scenario(base_url: str, hardware: str = "h100-sxm", conversations: int = 6) -> dict[str, object]:
    return {
        "name": "nightly-gate",
        "engine": {"kind": "openai", "model": "llama-3.1-8b", "base_url": base_url, "hardware": hardware},
        "arms": [{"name": "AMG-ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa", "context_tokens": [2000, 8000], "conversations": conversations, "turns": 2,
            "answer_tokens": 4, "warmup_requests": 1, "between_turns": {"mode": "reset_prefix_cache"},
        },
        "gate": {"alpha": 0.01, "ttft_max_increase_pct": 10},
        "seed": 9,
    }  # fmt: skip


def sim_config(tmp: Path, label: str, tier: dict[str, object]) -> Path:
    """The simulator's settings file: Llama-3.1-8B on one H100 with one CPU tier."""
    settings = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "offload": {"name": "cpu", "tiers": [tier]}}
    path = tmp / f"sim-{label}.json"
    path.write_text(json.dumps(settings))
    return path


def night(simulator: SimulatorLauncher, tmp: Path, label: str, tier: dict[str, object], conversations: int = 6) -> Path:
    """One nightly run against a fresh simulator; returns its run directory."""
    with simulator("--config", str(sim_config(tmp, label, tier))) as base_url:
        path = tmp / f"{label}.yaml"
        path.write_text(yaml.safe_dump(scenario(base_url, conversations=conversations)))
        done = kvbench("run", str(path), "-o", str(tmp / label), cwd=tmp)
        assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp / label).iterdir()
    return run_dir


def compare(*args: str) -> Result:
    """``kvbench compare ARGS`` in this process."""
    done = CliRunner().invoke(app, ["compare", *args])
    # a crash would also read as exit 1, a regression: only the command's own exit counts
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    return done


def test_gate_passes_unchanged_rerun_and_catches_planted_regression(
    simulator: SimulatorLauncher, tmp_path: Path
) -> None:
    baseline = night(simulator, tmp_path, "baseline", TIER)
    rerun = night(simulator, tmp_path, "rerun", TIER)
    regressed = night(simulator, tmp_path, "regressed", SLOW_TIER)

    same = compare(str(baseline), str(rerun), "--junit", str(tmp_path / "same.xml"))
    assert same.exit_code in (0, 3), same.output
    assert ("PASS: no regression" in same.stdout) if same.exit_code == 0 else ("per cell" in same.stdout)

    caught_files = ["--junit", str(tmp_path / "caught.xml"), "--json", str(tmp_path / "caught.json")]
    caught = compare(str(baseline), str(regressed), *caught_files)
    assert caught.exit_code == 1, caught.output
    assert "REGRESSION" in caught.stdout
    result = json.loads((tmp_path / "caught.json").read_text())
    regressions = {(c["context_tokens"], c["turn"]) for c in result["comparisons"] if c["status"] == "regression"}
    assert (8000, 2) in regressions
    assert all(turn == 2 for _, turn in regressions)  # turn 1 never touches the tier
    suite = ET.parse(tmp_path / "caught.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures", "0")) == len(regressions)

    # the same stored run, as if recorded on other hardware: the gate refuses to compare
    other = tmp_path / "other-hw" / baseline.name
    shutil.copytree(baseline, other)
    stored = yaml.safe_load((other / "scenario.yaml").read_text())
    stored["engine"]["hardware"] = "h200-sxm"
    (other / "scenario.yaml").write_text(yaml.safe_dump(stored))
    refused = compare(str(baseline), str(other))
    assert refused.exit_code == 2, refused.output
    assert "CANNOT COMPARE" in refused.stdout and "different hardware" in refused.stdout


def test_two_requests_per_cell_are_inconclusive_never_pass(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    baseline = night(simulator, tmp_path, "baseline", TIER, conversations=2)
    regressed = night(simulator, tmp_path, "regressed", SLOW_TIER, conversations=2)
    files = {"markdown": tmp_path / "gate.md", "junit": tmp_path / "gate.xml", "json": tmp_path / "gate.json"}
    outputs = [arg for name, path in files.items() for arg in (f"--{name}", str(path))]
    told = kvbench("compare", str(baseline), str(regressed), *outputs, cwd=tmp_path)
    assert told.returncode == 3, told.stdout + told.stderr
    for text in (told.stdout, files["markdown"].read_text(encoding="utf-8")):
        assert "INCONCLUSIVE" in text and "PASS" not in text and "need n ≥ 5 per cell" in text
    result = json.loads(files["json"].read_text())
    assert result["verdict"] == "inconclusive"
    ttft = [c for c in result["comparisons"] if c["metric"] == "ttft"]
    assert ttft and all(c["status"] == "inconclusive" and c["needed_n"] >= 5 for c in ttft)
    suite = ET.parse(files["junit"]).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"
