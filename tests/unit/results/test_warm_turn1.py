"""The ``warm_turn1`` gate: a run whose prompts carry a per-run salt must start turn 1 cold.

A turn-1 cell whose ``(gpu + external hits) / prompt tokens`` passes ``validity.max_turn1_hit_rate`` makes the
run INCONCLUSIVE with the figure; at the limit it does not; a run with fixed prompts (``workload.prompt_salt:
fixed``, manifest ``prompt_salt: null``) or written before salts (manifest version 1) is not judged by it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.aggregate import aggregate, summarize_run_dir
from harness.results.validity import with_warm_turn1
from harness.results.verdict import EXIT_INCONCLUSIVE, EXIT_OK
from harness.store.events import MetricsDelta
from harness.store.rundir import RunDir
from tests.resultfiles import make_probe_run
from tests.unit.results.test_validity import DONE, metrics, records, scenario

LIMIT = 0.25


def warm(share: float, arm: str = "ON", ctx: int = 8000) -> dict[tuple[str, int, int], dict[str, float]]:
    """Turn 1 of (arm, ctx) served ``share`` of its prompt tokens from the offload tier."""
    return {(arm, ctx, 1): {"external_prefix_hits": share * 4.0 * ctx}}


def test_a_turn1_hit_share_over_the_limit_is_inconclusive_naming_the_figure() -> None:
    share = 0.6
    result = aggregate(scenario(), "r", records(), DONE, metrics(warm(share)))
    assert result.validity is not None and result.validity.verdict == "valid"
    judged = with_warm_turn1(result.validity, result.cache, LIMIT)
    assert judged.verdict == "inconclusive" and judged.exit_code == EXIT_INCONCLUSIVE
    (finding,) = judged.findings
    assert (finding.gate, finding.arm, finding.context_tokens, finding.turn) == ("warm_turn1", "ON", 8000, 1)
    assert f"ON 8000 tokens turn 1: {share:.0%} of prompt tokens were cache hits" in finding.message
    assert f"offload tier {share * 4 * 8000:.0f} of {4 * 8000}" in finding.message
    assert f"validity.max_turn1_hit_rate {LIMIT:.0%}" in finding.message


def test_gpu_hits_count_too_and_the_limit_itself_passes() -> None:
    gpu = {("OFF", 100, 1): {"gpu_prefix_hits": 0.5 * 400}}
    result = aggregate(scenario(), "r", records(), DONE, metrics({**warm(LIMIT), **gpu}))
    assert result.validity is not None
    (finding,) = with_warm_turn1(result.validity, result.cache, LIMIT).findings
    assert (finding.arm, finding.context_tokens) == ("OFF", 100)  # 50 % from the GPU cache; ON's 25 % is allowed


def test_turn_2_hits_are_not_turn_1_hits() -> None:
    result = aggregate(scenario(), "r", records(), DONE, metrics())  # ON's turn 2 loads 90 % from the tier
    assert result.validity is not None
    assert with_warm_turn1(result.validity, result.cache, LIMIT) == result.validity


PROMPT, HITS = 32000.0, 30400.0


def run_with_warm_turn1(tmp_path: Path, salt: object) -> RunDir:
    """A stored probe run whose ON arm's 8000-token turn 1 hit most of its prompt, manifest ``prompt_salt`` = salt
    (the key left out for the sentinel ``...``: a version-1 manifest)."""
    run_dir = RunDir.open(make_probe_run(tmp_path, name="warm", speedup=4.0))
    values = {
        "gpu_prefix_queries": PROMPT,
        "gpu_prefix_hits": 0.0,
        "external_prefix_hits": HITS,
        "prompt_tokens": PROMPT,
    }
    run_dir.append_metrics(
        MetricsDelta(arm="AMG-ON", attempt=0, repetition=0, context_tokens=8000, turn=1, values=values)
    )
    manifest = json.loads(run_dir.manifest_file.read_text())
    if salt is not ...:
        manifest.update(manifest_version=2, prompt_salt=salt)
    run_dir.manifest_file.write_text(json.dumps(manifest))
    return run_dir


@pytest.mark.parametrize(
    ("salt", "exit_code"),
    [("0123abcd", EXIT_INCONCLUSIVE), (None, EXIT_OK), (..., EXIT_OK)],
    ids=["salted: judged", "fixed: a warm start on purpose", "version 1: before salts"],
)
def test_only_a_salted_run_is_judged(tmp_path: Path, salt: object, exit_code: int) -> None:
    result = summarize_run_dir(run_with_warm_turn1(tmp_path, salt))
    assert result.validity is not None and result.validity.exit_code == exit_code
    if exit_code == EXIT_INCONCLUSIVE:
        assert [f.gate for f in result.validity.findings] == ["warm_turn1"]
        assert f"{HITS / PROMPT:.0%} of prompt tokens were cache hits" in result.validity.findings[0].message
