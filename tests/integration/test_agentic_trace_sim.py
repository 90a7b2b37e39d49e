"""An agentic ``kvbench sweep`` on the simulator whose sessions are the bundled Bailian sample trace's: two arms,
two agents counts. Every record is a call of its plan and no call was sent before its parent had answered. About
30 s on 2 cores."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from harness.results.agentic_result import AgenticResult
from harness.store.records import RequestRecord, read_records
from tests.scenarios import squeezed_gpu_ab
from tests.support import kvbench_scenario
from workloads.agentic import AgentSessions
from workloads.config import AgenticSessions
from workloads.trace import BUNDLED_TRACES

pytestmark = pytest.mark.integration

WORKLOAD = {
    "kind": "agentic",
    "agents": [2, 4],
    "trace": {"path": str(BUNDLED_TRACES / "sample-bailian.jsonl")},
    "tiers": [{"name": "batch", "ttft_s": 10, "min_output_tokens_per_s": 1}],
    "warmup_s": 1,
    "window_s": 4,
    "drain_timeout_s": 10,
    "warmup_requests": 1,
}
SCENARIO = squeezed_gpu_ab("it-agentic-trace", WORKLOAD, seed=3)


def test_agentic_sweep_of_trace_sessions_on_the_simulator(tmp_path: Path) -> None:
    _, run_dir = kvbench_scenario("sweep", SCENARIO, tmp_path)
    result = AgenticResult.read_file(run_dir / "agentic.json")
    assert result.complete and result.requests.errors == 0
    assert [(p.arm, p.agents) for p in result.points] == [("AMG-OFF", 2), ("AMG-OFF", 4), ("AMG-ON", 2), ("AMG-ON", 4)]
    assert all(p.point.measured > 0 and p.ceiling is not None for p in result.points)

    sessions = AgentSessions(AgenticSessions.model_validate(WORKLOAD), seed=3)
    calls = [r for r in read_records(run_dir / "records.jsonl") if r.point is not None]
    assert calls
    by_session: dict[tuple[str, int], dict[int, RequestRecord]] = defaultdict(dict)
    for record in calls:
        plan = sessions.plan(record.conversation)
        assert 1 <= record.turn <= len(plan.calls)
        assert record.expected_prompt_tokens == plan.call(record.turn - 1).prompt_tokens
        assert record.turn not in by_session[record.arm, record.conversation]  # each call sent once
        by_session[record.arm, record.conversation][record.turn] = record
    children = 0
    for (_, conversation), sent in by_session.items():
        plan = sessions.plan(conversation)
        for turn, record in sent.items():
            parent = plan.parents[turn - 1]
            if parent is None:
                continue
            before = sent[parent + 1]  # a child is only ever sent after its parent
            assert before.ok and before.e2e_ns is not None
            assert record.started_ns >= before.started_ns + before.e2e_ns
            children += 1
    # the sample's pauses are seconds: in a 5 s point a session gets a call or two past its root (forks, seconds
    # later still, are tests/unit/runs/test_agentic_driver.py's)
    assert children > 0
