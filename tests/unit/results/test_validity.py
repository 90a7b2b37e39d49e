"""The validity gates (harness.results.validity) as pure functions of stored records and /metrics deltas,
and schema_version 1 compatibility: the run directories kept under docs/results still load and render.

Each gate is tripped by the smallest change to an otherwise valid run, so a test fails if its gate
does not fire (and the valid baseline fails if a gate fires where it should not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.results.agentic_result import AgenticResult
from harness.results.aggregate import aggregate
from harness.results.replay_result import ReplayResult
from harness.results.run_result import RunResult
from harness.results.sweep_result import SweepResult
from harness.results.verdict import EXIT_FAILED, EXIT_INCONCLUSIVE, outcome_of_result
from harness.runs.kinds import results_of
from harness.scenario.spec import Scenario, parse_scenario
from harness.store.events import ENGINE_RESTARTS, GroupDone, MetricsDelta
from harness.store.jsonl import read_stored_bytes
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from reports.outputs import write_outputs
from tests.kept_runs import kept_runs
from tests.resultfiles import request_record

CONTEXTS = (100, 8000)  # 100 tokens is below the cpu profile's 256-token chunk: nothing to load


def scenario(**overrides: object) -> Scenario:
    data: dict[str, object] = {
        "name": "gates",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "OFF", "offload": "off"}, {"name": "ON", "offload": "cpu"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": list(CONTEXTS), "conversations": 4},
        **overrides,
    }
    return parse_scenario(data, "test")


def record(arm: str, ctx: int, conv: int, turn: int, *, ok: bool = True, kind: str = "http_status") -> RequestRecord:
    return request_record(
        arm,
        ctx,
        conv,
        turn,
        request_id=f"{arm}-{ctx}-{conv}-{turn}",
        ttft_ns=1_000_000 if ok else None,
        e2e_ns=2_000_000 if ok else None,
        ok=ok,
        error_kind=None if ok else kind,
    )


def records(failed: dict[tuple[str, int, int, int], str] | None = None) -> list[RequestRecord]:
    failed = failed or {}
    return [
        record(
            arm, ctx, conv, turn, ok=(arm, ctx, conv, turn) not in failed, kind=failed.get((arm, ctx, conv, turn), "")
        )
        for arm in ("OFF", "ON")
        for ctx in CONTEXTS
        for conv in range(4)
        for turn in (1, 2)
    ]


DONE = [GroupDone(arm=arm, repetition=0, context_tokens=ctx, attempt=0) for arm in ("OFF", "ON") for ctx in CONTEXTS]


def metrics(overrides: dict[tuple[str, int, int], dict[str, float]] | None = None) -> list[MetricsDelta]:
    """Counters of a valid run: turn 2 of ON loads 90 % from the tier (none below a chunk), OFF hits nothing."""
    out = []
    for arm in ("OFF", "ON"):
        for ctx in CONTEXTS:
            for turn in (1, 2):
                prompt = 4.0 * ctx
                external = 0.9 * prompt if (arm, turn) == ("ON", 2) and ctx >= 256 else 0.0
                values = {
                    "prompt_tokens": prompt, "gpu_prefix_queries": prompt, "gpu_prefix_hits": 0.0,
                    "external_prefix_queries": prompt, "external_prefix_hits": external, ENGINE_RESTARTS: 0.0,
                }  # fmt: skip
                values.update((overrides or {}).get((arm, ctx, turn), {}))
                out.append(MetricsDelta(arm=arm, attempt=0, repetition=0, context_tokens=ctx, turn=turn, values=values))
    return out


def gates(result: RunResult) -> set[str]:
    assert result.validity is not None
    return {finding.gate for finding in result.validity.findings}


def test_a_clean_run_is_valid() -> None:
    result = aggregate(scenario(), "r", records(), DONE, metrics())
    assert result.validity is not None and result.validity.verdict == "valid", result.validity
    assert outcome_of_result(result).exit_code == 0


def test_every_request_failed_is_failed_with_errors_by_kind() -> None:
    everything = {(a, c, n, t): ("timeout" if n % 2 else "http_status") for a in ("OFF", "ON") for c in CONTEXTS
                  for n in range(4) for t in (1, 2)}  # fmt: skip
    result = aggregate(scenario(), "r", records(everything), DONE, metrics())
    assert result.validity is not None and result.validity.verdict == "failed"
    assert "no_success" in gates(result)
    half = len(everything) // 2
    assert f"all {len(everything)} measured requests failed (by kind: http_status {half}, timeout {half})" in (
        result.validity.findings[0].message
    )
    outcome = outcome_of_result(result)
    assert (outcome.status, outcome.exit_code) == ("failed", EXIT_FAILED)


def test_error_rate_threshold_is_the_scenarios() -> None:
    failed = {("ON", 8000, 0, 2): "timeout", ("ON", 8000, 1, 2): "timeout"}  # 2 of 32 = 6.25 %
    strict = aggregate(scenario(), "r", records(failed), DONE, metrics())
    assert gates(strict) == {"error_rate"}
    assert "2 of 32 measured requests failed (6.2% > validity.max_error_rate 5.0%)" in (
        strict.validity.findings[0].message if strict.validity else ""
    )
    lenient = aggregate(scenario(validity={"max_error_rate": 0.1}), "r", records(failed), DONE, metrics())
    assert lenient.validity is not None and lenient.validity.verdict == "valid"


def test_off_arm_turn2_served_from_the_gpu_cache_means_the_reset_did_not_happen() -> None:
    hot = {("OFF", 8000, 2): {"gpu_prefix_hits": 0.9 * 4 * 8000}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(hot))
    assert gates(result) == {"reset_missed"}
    assert result.validity is not None and result.validity.verdict == "inconclusive"
    assert "the reset did not happen" in result.validity.findings[0].message
    assert outcome_of_result(result).exit_code == EXIT_INCONCLUSIVE


def test_off_arm_hits_with_filler_mode() -> None:
    filler = scenario(workload={"kind": "multi_round_qa", "context_tokens": list(CONTEXTS), "conversations": 4,
                                "between_turns": {"mode": "filler", "filler_tokens": 64}})  # fmt: skip
    hot = {("OFF", 8000, 2): {"gpu_prefix_hits": 0.9 * 4 * 8000}}
    assert gates(aggregate(filler, "r", records(), DONE, metrics(hot))) == {"off_arm_hits"}


@pytest.mark.parametrize(
    ("command", "fix"),
    [
        (["kvbench", "run", "--base-url", "http://h/v1"], "--offload cpu"),
        (["kvbench", "run", "--arm", "OFF=http://a/v1", "--arm", "ON=http://b/v1"], "--arm OFF:cpu=URL"),
        (["kvbench", "run", "offload.yaml"], "arms[0].offload: cpu"),
    ],
)
def test_an_undeclared_tier_is_named_with_the_flag_that_declares_it(command: list[str], fix: str) -> None:
    # the reset happened (no GPU hits); the OFF arm's turn 2 came from a tier it was not declared to have
    tier = {("OFF", 8000, 2): {"external_prefix_hits": 0.9 * 4 * 8000}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(tier), command=command)
    assert gates(result) == {"off_arm_hits"}
    assert result.validity is not None and result.validity.verdict == "inconclusive"
    (message,) = [finding.message for finding in result.validity.findings]
    assert f"declare the endpoint's tier: {fix} " in message and "offload tier" in message
    assert "did not make turn 2 a returning user" not in message  # the reset is not what went wrong


def test_on_arm_turn2_from_the_gpu_cache_after_a_reset() -> None:
    hot = {("ON", 8000, 2): {"gpu_prefix_hits": 0.8 * 4 * 8000, "external_prefix_hits": 0.1 * 4 * 8000}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(hot))
    assert gates(result) == {"reset_missed"}
    assert result.validity is not None and "not from the offload tier" in result.validity.findings[0].message


def test_on_arm_without_offload_hits_is_inconclusive_above_one_chunk_only() -> None:
    cold = {("ON", 8000, 2): {"external_prefix_hits": 0.0}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(cold))
    assert result.validity is not None
    assert [(f.gate, f.context_tokens) for f in result.validity.findings] == [("no_offload_hits", 8000)]


def test_an_engine_restart_mid_arm_is_inconclusive() -> None:
    restarted = {("ON", 8000, 1): {ENGINE_RESTARTS: 1.0}}
    result = aggregate(scenario(), "r", records(), DONE, metrics(restarted))
    assert gates(result) == {"engine_restarted"}
    assert result.validity is not None and result.validity.findings[0].arm == "ON"


def test_no_metrics_means_no_cache_verdict() -> None:
    result = aggregate(scenario(), "r", records(), DONE, [])
    assert result.validity is not None and result.validity.verdict == "valid"


# -- schema_version 1: old run directories -------------------------------------------------------


KEPT = kept_runs(lambda path: (path / "manifest.json").exists())


@pytest.mark.parametrize("kept", KEPT)
def test_kept_run_directories_load_render_and_keep_their_verdict(kept: Path, tmp_path: Path) -> None:
    copy = tmp_path / kept.name
    shutil.copytree(kept, copy)
    run_dir = RunDir.open(copy)
    files: dict[str, type[RunResult] | type[SweepResult] | type[ReplayResult] | type[AgenticResult]] = {
        "probe": RunResult,
        "sweep": SweepResult,
        "replay": ReplayResult,
        "agentic": AgenticResult,
    }
    result_file = files.get(run_dir.kind)
    if result_file is None:
        pytest.skip(f"{kept.name} is a {run_dir.kind} run")
    stored = json.loads(read_stored_bytes(copy / result_file.FILE_NAME) or b"")
    if "validity" in stored:
        # written with the gates (e.g. the 70B runs, one of them INCONCLUSIVE on purpose): the stored
        # verdict renders and comes back unchanged from the stored records
        judged = result_file.read_file(copy)
        assert write_outputs(run_dir), "the stored file renders as it is"
        assert outcome_of_result(results_of(run_dir).result) == outcome_of_result(judged)
        return
    old = result_file.read_file(copy)
    assert old.validity is None and outcome_of_result(old).status == "completed"
    assert write_outputs(run_dir), "the old file renders as it is"
    rebuilt = results_of(run_dir).result
    assert outcome_of_result(rebuilt).status == "completed", outcome_of_result(rebuilt).reasons
