"""Agent sessions drawn from an agent trace: the causal tree, pauses, answers, the per-cycle remapping of private
blocks (against a ceiling computed by hand), max_context_tokens, the synthesized plans' tree, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from common.errors import KvbenchError
from workloads.agentic import SESSION_STRIDE, AgentSessions, infinite_cache_hits
from workloads.config import AgenticSessions
from workloads.trace import BUNDLED_TRACES

B = 16  # bailian's block size

# (chat_id, parent, timestamp s, output_length, hash ids). Session A forks twice after a1 (a2, a3), a3 forks again
# (a4, a5: a nested fork) and a2's child a6 is compacted (shorter than a2). Blocks 1, 2 are every session's, 40 is
# B's and C's; the others are private.
CALLS: list[tuple[str, str | int, float, int, list[int]]] = [
    ("a0", -1, 0.0, 5, [1, 2, 10]),
    ("b0", -1, 1.0, 6, [1, 2, 20]),
    ("b1", "b0", 1.5, 0, [1, 2, 20, 40]),
    ("a1", "a0", 2.0, 7, [1, 2, 10, 11]),
    ("a2", "a1", 3.0, 8, [1, 2, 10, 11, 12]),
    ("a3", "a1", 3.5, 9, [1, 2, 10, 11, 13]),
    ("a4", "a3", 4.0, 10, [1, 2, 10, 11, 13, 14]),
    ("a5", "a3", 4.5, 11, [1, 2, 10, 11, 13, 15]),
    ("a6", "a2", 4.8, 12, [1, 2, 50]),
    ("c0", -1, 5.0, 13, [1, 2, 40]),
]


def write_trace(path: Path) -> Path:
    lines = [
        {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": t,
            "input_length": B * len(ids),
            "output_length": out,
            "type": "text",
            "turn": 1,
            "hash_ids": ids,
        }
        for chat, parent, t, out, ids in CALLS
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def sessions_of(path: Path, **fields: object) -> AgentSessions:
    base: dict[str, object] = {"kind": "agentic", "agents": [1], "trace": {"path": str(path)}}
    return AgentSessions(AgenticSessions.model_validate(base | fields), seed=0)


def test_a_trace_session_is_a_tree_with_the_trace_pauses_answers_and_blocks(tmp_path: Path) -> None:
    sessions = sessions_of(write_trace(tmp_path / "t.jsonl"))
    assert sessions.block_tokens == B and sessions.root == ()
    a = sessions.plan(0)
    assert [c.index for c in a.calls] == list(range(7))
    assert a.parents == (None, 0, 1, 1, 3, 3, 2)
    assert a.roots == (0,) and a.children(1) == (2, 3) and a.children(3) == (4, 5) and a.children(2) == (6,)
    assert [c.pause_s for c in a.calls] == pytest.approx([0.0, 2.0, 1.0, 1.5, 0.5, 1.0, 1.8])
    assert [c.output_tokens for c in a.calls] == [5, 7, 8, 9, 10, 11, 12]
    # the n-th distinct id (first appearance, session by session): shared ones as they are, private ones per cycle
    private = SESSION_STRIDE
    assert a.call(0).blocks == (0, 1, private + 2)
    assert a.call(6).blocks == (0, 1, private + 8)
    assert all(c.block_tokens == B and c.prompt_tokens == B * len(c.blocks) for c in a.calls)
    # a call's first child continues its branch, every other one forks
    assert [(b.fork_after, [c.index for c in b.calls]) for b in a.branches] == [
        (None, [0, 1, 2, 6]),
        (1, [3, 4]),
        (3, [5]),
    ]
    b, c = sessions.plan(1), sessions.plan(2)
    assert b.parents == (None, 0) and [x.output_tokens for x in b.calls] == [6, 1]  # output_length 0 -> 1
    assert b.calls[1].blocks == (0, 1, private + 9, 10) and c.calls[0].blocks == (0, 1, 10)
    assert b.calls[1].pause_s == pytest.approx(0.5)


def test_later_cycles_replay_the_same_tree_with_fresh_private_blocks(tmp_path: Path) -> None:
    sessions = sessions_of(write_trace(tmp_path / "t.jsonl"))
    first, again = sessions.plan(0), sessions.plan(3)
    assert again.parents == first.parents and again.session == 3
    assert [c.pause_s for c in again.calls] == [c.pause_s for c in first.calls]
    assert again.call(0).blocks == (0, 1, 2 * SESSION_STRIDE + 2)
    assert sessions.plan(5).calls[0].blocks == sessions.plan(2).calls[0].blocks == (0, 1, 10)  # all shared


def test_ceiling_of_two_cycles_equals_the_hand_count(tmp_path: Path) -> None:
    sessions = sessions_of(write_trace(tmp_path / "t.jsonl"))
    calls = [call for s in range(6) for call in sessions.plan(s).calls]
    # cycle 0: A hits 0+3+4+4+5+5+2 of 32 blocks, B 2+3 of 7, C 3 of 3 (1, 2 and B's 40);
    # cycle 1: private blocks are new again, so only 1, 2 of a0 hit: A 2+3+4+4+5+5+2 of 32, B 2+4 of 7 (b1's
    # 40 is shared: all four blocks hit), C 3 of 3
    assert infinite_cache_hits(calls) == (B * (23 + 5 + 3 + 25 + 6 + 3), B * (32 + 7 + 3 + 32 + 7 + 3))


def test_max_context_drops_a_call_and_its_subtree(tmp_path: Path) -> None:
    sessions = sessions_of(write_trace(tmp_path / "t.jsonl"), max_context_tokens=4 * B)
    a = sessions.plan(0)
    # a2, a3 (5 blocks) go, and with them a4, a5 and a6 (3 blocks, but a2's child)
    assert a.parents == (None, 0) and [len(c.blocks) for c in a.calls] == [3, 4]


def test_the_bundled_samples_become_plans(tmp_path: Path) -> None:
    for name, count in (("sample-bailian.jsonl", 8), ("sample-claude-code.jsonl", 3)):
        sessions = sessions_of(Path(name))  # a bare name: the bundled sample
        assert sessions.trace is not None and len(sessions.trace.sessions) == count
        for s in range(2 * count):
            plan = sessions.plan(s)
            assert plan.roots == (0,) and all(p is None or p < i for i, p in enumerate(plan.parents))
            assert all(c.pause_s >= 0 and c.output_tokens >= 1 for c in plan.calls)


def test_synthesized_plans_are_the_same_tree() -> None:
    config = AgenticSessions.model_validate({"kind": "agentic", "agents": [1], "subagent_probability": 0.5})
    sessions, forks = AgentSessions(config, seed=9), 0
    for s in range(20):
        plan = sessions.plan(s)
        main = plan.branches[0]
        assert plan.roots == (0,)
        for call in main.calls:
            subagents = tuple(b.calls[0].index for b in plan.forks_after(call.step))
            following = (call.index + 1,) if call.step + 1 < len(main.calls) else ()
            assert plan.children(call.index) == following + subagents
            forks += len(subagents)
        for branch in plan.branches[1:]:
            assert plan.parents[branch.calls[0].index] == branch.fork_after
            for before, after in zip(branch.calls, branch.calls[1:], strict=False):
                assert plan.parents[after.index] == before.index and plan.children(before.index) == (after.index,)
    assert forks > 0


@pytest.mark.parametrize("name", ["sample-tokens.jsonl", "sample-text.jsonl"])
def test_a_trace_without_hash_blocks_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(KvbenchError) as caught:
        sessions_of(Path(name))
    message = str(caught.value)
    assert "\n" not in message and name in message and "mooncake, kvbench, bailian, claude-code" in message
    assert str(BUNDLED_TRACES / name) in message


def test_a_kvbench_trace_with_text_lines_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.jsonl"
    path.write_text(
        json.dumps({"timestamp": 0, "session": 1, "turn": 1, "input_length": 16, "output_length": 4, "hash_ids": [1]})
        + "\n"
        + json.dumps({"timestamp": 1, "session": 1, "turn": 2, "input_length": 5, "output_length": 4, "text": "hi"})
        + "\n"
    )
    with pytest.raises(KvbenchError, match=r"k\.jsonl:2: a call without hash_ids"):
        sessions_of(path, trace={"path": str(path), "format": "kvbench"})


def test_a_kvbench_trace_chains_each_session_and_a_mooncake_request_is_a_session(tmp_path: Path) -> None:
    path = tmp_path / "k.jsonl"
    rows = [(0, "x", [1, 2]), (500, "y", [1, 3]), (1500, "x", [1, 2, 4]), (4000, "x", [1, 2, 4, 5])]
    path.write_text(
        json.dumps({"kvbench_trace": 1, "block_tokens": 16})
        + "\n"
        + "".join(
            json.dumps({"timestamp": t, "session": s, "turn": 1, "input_length": 16 * len(ids), "output_length": 2,
                        "hash_ids": ids})
            + "\n"
            for t, s, ids in rows
        )
    )  # fmt: skip
    sessions = sessions_of(path, trace={"path": str(path), "format": "kvbench"})
    x = sessions.plan(0)
    assert x.parents == (None, 0, 1) and [c.pause_s for c in x.calls] == pytest.approx([0.0, 1.5, 2.5])
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": 1024, "output_length": 3, "hash_ids": [1, t + 2]}) + "\n"
                for t in (0, 1, 2))
    )  # fmt: skip
    one = sessions_of(mooncake, trace={"path": str(mooncake), "format": "mooncake"})
    assert one.trace is not None and len(one.trace.sessions) == 3 and one.block_tokens == 512
    assert [len(one.plan(s).calls) for s in range(3)] == [1, 1, 1]


def test_trace_and_synthesis_fields_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="synthesis fields calls, block_tokens would not be used"):
        AgenticSessions.model_validate(
            {"kind": "agentic", "agents": [1], "trace": {"path": "x.jsonl"}, "calls": 3, "block_tokens": 32}
        )
    # max_context_tokens applies to trace sessions too, and the synthesized root need not fit it then
    AgenticSessions.model_validate({"kind": "agentic", "agents": [1], "trace": {"path": "x"}, "max_context_tokens": 64})
