"""Tests for the incremental SSE parser and the OpenAI chunk interpreter (harness.client.sse)."""

from __future__ import annotations

import json
import random
from typing import Any, Literal

import pytest

from harness.client.sse import (
    FrameKind,
    SSEEvent,
    SSEParser,
    Usage,
    interpret_chunk,
    parse_sse,
)
from tests.support import GOLDEN

GOLDEN_SSE = GOLDEN / "sse"
EXPECTED: dict[str, dict[str, Any]] = {
    name: spec
    for name, spec in json.loads((GOLDEN_SSE / "expected.json").read_text(encoding="utf-8")).items()
    if not name.startswith("_")
}
ALL_STREAMS = sorted(path.name for path in GOLDEN_SSE.glob("*.sse"))


def _feed_in_pieces(payload: bytes, cuts: list[int]) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    start = 0
    for cut in [*cuts, len(payload)]:
        events += parser.feed(payload[start:cut])
        start = cut
    events += parser.finish()
    return events, parser


def _one_byte_at_a_time(payload: bytes) -> tuple[list[SSEEvent], SSEParser]:
    return _feed_in_pieces(payload, list(range(1, len(payload))))


def test_every_golden_stream_has_an_expectation() -> None:
    assert set(EXPECTED) <= set(ALL_STREAMS)
    assert "spec_features.sse" in ALL_STREAMS


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_stream_frame_kinds(name: str) -> None:
    spec = EXPECTED[name]
    payload = (GOLDEN_SSE / name).read_bytes()
    parser = SSEParser()
    events = parser.feed(payload) + parser.finish()
    frames = [interpret_chunk(event.data, spec["api"]) for event in events]
    assert [frame.kind.value for frame in frames] == spec["kinds"]
    assert "".join(frame.text for frame in frames) == spec["text"]
    assert sum(frame.carries_tokens for frame in frames) == spec["output_chunks"]
    assert parser.comments == spec["comments"]
    usages = [frame.usage for frame in frames if frame.usage is not None]
    if spec["prompt_tokens"] is None:
        assert usages == []
    else:
        assert usages[-1] == Usage(spec["prompt_tokens"], spec["completion_tokens"], spec["cached_tokens"])
    reasons = [frame.finish_reason for frame in frames if frame.finish_reason]
    assert (reasons[-1] if reasons else None) == spec["finish_reason"]


@pytest.mark.parametrize("name", ALL_STREAMS)
def test_byte_by_byte_feeding_gives_the_same_events(name: str) -> None:
    payload = (GOLDEN_SSE / name).read_bytes()
    whole = parse_sse(payload)
    assert whole, name
    split, _ = _one_byte_at_a_time(payload)
    assert split == whole


@pytest.mark.parametrize("name", ALL_STREAMS)
def test_random_splits_give_the_same_events(name: str) -> None:
    payload = (GOLDEN_SSE / name).read_bytes()
    whole = parse_sse(payload)
    rng = random.Random(name)
    for _ in range(25):
        cuts = sorted(rng.sample(range(1, len(payload)), k=min(len(payload) - 1, rng.randint(1, 40))))
        split, _ = _feed_in_pieces(payload, cuts)
        assert split == whole


def test_line_ending_variants_parse_identically() -> None:
    lf = parse_sse((GOLDEN_SSE / "vllm_chat.sse").read_bytes())
    assert parse_sse((GOLDEN_SSE / "vllm_chat_crlf.sse").read_bytes()) == lf
    assert parse_sse((GOLDEN_SSE / "vllm_completions_cr.sse").read_bytes()) == parse_sse(
        (GOLDEN_SSE / "vllm_completions.sse").read_bytes()
    )
    assert parse_sse((GOLDEN_SSE / "sglang_chat_mixed_eol.sse").read_bytes()) == parse_sse(
        (GOLDEN_SSE / "sglang_chat.sse").read_bytes()
    )


def test_crlf_split_between_reads_is_one_line_ending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == [SSEEvent(data="a")]  # \r\n ends the line, lone \r is the blank line
    assert parser.feed(b"\ndata: b\n\n") == [SSEEvent(data="b")]


def test_cut_inside_a_multibyte_character() -> None:
    payload = 'data: {"c":"東京 ☀️"}\n\n'.encode()
    cut = payload.index("京".encode()) + 1  # inside the 3-byte sequence
    parser = SSEParser()
    assert parser.feed(payload[:cut]) == []
    events = parser.feed(payload[cut:])
    assert events == [SSEEvent(data='{"c":"東京 ☀️"}')]


def test_spec_features() -> None:
    events, parser = _one_byte_at_a_time((GOLDEN_SSE / "spec_features.sse").read_bytes())
    assert events == [
        SSEEvent(data='{"first":\n"multi-line"}', event="chunk", id="1", retry_ms=3000),
        SSEEvent(data="", event="message", id="1"),  # a bare "data" line is an empty data field
        # "event: ignored-without-data" dispatches nothing, but its id sticks
        SSEEvent(data=" two leading spaces, one kept", id="3"),
        SSEEvent(data="[DONE]", id="3"),
    ]
    assert parser.comments == 1
    assert not parser.truncated
    assert json.loads(events[0].data) == {"first": "multi-line"}


def test_comment_only_stream_has_no_events() -> None:
    parser = SSEParser()
    assert parser.feed(b": keep-alive\n\n:\n\n: ping\r\n\r\n") == []
    assert parser.finish() == []
    assert parser.comments == 3


def test_leading_bom_is_stripped_even_when_split() -> None:
    events, _ = _feed_in_pieces(b"\xef\xbb\xbfdata: x\n\n", [1, 2])
    assert events == [SSEEvent(data="x")]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert parse_sse(b"data: \xff\xfe\n\n") == [SSEEvent(data="\ufffd\ufffd")]


def test_finish_dispatches_event_missing_only_the_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]\n") == []
    assert parser.finish() == [SSEEvent(data="[DONE]")]
    assert parser.truncated


def test_finish_discards_an_unterminated_line() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"b"') == [SSEEvent(data='{"a": 1}')]
    assert parser.finish() == []
    assert parser.truncated


def test_clean_end_is_not_truncated() -> None:
    parser = SSEParser()
    parser.feed(b"data: x\n\n")
    assert parser.finish() == []
    assert not parser.truncated


def test_id_with_nul_is_ignored_and_bad_retry_ignored() -> None:
    assert parse_sse(b"id: a\x00b\nretry: 12x\ndata: y\n\n") == [SSEEvent(data="y")]


# ---------------------------------------------------------------- chunk interpretation


def _chat(delta: object, **extra: object) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra})


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (_chat({"role": "assistant", "content": ""}), FrameKind.ROLE_ONLY),
        (_chat({"role": "assistant"}), FrameKind.ROLE_ONLY),
        (_chat({"content": "hi"}), FrameKind.CONTENT),
        (_chat({"content": ""}), FrameKind.EMPTY),
        (_chat({"content": None}), FrameKind.EMPTY),
        (_chat({}), FrameKind.EMPTY),
        (_chat({"content": None, "reasoning_content": "thinking"}), FrameKind.REASONING),
        (_chat({"reasoning": "thinking"}), FrameKind.REASONING),
        (json.dumps({"choices": [], "usage": {"prompt_tokens": 3}}), FrameKind.USAGE_ONLY),
        (json.dumps({"usage": {"prompt_tokens": 3}}), FrameKind.USAGE_ONLY),
        (json.dumps({"choices": []}), FrameKind.EMPTY),
        (json.dumps({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}), FrameKind.ERROR),
        (json.dumps({"error": "plain string"}), FrameKind.ERROR),
        (json.dumps({"object": "error", "message": "bad", "type": "BadRequestError"}), FrameKind.ERROR),
        ("[DONE]", FrameKind.DONE),
        (" [DONE] ", FrameKind.DONE),
        ("{not json", FrameKind.MALFORMED),
        ("", FrameKind.MALFORMED),
        ("[1, 2]", FrameKind.MALFORMED),
        (json.dumps({"id": "x"}), FrameKind.MALFORMED),
        (json.dumps({"choices": "nope"}), FrameKind.MALFORMED),
        (json.dumps({"choices": [3]}), FrameKind.MALFORMED),
        (_chat("not a dict"), FrameKind.MALFORMED),
        (_chat({"content": 7}), FrameKind.MALFORMED),
        (_chat({"content": "x"}, usage=[1]), FrameKind.MALFORMED),
    ],
)
def test_chat_frame_kinds(data: str, kind: FrameKind) -> None:
    assert interpret_chunk(data, "chat").kind is kind


@pytest.mark.parametrize(
    ("choice", "kind"),
    [
        ({"text": " Paris"}, FrameKind.CONTENT),
        ({"text": ""}, FrameKind.EMPTY),
        ({"text": None, "finish_reason": "stop"}, FrameKind.EMPTY),
        ({"text": 5}, FrameKind.MALFORMED),
    ],
)
def test_completion_frame_kinds(choice: dict[str, object], kind: FrameKind) -> None:
    assert interpret_chunk(json.dumps({"choices": [choice]}), "completions").kind is kind


def test_chat_delta_text_is_not_read_for_completions() -> None:
    assert interpret_chunk(_chat({"content": "hi"}), "completions").kind is FrameKind.EMPTY


def test_content_frame_fields() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 8}}
    data = json.dumps({"choices": [{"index": 0, "delta": {"content": "é"}, "finish_reason": "stop"}], "usage": usage})
    frame = interpret_chunk(data, "chat")
    assert frame.kind is FrameKind.CONTENT
    assert frame.text == "é"
    assert frame.finish_reason == "stop"
    assert frame.usage == Usage(prompt_tokens=9, completion_tokens=1, cached_tokens=8)
    assert frame.carries_tokens


def test_reasoning_is_kept_out_of_text() -> None:
    frame = interpret_chunk(_chat({"reasoning_content": "hmm"}), "chat")
    assert frame.text == ""
    assert frame.reasoning == "hmm"
    assert frame.carries_tokens


def test_usage_fields_of_wrong_type_are_none() -> None:
    data = json.dumps({"choices": [], "usage": {"prompt_tokens": "9", "completion_tokens": True}})
    assert interpret_chunk(data, "chat").usage == Usage()


def test_error_message_is_extracted() -> None:
    frame = interpret_chunk(json.dumps({"error": {"message": "out of KV blocks", "type": "Internal"}}), "chat")
    assert frame.error == "Internal: out of KV blocks"
    assert not frame.carries_tokens


def test_deeply_nested_json_is_malformed_not_raised() -> None:
    assert interpret_chunk("[" * 100_000 + "]" * 100_000, "chat").kind is FrameKind.MALFORMED


@pytest.mark.parametrize(
    ("data", "api", "empty_token"),
    [
        (_chat({"content": ""}), "chat", True),  # a token that decoded to no text (yet)
        (_chat({"role": "assistant", "content": ""}), "chat", False),  # the role chunk is no token
        (_chat({}), "chat", False),  # a finish chunk without content
        (_chat({"content": None}), "chat", False),
        (_chat({"content": "x"}), "chat", False),  # a text chunk: carries_tokens, not empty_token
        (json.dumps({"choices": [{"index": 0, "text": ""}]}), "completions", True),
        (json.dumps({"choices": [{"index": 0, "text": None, "finish_reason": "stop"}]}), "completions", False),
        (json.dumps({"choices": [], "usage": {"completion_tokens": 1}}), "chat", False),
    ],
)
def test_empty_token_chunks(data: str, api: Literal["chat", "completions"], empty_token: bool) -> None:
    frame = interpret_chunk(data, api)
    assert frame.empty_token is empty_token
    assert not (frame.empty_token and frame.carries_tokens)
