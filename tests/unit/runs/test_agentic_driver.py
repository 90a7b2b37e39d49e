"""The agentic driver on a fake engine: a trace session runs as its causal tree (a child at its parent's send plus
the trace's gap, or at the parent's answer if later; siblings together), a failed call stops its subtree, and the
session ends when every call is done."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import cast

from harness.client.openai import RequestOutcome
from harness.runs.agentic import _AgentDriver
from harness.runs.load import RecordContext
from harness.runs.spine import ArmSession
from harness.store.records import RequestRecord
from workloads.agentic import AgentSessions
from workloads.config import AgenticSessions
from workloads.trace import TracePrompts, TraceRequest

SERVICE_S = 0.2
# (chat_id, parent, timestamp s, hash ids): a0 -> a1 -> {a2, a3}, a3 -> {a4, a5}; a2 fails, so its child a6 is
# never sent
CALLS: list[tuple[str, str | int, float, list[int]]] = [
    ("a0", -1, 0.0, [1, 10]),
    ("a1", "a0", 0.30, [1, 10, 11]),  # a gap longer than an answer: due 0.30 s after a0's send
    ("a2", "a1", 0.31, [1, 10, 11, 12]),
    ("a3", "a1", 0.34, [1, 10, 11, 13]),
    ("a4", "a3", 0.35, [1, 10, 11, 13, 14]),
    ("a5", "a3", 0.35, [1, 10, 11, 13, 15]),
    ("a6", "a2", 0.40, [1, 10, 11, 12, 16]),
]
FAILING = 3  # a2's turn


class FakePrompts:
    async def prompt(self, request: TraceRequest) -> str:
        return str(request.line)  # the call's index + 1


class FakeEngine:
    def __init__(self) -> None:
        self.sent: list[int] = []

    async def send(self, prompt: str, max_tokens: int, *, api: str, ignore_eos: bool, key: str) -> RequestOutcome:
        started = time.monotonic_ns()
        self.sent.append(int(prompt))
        await asyncio.sleep(SERVICE_S)
        failed = int(prompt) == FAILING
        return RequestOutcome(
            started_ns=started,
            ttft_ns=1,
            e2e_ns=time.monotonic_ns() - started,
            error_kind="server_error" if failed else None,
            http_status=500 if failed else 200,
        )


def test_a_trace_session_runs_as_its_causal_tree(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"chat_id": c, "parent_chat_id": p, "timestamp": t, "input_length": 16 * len(ids),
                        "output_length": 2, "type": "text", "turn": 1, "hash_ids": ids}) + "\n"
            for c, p, t, ids in CALLS
        )
    )  # fmt: skip
    config = AgenticSessions.model_validate(
        {"kind": "agentic", "agents": [1], "trace": {"path": str(path)}, "warmup_s": 0, "window_s": 2.0}
    )
    sessions = AgentSessions(config, seed=0)
    plan = sessions.plan(0)
    records: list[RequestRecord] = []
    engine = FakeEngine()
    driver = _AgentDriver(
        arm_session=cast(ArmSession, engine),
        sessions=sessions,
        prompts=cast(TracePrompts, FakePrompts()),
        config=config,
        agents=1,
        first_session=0,
        context=RecordContext(arm="A", attempt=1, point=0),
        on_record=records.append,
    )
    asyncio.run(driver.run(lambda _: None))

    first = {r.turn: r for r in records if r.conversation == 0}
    assert sorted(first) == [1, 2, 3, 4, 5, 6]  # a6, below the failed a2, never sent
    assert first[FAILING].error_kind is not None
    for turn, record in first.items():
        parent = plan.parents[turn - 1]
        if parent is None:
            continue
        before = first[parent + 1]
        assert before.e2e_ns is not None
        answered = before.started_ns + before.e2e_ns
        due = max(answered, before.started_ns + int(plan.call(turn - 1).pause_s * 1e9))
        # the event loop may add a little, never take any away
        assert record.started_ns >= due - 1_000_000, turn
    # the gap counts from the parent's send, not on top of its answer (that would be 0.30 + 0.2 s)
    assert first[2].started_ns - first[1].started_ns < 0.45e9
    # siblings run together: a4 and a5 (both due at a3's answer) are in flight at once
    a4, a5 = first[5], first[6]
    assert a4.e2e_ns is not None and a5.e2e_ns is not None
    assert max(a4.started_ns, a5.started_ns) < min(a4.started_ns + a4.e2e_ns, a5.started_ns + a5.e2e_ns)
    # the next session starts only once every call of this one is done
    later = [r for r in records if r.conversation == 1]
    assert later and min(r.started_ns for r in later) >= max(r.started_ns + (r.e2e_ns or 0) for r in first.values())
