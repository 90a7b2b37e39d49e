"""A cold turn 1 on every run, against a real ``kvbench sim serve`` with a CPU tier (issue 39, item 1).

* two flags-only runs in a row: each run's prompts carry its own salt, so run 2's turn 1 is as slow as run 1's
  (a full prefill), not served from the tier run 1 filled; turn 2 of the same run is tier-fast;
* a sweep's second load point: its users' round 1 finds none of the first point's contexts;
* ``--resume`` keeps the salt: an arm run by the resume on the same endpoint sends the very prompts the first
  invocation's arm sent (its turn 1 finds them all in the tier), and the run stays one run;
* a turn 1 served from a cache in a salted run (a second arm on the same endpoint) is INCONCLUSIVE naming the
  figure; ``workload.prompt_salt: fixed`` keeps prompts fixed, says so in the report and is not judged.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import SimulatorLauncher, kvbench

pytestmark = [pytest.mark.integration, pytest.mark.long]

TIER = ("--offload", "cpu")


def only_run_dir(parent: Path) -> Path:
    (run_dir,) = parent.iterdir()
    return run_dir


def summary_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def salt_of(run_dir: Path) -> str | None:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["manifest_version"] == 3
    salt: str | None = manifest["prompt_salt"]
    return salt


def median_ttft(summary: dict[str, Any], arm: str, context: int, turn: int) -> float:
    (cell,) = [c for c in summary["cells"] if (c["arm"], c["context_tokens"], c["turn"]) == (arm, context, turn)]
    median: float = cell["ttft"]["median_ms"]
    return median


def turn1_hit_share(summary: dict[str, Any], arm: str) -> float:
    (stats,) = [s for s in summary["cache"] if s["arm"] == arm and s["turn"] == 1]
    share: float = ((stats["gpu_hits"] or 0) + (stats["external_hits"] or 0)) / stats["prompt_tokens"]
    return share


def probe(base_url: str, out: Path) -> Path:
    """A flags-only run of one CPU-tier arm on the simulator; it must be VALID (exit 0)."""
    done = kvbench(
        *("run", "--arm", f"ON:cpu={base_url}/v1", "--contexts", "32000"),
        *("--conversations", "1", "--answer-tokens", "4", "-o", str(out)),
        cwd=out.parent,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return only_run_dir(out)


def test_two_runs_in_a_row_read_the_same_cold_turn_1(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    with simulator(*TIER) as base_url:
        first = probe(base_url, tmp_path / "first")
        second = probe(base_url, tmp_path / "second")
    one, two = summary_of(first), summary_of(second)
    assert one["validity"]["verdict"] == two["validity"]["verdict"] == "valid", two["validity"]
    assert salt_of(first) and salt_of(second) and salt_of(first) != salt_of(second)
    t1_first, t1_second = median_ttft(one, "ON", 32000, 1), median_ttft(two, "ON", 32000, 1)
    # the tier holds what each run's turn 1 stored: its turn 2 loads from it, its turn 1 finds none of the first run's
    (turn2,) = [s for s in two["cache"] if s["arm"] == "ON" and s["turn"] == 2]
    assert turn2["external_hits"] > 0, turn2
    assert 0.7 * t1_first < t1_second < 1.4 * t1_first, (t1_first, t1_second)
    assert turn1_hit_share(two, "ON") < 0.01  # only the chat template's block is shared


def test_a_sweeps_next_point_finds_none_of_the_previous_points_contexts(
    simulator: SimulatorLauncher, tmp_path: Path
) -> None:
    with simulator(*TIER) as base_url:
        done = kvbench(
            *("sweep", "--base-url", f"{base_url}/v1", "--concurrency", "1,4", "--contexts", "32000"),
            *("--turns", "2", "--duration", "6s", "--warmup", "1s", "--answer-tokens", "4"),
            *("-o", str(tmp_path / "runs")),
            cwd=tmp_path,
        )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    assert salt_of(run_dir)
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    first_round = [r for r in records if r["point"] is not None and r["turn"] == 1 and r["ok"]]
    users_before = {r["user"] for r in first_round if r["point"] == 0}
    # the sweep has 8 users: a user's next session at the same point (session + 8) reuses that point's context, a
    # returning user; only the user's first session at point 1 tells whether point 0's context was found
    first_session_at_1: dict[int, int] = {}
    for record in records:
        if record["point"] == 1:
            user, conversation = record["user"], record["conversation"]
            first_session_at_1[user] = min(conversation, first_session_at_1.get(user, conversation))
    returning = [
        r
        for r in first_round
        if r["point"] == 1 and r["user"] in users_before and r["conversation"] == first_session_at_1[r["user"]]
    ]
    assert returning, "no user of point 0 came back at point 1: nothing was tested"
    for record in returning:
        # with the point's own contexts nothing but the chat template's first block can be cached
        assert record["cached_tokens"] <= 0.01 * record["prompt_tokens"], record
    cold = statistics.median(r["ttft_ns"] for r in first_round if r["point"] == 0)
    assert all(r["ttft_ns"] > 0.5 * cold for r in returning), ([r["ttft_ns"] for r in returning], cold)


def scenario_file(tmp_path: Path, base_url: str, **workload: object) -> Path:
    scenario = {
        "name": "cold-resume",
        "engine": {"kind": "openai", "base_url": f"{base_url}/v1", "model": "llama-3.1-8b"},
        "arms": [{"name": "A", "offload": "cpu"}, {"name": "B", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [8000],
            "conversations": 1,
            "answer_tokens": 4,
            **workload,
        },
    }
    path = tmp_path / "cold.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_resume_keeps_the_salt(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    with simulator(*TIER) as base_url:
        path = scenario_file(tmp_path, base_url)
        first = kvbench("run", str(path), "--arm", "A", "-o", str(tmp_path / "runs"), cwd=tmp_path)
        assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
        run_dir = only_run_dir(tmp_path / "runs")
        salt = salt_of(run_dir)
        resumed = kvbench("run", "--resume", str(run_dir), cwd=tmp_path)
    output = resumed.stdout + resumed.stderr
    assert "Traceback" not in output
    assert salt_of(run_dir) == salt
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [a["attempt"] for a in manifest["attempts"]] == [0, 1]
    summary = summary_of(run_dir)
    # B ran in the resume on the endpoint A filled: the same salt means the same prompts, all of them cached
    assert turn1_hit_share(summary, "A") < 0.01
    assert turn1_hit_share(summary, "B") > 0.9
    assert resumed.returncode == 3  # and a salted run judges that warm turn 1


def test_a_warm_turn_1_is_inconclusive_unless_prompts_are_fixed(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    with simulator(*TIER) as base_url:
        path = scenario_file(tmp_path, base_url)
        salted = kvbench("run", str(path), "-o", str(tmp_path / "salted"), cwd=tmp_path)
        fixed = kvbench(
            "run", str(path), "--set", "workload.prompt_salt=fixed", "-o", str(tmp_path / "fixed"), cwd=tmp_path
        )
    output = salted.stdout + salted.stderr
    assert salted.returncode == 3, output[-3000:]
    summary = summary_of(only_run_dir(tmp_path / "salted"))
    (finding,) = summary["validity"]["findings"]
    share = turn1_hit_share(summary, "B")
    assert finding["gate"] == "warm_turn1" and finding["arm"] == "B" and finding["turn"] == 1
    assert f"{share:.0%} of prompt tokens were cache hits" in finding["message"]
    assert "validity.max_turn1_hit_rate 25%" in finding["message"]
    assert f"B 8000 tokens turn 1: {share:.0%}" in output

    assert fixed.returncode == 0, (fixed.stdout + fixed.stderr)[-3000:]
    fixed_dir = only_run_dir(tmp_path / "fixed")
    assert salt_of(fixed_dir) is None
    assert turn1_hit_share(summary_of(fixed_dir), "B") > 0.9  # as warm, but a warm start is what it measures
    assert "Prompts fixed" in (fixed_dir / "report" / "ttft_table.md").read_text()
    assert "Prompts fixed" in fixed.stdout + fixed.stderr
