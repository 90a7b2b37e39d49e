"""The gate knows its power: a cell that cannot detect the threshold is INCONCLUSIVE (exit 3), never PASS."""

from __future__ import annotations

import json
import math
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.gate.compare import (
    CompareResult,
    compare_paths,
    detectable_error_increase,
    detectable_shift,
    samples_needed,
)
from kvbench.cli import app
from tests.unit.gate.test_compare import make_run


def doubled_on_t2(arm: str, ctx: int, turn: int) -> float:
    return 2.0 if (arm, turn) == ("AMG-ON", 2) else 1.0


def test_two_requests_per_cell_cannot_pass_a_doubled_ttft(tmp_path: Path) -> None:
    """The issue's case: n = 2 per cell, every AMG-ON turn-2 TTFT doubled; alpha 0.01 can never reject."""
    base = make_run(tmp_path / "a", seed=1, conversations=2)
    current = make_run(tmp_path / "b", seed=2, conversations=2, shift=doubled_on_t2)
    result = compare_paths(base, current)
    assert result.verdict == "inconclusive" and result.exit_code == 3
    doubled = [c for c in result.comparisons if c.metric == "ttft" and (c.arm, c.turn) == ("AMG-ON", 2)]
    assert doubled and all(c.status == "inconclusive" for c in doubled)
    for cell in doubled:
        assert cell.ci_low is not None and cell.ci_low > 80  # its own CI says "doubled"...
        assert cell.min_detectable_change is None  # ...but no change is detectable with 2 vs 2
        assert cell.needed_n == 5  # 1 / C(10, 5) = 0.004 ≤ 0.01 < 1 / C(8, 4)
    assert result.needed_ttft_n == 5

    out = tmp_path / "out"
    runner = CliRunner()
    outputs = ["--markdown", str(out / "gate.md"), "--junit", str(out / "gate.xml"), "--json", str(out / "gate.json")]
    invoked = runner.invoke(app, ["compare", str(base), str(current), *outputs])
    assert invoked.exit_code == 3, invoked.output
    assert "INCONCLUSIVE" in invoked.output and "PASS" not in invoked.output
    assert "need n ≥ 5 per cell" in invoked.output
    markdown = (out / "gate.md").read_text(encoding="utf-8")
    assert "INCONCLUSIVE" in markdown and "need n ≥ 5 per cell" in markdown
    suite = ET.parse(out / "gate.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    error = suite.find("testcase[@name='conclusive']/error")
    assert error is not None and error.get("type") == "inconclusive" and "need n ≥ 5" in error.get("message", "")
    verdict = suite.find("properties/property[@name='verdict']")
    assert verdict is not None and verdict.get("value") == "inconclusive"
    stored = json.loads((out / "gate.json").read_text(encoding="utf-8"))
    assert stored["schema_version"] == 2 and stored["verdict"] == "inconclusive"
    assert CompareResult.read_file(out / "gate.json").verdict == "inconclusive"


def test_six_requests_per_cell_catch_thirty_percent(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1, conversations=6)
    current = make_run(
        tmp_path / "b", seed=2, conversations=6, shift=lambda a, c, t: 1.3 if (a, t) == ("AMG-ON", 2) else 1.0
    )
    result = compare_paths(base, current)
    assert result.verdict == "regression" and result.exit_code == 1
    assert sorted(c.name for c in result.regressions) == ["ttft AMG-ON 1000 tok t2", "ttft AMG-ON 8000 tok t2"]
    for cell in result.comparisons:
        if cell.metric == "ttft":
            assert cell.min_detectable_change is not None and cell.min_detectable_change < 10


def scale_ttfts(run_dir: Path, seed: int, low: float, high: float) -> None:
    """Multiply every stored TTFT by a random factor in [low, high]: a noisier engine."""
    rng = random.Random(seed)
    lines = []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["ttft_ns"] is not None:
            record["ttft_ns"] = int(record["ttft_ns"] * rng.uniform(low, high))
        lines.append(json.dumps(record))
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")


def test_noisy_cells_that_cannot_see_the_threshold_are_inconclusive(tmp_path: Path) -> None:
    """Enough requests to reach alpha, too much noise to see +10 %: the unchanged rerun is not a PASS."""
    base = make_run(tmp_path / "a", seed=1, conversations=8)
    current = make_run(tmp_path / "b", seed=2, conversations=8)
    scale_ttfts(base, 1, 0.6, 1.6)
    scale_ttfts(current, 2, 0.6, 1.6)
    result = compare_paths(base, current)
    assert result.verdict == "inconclusive" and result.exit_code == 3
    ttft = [c for c in result.comparisons if c.metric == "ttft"]
    assert all(c.status == "inconclusive" for c in ttft)
    for cell in ttft:
        assert cell.min_detectable_change is not None and cell.min_detectable_change > 10
        assert cell.needed_n is not None and cell.needed_n > 8
        assert f"need n ≥ {cell.needed_n} per cell" in cell.detail
    # with the wider threshold the same noise is detectable: the gate passes
    assert compare_paths(base, current, ["ttft=200"]).verdict == "pass"


@pytest.mark.parametrize("spread", [0.0, 0.01, 0.05, 0.15, 0.4])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_samples_needed_is_the_smallest_n_that_detects_the_shift(spread: float, alpha: float) -> None:
    shift = math.log(1.10)
    needed = samples_needed(spread, alpha, shift)
    assert needed is not None
    assert detectable_shift(needed, needed, spread, alpha) <= shift
    assert detectable_shift(needed - 1, needed - 1, spread, alpha) > shift


def test_mann_whitney_floor_and_fisher_power() -> None:
    assert detectable_shift(2, 2, 0.0, 0.01) == math.inf  # two samples can never reject at 0.01
    assert detectable_shift(5, 5, 0.0, 0.01) == 0.0
    assert samples_needed(0.0, 0.01, math.log(1.1)) == 5
    assert samples_needed(0.1, 0.01, 0.0) is None  # a 0 % threshold under noise: no n suffices
    # 36 requests per arm, none failed before: k failures now have p = C(36, k) / C(72, k), below 0.01 from k = 7
    assert math.comb(36, 6) / math.comb(72, 6) > 0.01 > math.comb(36, 7) / math.comb(72, 7)
    assert detectable_error_increase(0, 36, 36, 0.01) == pytest.approx(7 / 36)


def test_a_rise_in_errors_too_small_to_test_is_inconclusive(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2)
    lines = (current / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first.update(ok=False, ttft_ns=None, error_kind="timeout")
    (current / "records.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    result = compare_paths(base, current)
    errors = {c.arm: c for c in result.comparisons if c.metric == "error_rate"}
    assert errors[first["arm"]].status == "inconclusive"  # 0/32 → 1/32 cannot be told from +1 point
    assert "need more requests per arm" in errors[first["arm"]].detail
    assert {c.status for arm, c in errors.items() if arm != first["arm"]} == {"pass"}  # no rise: nothing to judge
    assert result.verdict == "inconclusive"
