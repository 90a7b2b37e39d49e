"""The regression gate on stored run directories: noise passes, planted regressions fail, mismatches exit 2."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.gate.compare import (
    CompareError,
    apply_threshold_flags,
    compare_paths,
    min_mannwhitney_p,
)
from harness.scenario.spec import GateSpec, parse_scenario
from harness.store.events import GroupDone
from harness.store.records import RecordWriter
from harness.store.rundir import RunDir
from kvbench.cli import app
from reports.gate import render_junit, render_markdown
from tests.resultfiles import probe_scenario, request_record
from workloads.config import MultiRoundQAProbe


def gate_scenario() -> dict[str, Any]:
    return probe_scenario("gate", conversations=8)


# median TTFT (ms) of each (arm, context, turn) cell
LEVELS = {
    ("AMG-OFF", 1000, 1): 60.0, ("AMG-OFF", 1000, 2): 62.0, ("AMG-OFF", 8000, 1): 480.0, ("AMG-OFF", 8000, 2): 482.0,
    ("AMG-ON", 1000, 1): 60.0, ("AMG-ON", 1000, 2): 20.0, ("AMG-ON", 8000, 1): 480.0, ("AMG-ON", 8000, 2): 95.0,
}  # fmt: skip

Shift = Callable[[str, int, int], float]


def no_shift(arm: str, ctx: int, turn: int) -> float:
    return 1.0


def make_run(
    parent: Path,
    *,
    seed: int,
    shift: Shift = no_shift,
    scenario: dict[str, Any] | None = None,
    error_share: float = 0.0,
    gpus: list[str] | None = None,
    conversations: int | None = None,
) -> Path:
    """A run directory written the way the runner writes one: scenario, manifest, records, progress."""
    data = json.loads(json.dumps(scenario)) if scenario else gate_scenario()  # the caller's dict stays as it was
    if conversations is not None:
        data["workload"]["conversations"] = conversations
    parsed = parse_scenario(data, "test")
    workload = parsed.workload
    assert isinstance(workload, MultiRoundQAProbe)
    run_dir = RunDir.create(parent, parsed)
    rng = random.Random(seed)
    manifest = {"scenario_name": parsed.name, "host": {"gpus": [{"name": g} for g in gpus or []]}, "engines": {}}
    run_dir.manifest_file.write_text(json.dumps(manifest))
    with RecordWriter(run_dir.records_file) as writer:
        for arm in ("AMG-OFF", "AMG-ON"):
            for ctx in workload.context_tokens:
                for conv in range(data["workload"]["conversations"]):
                    for turn in (1, 2):
                        level = LEVELS[(arm, ctx, turn)] * shift(arm, ctx, turn)
                        ttft = level * rng.uniform(0.96, 1.04)
                        failed = rng.random() < error_share
                        cached = int(ctx * 0.95) if arm == "AMG-ON" and turn == 2 else 0
                        writer.append(
                            request_record(
                                arm,
                                ctx,
                                conv,
                                turn,
                                request_id=f"{arm}{ctx}{conv}{turn}",
                                ttft_ns=None if failed else int(ttft * 1e6),
                                e2e_ns=None,
                                ok=not failed,
                                error_kind="timeout" if failed else None,
                                prompt_tokens=ctx,
                                cached_tokens=cached,
                            )
                        )
            for ctx in workload.context_tokens:
                run_dir.mark_group_done(GroupDone(arm=arm, repetition=0, context_tokens=ctx, attempt=0))
    return run_dir.path


def test_unchanged_rerun_passes(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2)
    result = compare_paths(base, current)
    assert result.verdict == "pass"
    assert result.exit_code == 0
    ttft = [c for c in result.comparisons if c.metric == "ttft"]
    assert len(ttft) == 8 and all(c.status == "pass" for c in ttft)
    assert {c.metric for c in result.comparisons} == {"ttft", "error_rate", "hit_rate"}


def test_planted_regression_is_caught_in_its_cell_only(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)

    def slower_on_t2(arm: str, ctx: int, turn: int) -> float:
        return 1.3 if (arm, turn) == ("AMG-ON", 2) else 1.0

    current = make_run(tmp_path / "b", seed=2, shift=slower_on_t2)
    result = compare_paths(base, current)
    assert result.verdict == "regression" and result.exit_code == 1
    names = sorted(c.name for c in result.regressions)
    assert names == ["ttft AMG-ON 1000 tok t2", "ttft AMG-ON 8000 tok t2"]
    cell = result.regressions[0]
    assert cell.change is not None and 25 < cell.change < 35
    assert cell.ci_low is not None and cell.ci_low > 10  # the bootstrap CI excludes "no change"
    assert cell.p_value is not None and cell.p_value < 0.01
    text = render_markdown(result)
    assert "REGRESSION" in text and "ttft AMG-ON 8000 tok t2" in text


def test_small_significant_shift_under_threshold_passes(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1, conversations=30)
    current = make_run(tmp_path / "b", seed=2, conversations=30, shift=lambda a, c, t: 1.05)
    result = compare_paths(base, current)
    assert result.verdict == "pass"
    # significant, but +5% is inside the 10% threshold
    assert any(c.p_value is not None and c.p_value < 0.01 for c in result.comparisons if c.metric == "ttft")


def test_threshold_flag_changes_the_decision(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2, shift=lambda a, c, t: 1.3)
    assert compare_paths(base, current).verdict == "regression"
    assert compare_paths(base, current, ["ttft=50"]).verdict == "pass"
    with pytest.raises(CompareError, match="NAME one of: alpha=VALUE, ttft=VALUE"):
        compare_paths(base, current, ["latency=3"])
    with pytest.raises(CompareError, match="not a number"):
        apply_threshold_flags(GateSpec(), ["ttft=lots"])


def test_scenario_gate_section_sets_the_rules(tmp_path: Path) -> None:
    lenient = {**gate_scenario(), "gate": {"ttft_max_increase_pct": 50}}
    base = make_run(tmp_path / "a", seed=1, scenario=lenient)
    current = make_run(tmp_path / "b", seed=2, scenario=lenient, shift=lambda a, c, t: 1.3)
    result = compare_paths(base, current)
    assert result.rules.ttft_max_increase_pct == 50
    assert result.verdict == "pass"


def test_too_few_requests_is_inconclusive_not_a_failure(tmp_path: Path) -> None:
    assert min_mannwhitney_p(3, 3) == pytest.approx(0.05)
    base = make_run(tmp_path / "a", seed=1, conversations=3)
    current = make_run(tmp_path / "b", seed=2, conversations=3, shift=lambda a, c, t: 2.0)
    result = compare_paths(base, current)
    ttft = [c for c in result.comparisons if c.metric == "ttft"]
    assert all(c.status == "inconclusive" for c in ttft)
    assert result.verdict == "inconclusive" and result.exit_code == 3  # never PASS
    assert "cannot reach alpha" in ttft[0].detail and "need n ≥ 5 per cell" in ttft[0].detail


def test_error_rate_regression(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2, error_share=0.3)
    result = compare_paths(base, current)
    errors = [c for c in result.regressions if c.metric == "error_rate"]
    assert {c.arm for c in errors} == {"AMG-OFF", "AMG-ON"}
    assert "Fisher" in errors[0].detail


def test_hit_rate_regression(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2)
    # rewrite CURRENT's AMG-ON turn-2 records without cache hits
    lines = (current / "records.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        record = json.loads(line)
        if record["arm"] == "AMG-ON" and record["turn"] == 2:
            record["cached_tokens"] = 0
        out.append(json.dumps(record))
    (current / "records.jsonl").write_text("\n".join(out) + "\n")
    result = compare_paths(base, current)
    hits = [c for c in result.regressions if c.metric == "hit_rate"]
    assert [c.arm for c in hits] == ["AMG-ON"]


def test_different_scenario_or_hardware_cannot_compare(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    other_workload = gate_scenario()
    other_workload["workload"]["context_tokens"] = [1000]
    result = compare_paths(base, make_run(tmp_path / "b", seed=2, scenario=other_workload))
    assert result.verdict == "incomparable" and result.exit_code == 2
    assert any("different scenario: workload.context_tokens" in r for r in result.reasons)

    other_hw = gate_scenario()
    other_hw["engine"]["hardware"] = "h200-sxm"
    result = compare_paths(base, make_run(tmp_path / "c", seed=2, scenario=other_hw))
    assert result.exit_code == 2
    assert any(r.startswith("different hardware: hardware") for r in result.reasons)

    result = compare_paths(base, make_run(tmp_path / "d", seed=2, gpus=["NVIDIA H100 80GB HBM3"]))
    assert result.exit_code == 2 and any("GPUs" in r for r in result.reasons)
    junit = ET.fromstring(render_junit(result))
    suite = junit.find("testsuite")
    assert suite is not None and suite.get("errors") == "1"


def test_folder_of_runs_pools_repetitions(tmp_path: Path) -> None:
    make_run(tmp_path / "nights", seed=1)
    make_run(tmp_path / "nights", seed=3)
    current = make_run(tmp_path / "b", seed=2)
    result = compare_paths(tmp_path / "nights", current)
    cell = next(c for c in result.comparisons if c.metric == "ttft")
    assert cell.baseline_n == 16 and cell.current_n == 8


def test_not_a_result_set(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="no such file"):
        compare_paths(tmp_path / "missing", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="neither a run directory"):
        compare_paths(tmp_path / "empty", tmp_path / "empty")


def test_junit_xml_counts_and_cli_exit_codes(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1)
    current = make_run(tmp_path / "b", seed=2, shift=lambda a, c, t: 1.3 if a == "AMG-ON" else 1.0)
    junit = tmp_path / "out" / "gate.xml"
    summary = tmp_path / "out" / "gate.md"
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(base), str(current), "--junit", str(junit), "--markdown", str(summary)])
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    failures = suite.findall("testcase/failure")
    assert int(suite.get("failures", "0")) == len(failures) == 4
    assert int(suite.get("tests", "0")) == len(suite.findall("testcase"))
    assert summary.read_text(encoding="utf-8").startswith("## kvbench compare")

    same = runner.invoke(app, ["compare", str(base), str(make_run(tmp_path / "c", seed=5))])
    assert same.exit_code == 0, same.output
