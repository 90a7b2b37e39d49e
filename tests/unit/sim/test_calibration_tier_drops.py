"""A calibration names the adjacent lengths where an arm's turn 2 from the tier got faster as the prompt grew."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.sim.calibration import Residual
from kvbench.cli.sim import sim_app
from tests.unit.results.test_calibrate import chosen


def _cell(arm: str, backend: str, tokens: int, turn: int, measured_ms: float) -> Residual:
    return Residual(
        measured_ms=measured_ms,
        predicted_ms=measured_ms,
        used_in_fit=True,
        arm=arm,
        backend=backend,
        context_tokens=tokens,
        turn=turn,
        requests=3,
    )


def test_only_turn_2_of_tier_arms_from_1k_tokens_and_only_where_the_longer_prompt_is_faster() -> None:
    cells = [
        # the BF16 70B three-pass run's LMCache turn 2 (measured medians, ms)
        _cell("LMC", "lmcache", 128000, 2, 773.6),
        _cell("LMC", "lmcache", 96000, 2, 788.4),
        _cell("LMC", "lmcache", 64000, 2, 478.0),
        _cell("LMC", "lmcache", 50, 2, 102.4),  # no whole chunk to load: left out
        _cell("LMC", "lmcache", 1000, 2, 85.4),
        _cell("LMC", "lmcache", 96000, 1, 12249.0),  # turn 1: a prefill, not a load
        _cell("LMC", "lmcache", 128000, 1, 100.0),
        _cell("OFF", "none", 96000, 2, 11749.5),  # no tier
        _cell("OFF", "none", 128000, 2, 100.0),
    ]
    calibration = chosen().model_copy(update={"residuals": cells})
    drops = [(a.context_tokens, b.context_tokens) for a, b in calibration.falling_tier_hits()]
    assert drops == [(96000, 128000)]
    rising = chosen().model_copy(update={"residuals": [c for c in cells if c.context_tokens != 96000]})
    assert rising.falling_tier_hits() == []


@pytest.mark.lab
def test_calibrate_prints_them_for_the_committed_bf16_70b_three_pass_run(tmp_path: Path) -> None:
    run = Path(__file__).resolve().parents[3] / "lab" / "runs" / "gpu-seed-llama70b-tp4-fp16-h200-3pass"
    result = CliRunner().invoke(
        sim_app, ["calibrate", str(run), "--holdout", "2000,16000,96000", "-o", str(tmp_path / "c.yaml")]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Turn 2 from the tier is faster"))
    assert lines[start + 1 : start + 3] == [
        "  AMG-ON-LMCache: 1,000 -> 2,000 tokens, 85.4 -> 67.2 ms",
        "  AMG-ON-LMCache: 96,000 -> 128,000 tokens, 788.4 -> 773.6 ms",
    ]
    assert not lines[start + 3].startswith("  AMG-ON-LMCache:")
