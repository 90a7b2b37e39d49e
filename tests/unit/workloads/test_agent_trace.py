"""Agent trace formats: the bundled samples load (auto-detected), their parents follow each format's rule, they
match their JSON Schemas, and bad input is one line naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.trace import Trace, TraceError, load_trace

from . import agent_samples

DOCS = Path(__file__).resolve().parents[3] / "docs"


def sample(name: str) -> Trace:
    return load_trace(agent_samples.path(name), "auto")


@pytest.mark.parametrize("name", agent_samples.SAMPLES)
def test_the_shipped_samples_are_what_the_generator_writes(name: str) -> None:
    assert agent_samples.path(name).read_text(encoding="utf-8") == agent_samples.render(name)


@pytest.mark.parametrize("name", agent_samples.SAMPLES)
def test_each_sample_is_detected_and_matches_its_schema(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    trace = sample(name)
    assert trace.format == name
    assert load_trace(agent_samples.path(name), name) == trace  # --format gives the same
    schema = json.loads((DOCS / f"trace-{name}.schema.json").read_text())
    for line in agent_samples.path(name).read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)
    # every parent is an earlier call of the trace, that arrived no later
    for index, request in enumerate(trace.requests):
        assert request.call_id is not None and request.call_type in ("normal", "subagent", "side")
        if request.parent is not None:
            assert request.parent < index
            assert trace.requests[request.parent].timestamp_ms <= request.timestamp_ms


def test_bailian_parents_sessions_and_branching() -> None:
    trace = sample("bailian")
    assert trace.block_tokens == 16 and len(trace.requests) == 40
    by_id = {r.call_id: i for i, r in enumerate(trace.requests)}
    c1 = by_id["3-c1"]
    children = [r.call_id or "" for r in trace.requests if r.parent == c1]
    assert sorted(children) == ["3-b1", "3-c2"]  # a call with two children
    assert trace.requests[by_id["3-c3"]].parent == by_id["3-c2"]
    assert {r.session for r in trace.requests if r.call_id and r.call_id.startswith("3-")} == {"3-root"}
    assert trace.requests[by_id["0-root"]].timestamp_ms == 0.0  # seconds became milliseconds
    assert trace.requests[by_id["1-root"]].timestamp_ms == 4000.0


def test_claude_code_parents_follow_the_documented_rule() -> None:
    trace = sample("claude-code")
    assert trace.block_tokens == 64
    at = {r.call_id: i for i, r in enumerate(trace.requests)}

    def parent(call: str) -> str | None:
        index = trace.requests[at[call]].parent
        return None if index is None else trace.requests[index].call_id

    # c-main: n0=#0, n1=#1, a1=#2,#4,#6, a2=#3,#5,#7, n2=#8, side=#9, n3=#10, n4=#11
    assert parent("c-main#0") is None and parent("c-main#1") == "c-main#0"
    assert parent("c-main#2") == "c-main#1" and parent("c-main#3") == "c-main#1"  # each chain starts at n1
    assert parent("c-main#4") == "c-main#2" and parent("c-main#5") == "c-main#3"  # two concurrent chains
    assert parent("c-main#8") == "c-main#1"  # normal waits for the previous normal call, not a subagent
    assert parent("c-main#9") == "c-main#8"  # a side call waits for the normal call before it
    assert parent("c-main#10") == "c-main#8"
    assert trace.requests[at["c-main#9"]].call_type == "side"
    # c-scoped: an unnamed subagent chain after its second normal call
    assert parent("c-scoped#2") == "c-scoped#1" and parent("c-scoped#3") == "c-scoped#2"
    assert parent("c-scoped#5") == "c-scoped#1" and parent("c-scoped#6") == "c-scoped#1"
    # conversation-scoped ids are the conversation's own; global ids are shared
    scoped = trace.requests[at["c-scoped#0"]].hash_ids or ()
    assert scoped[0] == "c-scoped/1"
    main, other = trace.requests[at["c-main#0"]].hash_ids, trace.requests[at["c-other#0"]].hash_ids
    assert main is not None and other is not None and main[:8] == other[:8]


def test_tokens_and_text_chain_each_session() -> None:
    tokens = sample("tokens")
    assert all(r.token_ids is not None and len(r.token_ids) == r.input_length for r in tokens.requests)
    s0 = [i for i, r in enumerate(tokens.requests) if r.session == "s0"]
    assert [tokens.requests[i].parent for i in s0] == [None, *s0[:-1]]
    assert tokens.requests[1].timestamp_ms == 700.0  # ns became ms
    text = sample("text")
    assert any(r.messages for r in text.requests) and any(r.text for r in text.requests)
    t1 = [r for r in text.requests if r.session == "t1"]
    assert t1[0].messages is not None and t1[0].messages[0][0] == "system"


def test_a_window_drops_parents_before_it() -> None:
    trace = sample("bailian")
    window = trace.window(10, 20)
    for index, request in enumerate(window.requests):
        original = trace.requests[10 + index]
        if original.parent is None or original.parent < 10:
            assert request.parent is None
        else:
            assert request.parent == original.parent - 10


def test_a_parent_before_the_trace_start_makes_a_root(tmp_path: Path) -> None:
    path = write(tmp_path, [{**BAILIAN, "parent_chat_id": 99}, {**BAILIAN, "chat_id": 2, "parent_chat_id": 1}])
    trace = load_trace(path, "auto")
    assert [r.parent for r in trace.requests] == [None, 0]
    assert trace.requests[1].session == "1"


def write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


BAILIAN = {
    "chat_id": 1,
    "parent_chat_id": -1,
    "timestamp": 1.0,
    "input_length": 20,
    "output_length": 3,
    "type": "text",
    "turn": 1,
    "hash_ids": [1, 2],
}
CALL = {"t": 0, "in": 64, "out": 5, "hash_ids": [1], "type": "normal"}
CONVERSATION = {"id": "c", "block_size": 64, "hash_id_scope": "global", "requests": [CALL]}
TOKENS = {"session_id": "s", "turn_idx": 0, "input_toks": 2, "output_toks": 1}
TOKENS = {**TOKENS, "arrival_time_ns": 0, "token_ids": [5, 6]}


@pytest.mark.parametrize(
    ("rows", "fmt", "expected"),
    [
        ([{**BAILIAN, "hash_ids": [1]}], "bailian", ":1: field 'hash_ids': 1 ids of 16 tokens do not cover 20"),
        (
            [{**BAILIAN, "parent_chat_id": 7}, {**BAILIAN, "chat_id": 7, "parent_chat_id": -1, "timestamp": 2.0}],
            "bailian",
            ":1: field 'parent_chat_id': '1' waits for 7, which is not an earlier call",
        ),
        ([BAILIAN, BAILIAN], "bailian", ":2: field 'chat_id': '1' appears twice"),
        ([{**BAILIAN, "timestamp": "x"}], "bailian", ":1: field 'timestamp': must be a finite number"),
        (
            [{**CONVERSATION, "requests": [{**CALL, "type": "tool"}]}],
            "claude-code",
            ":1: field 'requests[0].type': 'tool'; allowed: normal, subagent, side",
        ),
        (
            [CONVERSATION, {**CONVERSATION, "id": "d", "block_size": 16}],
            "claude-code",
            ":2: field 'block_size': 16, but line 1 says 64",
        ),
        ([{**CONVERSATION, "hash_id_scope": "x"}], "claude-code", ":1: field 'hash_id_scope': 'x'; allowed: global"),
        ([{**CONVERSATION, "requests": [{"t": 0}]}], "claude-code", ":1: field 'requests[0].in': missing"),
        ([{**TOKENS, "input_toks": 3}], "tokens", ":1: field 'token_ids': 2 ids, but input_toks is 3"),
        ([TOKENS, TOKENS], "tokens", ":2: field 'turn_idx': 0 does not follow the session's previous turn 0"),
        (
            [{"session_id": "s", "timestamp": 0, "input": [{"role": "user"}], "output": "x"}],
            "text",
            ":1: field 'input[0]': must be a message",
        ),
        ([{"what": 1}], "auto", ":1: cannot tell the trace format from the first line's fields (what)"),
    ],
)
def test_bad_agent_traces_name_file_line_and_field(tmp_path: Path, rows: list[object], fmt: str, expected: str) -> None:
    path = write(tmp_path, rows)
    with pytest.raises(TraceError) as error:
        load_trace(path, fmt)  # type: ignore[arg-type]
    message = str(error.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message
