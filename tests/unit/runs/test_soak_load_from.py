"""``kvbench soak --load-from SWEEP_DIR``: a stability window at a share of the measured capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.runs.kinds import RUN_KINDS, LaunchOverrides, load_from_sweep
from harness.scenario.soak import SoakError
from harness.scenario.spec import load_scenario

ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "docs" / "results" / "sweep-qwen3-14b-sim"
PROBE = ROOT / "docs" / "results" / "quickstart-sim"


def _capacity(arm: str) -> float:
    stored = json.loads((SWEEP / "sweep.json").read_text())
    return float(next(c["at_load"] for c in stored["capacity"] if c["arm"] == arm))


def test_the_load_is_the_share_of_the_arms_capacity_in_whole_users() -> None:
    scenario, _ = load_scenario("pliops-qwen3-14b")
    load, source = load_from_sweep(scenario, "AMG-ON", SWEEP, 0.7)
    assert load == round(0.7 * _capacity("AMG-ON"))
    assert "70% of AMG-ON's capacity within the SLO" in source and "sweep-qwen3-14b" in source
    assert load_from_sweep(scenario, "AMG-OFF", SWEEP, 0.5)[0] == round(0.5 * _capacity("AMG-OFF"))


def test_the_soak_check_puts_the_derived_load_and_its_source_in_the_scenario() -> None:
    scenario, _ = load_scenario("pliops-qwen3-14b")
    check = RUN_KINDS["soak"].check
    effective = check(scenario, "pliops", LaunchOverrides(arm="AMG-ON", load_from=SWEEP, window_s=60, interval_s=10))
    assert effective.soak is not None
    assert effective.soak.load == round(0.7 * _capacity("AMG-ON"))
    assert effective.soak.load_source is not None and "AMG-ON" in effective.soak.load_source
    with pytest.raises(SoakError, match="--load or --load-from, not both"):
        check(scenario, "pliops", LaunchOverrides(load=4, load_from=SWEEP))


@pytest.mark.parametrize(
    ("arm", "where", "fraction", "message"),
    [
        ("AMG-MAYBE", SWEEP, 0.7, r"no arm 'AMG-MAYBE' \(arms: AMG-OFF, AMG-ON\)"),
        ("AMG-ON", PROBE, 0.7, r"a probe run, not a sweep"),
        ("AMG-ON", SWEEP, 1.5, r"--load-fraction 1\.5: must be in \(0, 1\]"),
    ],
)
def test_what_cannot_give_a_load_says_why(arm: str, where: Path, fraction: float, message: str) -> None:
    scenario, _ = load_scenario("pliops-qwen3-14b")
    with pytest.raises(SoakError, match=message):
        load_from_sweep(scenario, arm, where, fraction)
