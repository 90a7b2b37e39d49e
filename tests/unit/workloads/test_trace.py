"""Trace files: both formats load, every bad input names file, line and field; the ceiling and LRU hit
rates match what the trace's known structure implies; prompts keep that structure in the engine's tokens."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.sim.tokenizer import SimTokenizer
from workloads.config import MultiUserQA
from workloads.trace import TraceError, TracePrompts, load_trace, lru_hit_rate, trace_stats
from workloads.trace_synth import SynthSpec, synthesize

B = 512


def write(path: Path, rows: Sequence[object], *, end: str = "\n") -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + end, encoding="utf-8")
    return path


def conversations(
    groups: int, turns: int, system_blocks: int, context_blocks: int, turn_blocks: int
) -> list[dict[str, object]]:
    """Round-robin conversations: a shared system prefix, a private context, each turn appending whole blocks."""
    rows: list[dict[str, object]] = []
    next_id = system_blocks
    history: dict[int, list[int]] = {}
    for turn in range(turns):
        for group in range(groups):
            ids = history.get(group) or list(range(system_blocks))
            grow = context_blocks if turn == 0 else turn_blocks
            ids = ids + list(range(next_id, next_id + grow))
            next_id += grow
            history[group] = ids
            rows.append(
                {"timestamp": len(rows) * 100, "input_length": len(ids) * B, "output_length": 8, "hash_ids": ids}
            )
    return rows


def test_a_mooncake_trace_loads_in_order_with_line_numbers(tmp_path: Path) -> None:
    rows = conversations(groups=2, turns=2, system_blocks=1, context_blocks=2, turn_blocks=1)
    rows[-1] = {**rows[-1], "input_length": rows[-1]["input_length"] - 100}  # type: ignore[operator]  # partial last block
    trace = load_trace(write(tmp_path / "t.jsonl", ["", *rows]), "mooncake")
    assert [r.line for r in trace.requests] == [2, 3, 4, 5]
    assert trace.block_tokens == B and trace.duration_s == 0.3
    assert trace.requests[-1].block_sizes(B) == [B, B, B, B - 100]


@pytest.mark.parametrize(
    ("rows", "end", "expected"),
    [
        ([{"timestamp": 0, "output_length": 1, "hash_ids": [1]}], "\n", "t.jsonl:1: missing field 'input_length'"),
        (
            [{"timestamp": 0, "input_length": "9", "output_length": 1, "hash_ids": [1]}],
            "\n",
            "t.jsonl:1: field 'input_length': must be an integer >= 1",
        ),
        (
            [
                {"timestamp": 5, "input_length": 9, "output_length": 1, "hash_ids": [1]},
                {"timestamp": 4, "input_length": 9, "output_length": 1, "hash_ids": [2]},
            ],
            "\n",
            "t.jsonl:2: field 'timestamp': 4 is earlier than line 1's 5",
        ),
        (
            [{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}],
            "\n",
            "t.jsonl:1: field 'hash_ids': 2 ids of 512 tokens do not cover input_length 1100 (needs ceil(1100/512) = 3",
        ),
        (
            [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}, '{"timestamp": 1, "input_'],
            "",
            "t.jsonl:2: truncated last line",
        ),
        (
            ['{"timestamp": 1,, }', {"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}],
            "\n",
            "t.jsonl:1: not valid JSON",
        ),
        ([[1, 2]], "\n", "t.jsonl:1: expected a JSON object, got list"),
    ],
)
def test_bad_mooncake_input_names_file_line_and_field(
    tmp_path: Path, rows: list[object], end: str, expected: str
) -> None:
    with pytest.raises(TraceError) as info:
        load_trace(write(tmp_path / "t.jsonl", rows, end=end), "mooncake")
    assert expected in str(info.value)


def test_non_utf8_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}).encode()
    path.write_bytes(good + b'\n{"timestamp": 1, "x": "\xff"}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: not UTF-8 \(byte 0xff at column 24\)"):
        load_trace(path, "mooncake")


def test_kvbench_format_header_sessions_and_text(tmp_path: Path) -> None:
    rows: list[object] = [
        {"kvbench_trace": 1, "block_tokens": 64},
        {"timestamp": 0, "session": "a", "turn": 1, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 10.5, "session": 7, "turn": 1, "input_length": 3, "output_length": 5, "text": "hi there"},
    ]
    trace = load_trace(write(tmp_path / "k.jsonl", rows), "kvbench")
    assert trace.block_tokens == 64
    assert [(r.session, r.turn, r.text) for r in trace.requests] == [("a", 1, None), ("7", 1, "hi there")]
    assert trace_stats(trace).sessions == 2
    with pytest.raises(TraceError, match="header says 64, the replay asks for 512"):
        load_trace(tmp_path / "k.jsonl", "kvbench", block_tokens=512)
    bad = [{"timestamp": 0, "session": "a", "turn": 1, "input_length": 3, "output_length": 5, "text": "x",
            "hash_ids": [1]}]  # fmt: skip
    with pytest.raises(TraceError, match=r"b.jsonl:1: give exactly one of the fields 'hash_ids' and 'text'"):
        load_trace(write(tmp_path / "b.jsonl", bad), "kvbench")
    with pytest.raises(TraceError, match=r"c.jsonl:1: missing field 'session'"):
        load_trace(write(tmp_path / "c.jsonl", [{"timestamp": 0, "input_length": 3, "output_length": 1,
                                                 "text": "x"}]), "kvbench")  # fmt: skip
    with pytest.raises(TraceError, match=r"d.jsonl:1: field 'speaker': unknown field"):
        load_trace(write(tmp_path / "d.jsonl", [{**bad[0], "speaker": 1}]), "kvbench")


def test_the_infinite_cache_ceiling_is_what_the_structure_implies(tmp_path: Path) -> None:
    groups, turns, system, context, grow = 5, 4, 2, 6, 3
    trace = load_trace(write(tmp_path / "t.jsonl", conversations(groups, turns, system, context, grow)), "mooncake")
    # turn 0: the first request hits nothing, the others the shared system prompt; turn t > 0 hits its whole
    # previous prompt (system + context + (t - 1) growths)
    hits = (groups - 1) * system
    total = groups * (system + context)
    for turn in range(1, turns):
        previous = system + context + (turn - 1) * grow
        hits += groups * previous
        total += groups * (previous + grow)
    stats = trace_stats(trace, [10**9, 1])
    assert stats.infinite_cache_hit_rate == pytest.approx(hits / total)
    assert stats.lru_hit_rates[0][1] == pytest.approx(hits / total)
    # one token of cache holds nothing a later request can use
    assert stats.lru_hit_rates[1][1] == 0.0
    # a cache smaller than the round-robin working set of the other conversations keeps only the system prompt
    # blocks warm (every request touches them), the turn history is evicted before it returns
    working_set = (groups - 1) * (context + (turns - 1) * grow) * B
    small = lru_hit_rate(trace, working_set // 2)
    assert small == pytest.approx((groups * turns - 1) * system / total)


async def test_prompts_keep_the_block_structure_in_engine_tokens(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 3 * B, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 1, "input_length": 3 * B - 17, "output_length": 1, "hash_ids": [0, 1, 3]},
        {"timestamp": 2, "input_length": 2 * B, "output_length": 1, "hash_ids": [0, 4]},
    ]
    trace = load_trace(write(tmp_path / "t.jsonl", rows), "mooncake")
    tokenizer = SimTokenizer()
    prompts = TracePrompts(tokenizer, seed=1, block_tokens=B)
    ids = [await tokenizer.encode(await prompts.prompt(r)) for r in trace.requests]
    assert [len(t) for t in ids] == [r.input_length for r in trace.requests]
    assert ids[0][: 2 * B] == ids[1][: 2 * B] and ids[0][2 * B : 2 * B + 16] != ids[1][2 * B : 2 * B + 16]
    assert ids[0][:B] == ids[2][:B] and ids[0][B : B + 16] != ids[2][B : B + 16]
    again = TracePrompts(SimTokenizer(), seed=1, block_tokens=B)
    assert await again.prompt(trace.requests[1]) == await prompts.prompt(trace.requests[1])
    other_seed = TracePrompts(tokenizer, seed=2, block_tokens=B)
    assert await other_seed.prompt(trace.requests[0]) != await prompts.prompt(trace.requests[0])


def test_synth_writes_a_trace_whose_blocks_follow_the_token_streams(tmp_path: Path) -> None:
    config = MultiUserQA.model_validate({
        "kind": "multi_user_qa", "users": 3, "rounds": {"dist": "uniform", "low": 2, "high": 4},
        "system_prompt_tokens": 128, "context_tokens": {"dist": "uniform", "low": 300, "high": 900},
        "question_tokens": 20, "answer_tokens": 30, "think_time_s": 1.0,
    })  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(synthesize(config, SynthSpec(sessions=6, session_rate=2.0, block_tokens=64), seed=5))
                    + "\n")  # fmt: skip
    trace = load_trace(path, "kvbench")
    assert trace.block_tokens == 64
    by_session: dict[str, list[tuple[int, tuple[object, ...], int]]] = {}
    for r in trace.requests:
        assert r.hash_ids is not None and r.turn is not None and r.session is not None
        by_session.setdefault(r.session, []).append((r.turn, r.hash_ids, r.input_length))
    assert len(by_session) == 6
    first_blocks = set()
    for rounds in by_session.values():
        rounds.sort()
        assert [turn for turn, _, _ in rounds] == list(range(1, len(rounds) + 1))
        first_blocks.add(rounds[0][1][:2])  # the 128-token system prompt is two whole blocks
        for (_, before, length), (_, after, _) in itertools.pairwise(rounds):
            whole = length // 64  # the next round extends this prompt: its whole blocks are shared
            assert after[:whole] == before[:whole] and after[whole] not in before
    assert len(first_blocks) == 1
    # sessions 0 and 3 are the same user (user = session % 3): they share the context's whole blocks
    zero, three = by_session["0"][0], by_session["3"][0]
    shared = 2 + (zero[2] - 128 - 20) // 64
    assert zero[1][:shared] == three[1][:shared]
    assert by_session["1"][0][1][2] != zero[1][2]
    assert trace_stats(trace).infinite_cache_hit_rate is not None


SCHEMA = Path(__file__).resolve().parents[3] / "docs" / "trace.schema.json"


def test_the_json_schema_names_the_fields_the_loader_reads(tmp_path: Path) -> None:
    from workloads import trace as module

    schema = json.loads(SCHEMA.read_text())
    request = schema["$defs"]["request"]
    assert set(request["properties"]) == module._KVBENCH_FIELDS
    assert set(request["required"]) == {"timestamp", "session", "turn", "input_length", "output_length"}
    assert schema["$defs"]["header"]["properties"]["kvbench_trace"]["const"] == module.HEADER_VERSION


def test_synth_output_and_bad_lines_against_the_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    config = MultiUserQA.model_validate(
        {"kind": "multi_user_qa", "users": 2, "rounds": 2, "context_tokens": 200, "question_tokens": 10}
    )
    lines = list(synthesize(config, SynthSpec(sessions=2, session_rate=1.0, block_tokens=64), seed=1))
    for line in lines:
        jsonschema.validate(json.loads(line), schema)
    bad = {**json.loads(lines[1]), "text": "both"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
