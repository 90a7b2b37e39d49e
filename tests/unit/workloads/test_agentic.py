"""The agent-session synthesizer: deterministic plans, the reuse structure it promises, and its ceiling against
the trace module's independent prefix-cache simulation."""

from __future__ import annotations

import pytest
import yaml

from common.errors import KvbenchError
from harness.scenario.spec import parse_scenario
from scenarios import BUNDLED
from workloads.agentic import SESSION_STRIDE, AgentSessions, ceiling, infinite_cache_hits
from workloads.config import AgenticSessions
from workloads.trace import Trace, lru_hit_rate


def config(**fields: object) -> AgenticSessions:
    base: dict[str, object] = {"kind": "agentic", "agents": [1, 2], "subagent_probability": 0.3}
    return AgenticSessions.model_validate(base | fields)


def test_plans_are_deterministic_per_seed_and_session() -> None:
    a, b = AgentSessions(config(), seed=3), AgentSessions(config(), seed=3)
    assert a.plan(7) == b.plan(7)
    assert AgentSessions(config(), seed=4).plan(7) != a.plan(7)


def test_every_call_resends_its_branch_context_and_subagents_fork_from_it() -> None:
    sessions = AgentSessions(config(max_context_tokens=40_000), seed=1)
    forks = 0
    for s in range(40):
        plan = sessions.plan(s)
        main = plan.branches[0]
        assert main.fork_after is None and main.calls[0].blocks[: len(sessions.root)] == sessions.root
        for branch in plan.branches:
            for before, after in zip(branch.calls, branch.calls[1:], strict=False):
                assert after.blocks[: len(before.blocks)] == before.blocks and len(after.blocks) > len(before.blocks)
            if branch.fork_after is not None:
                forks += 1
                parent = main.calls[branch.fork_after].blocks
                first = branch.calls[0].blocks
                assert first[: len(parent)] == parent and len(first) > len(parent)
        assert [c.index for c in plan.calls] == list(range(len(plan.calls)))
        assert all(c.prompt_tokens <= 40_000 for c in plan.calls)
        # outside the shared root, a session's blocks are its own
        own = {b for c in plan.calls for b in c.blocks if b >= len(sessions.root)}
        assert all((s + 1) * SESSION_STRIDE <= b < (s + 2) * SESSION_STRIDE for b in own)
    assert forks > 0


def test_root_is_shared_across_sessions_and_sized_in_whole_blocks() -> None:
    sessions = AgentSessions(config(system_prompt_tokens=1000, block_tokens=64), seed=0)
    assert len(sessions.root) == 16  # ceil(1000 / 64)
    assert sessions.plan(0).calls[0].blocks[:16] == sessions.plan(1).calls[0].blocks[:16] == tuple(range(16))


@pytest.mark.parametrize("block_tokens", [16, 64, 256])
def test_ceiling_equals_an_independent_prefix_cache_simulation(block_tokens: int) -> None:
    sessions = AgentSessions(config(block_tokens=block_tokens, system_prompt_tokens=3000), seed=2)
    calls = [call for s in range(60) for call in sessions.plan(s).calls]
    requests = tuple(call.trace_request() for call in calls)
    trace = Trace(path="synth", format="kvbench", block_tokens=block_tokens, requests=requests)
    independent = lru_hit_rate(trace, None)
    assert independent is not None
    assert ceiling(calls) == pytest.approx(independent, abs=1e-12)
    assert 0.5 < independent < 1.0  # growing contexts reuse most of their prompt, never all of it


def test_ceiling_counts_only_prefixes_and_keeps_the_cache_it_is_given() -> None:
    sessions = AgentSessions(config(subagent_probability=0.0), seed=5)
    first = sessions.plan(0).calls
    seen: set[int] = set()
    hits, total = infinite_cache_hits(first[:1], seen)
    assert hits == 0 and total == first[0].prompt_tokens
    hits, _ = infinite_cache_hits(first[1:2], seen)
    assert hits == first[0].prompt_tokens  # the second call hits exactly the first call's prompt
    # a new session hits only the shared root
    other = sessions.plan(1).calls[0]
    hits, _ = infinite_cache_hits([other], seen)
    assert hits == len(sessions.root) * other.block_tokens


def test_default_tiers_are_interactive_standard_batch() -> None:
    tiers = config().tiers
    assert [(t.name, t.ttft_s, t.min_output_tokens_per_s, t.percentile) for t in tiers] == [
        ("interactive", 2.0, 30.0, 90.0),
        ("standard", 10.0, 15.0, 90.0),
        ("batch", 60.0, 5.0, 90.0),
    ]


def _bundled() -> dict[str, object]:
    data = yaml.safe_load((BUNDLED / "agentic-sim.yaml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("agents", [4, 4], "workload.agents: Value error, agents counts must be unique"),
        ("subagent_probability", 1.5, "workload.subagent_probability: Input should be less than or equal to 1"),
        ("tiers", [{"name": "a", "ttft": 1}], "allowed fields here: min_output_tokens_per_s, name, percentile, ttft_s"),
        ("tiers", [{"name": "a", "ttft_s": 1}, {"name": "a", "ttft_s": 2}], "tier names must be unique"),
        ("max_context_tokens", 100, "leaves no room after system_prompt_tokens"),
    ],
)
def test_bad_agentic_config_names_file_field_and_allowed_values(field: str, value: object, says: str) -> None:
    data = _bundled()
    workload = data["workload"]
    assert isinstance(workload, dict)
    workload[field] = value
    with pytest.raises(KvbenchError) as error:
        parse_scenario(data, "agents.yaml")
    text = str(error.value)
    assert text.startswith("agents.yaml: invalid scenario") and says in text


def test_agentic_workload_refuses_a_sweep_section() -> None:
    data = _bundled() | {"sweep": {"mode": "concurrency", "values": [1]}}
    with pytest.raises(KvbenchError, match="'sweep' applies to workload kind 'multi_user_qa' only"):
        parse_scenario(data, "agents.yaml")
