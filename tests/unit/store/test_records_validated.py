"""Records are validated on load: strict integers, non-negative counts, durations within a day, ok needs a TTFT,
clock readings in the order they happen (TTFT <= end-to-end, ...) and cache hits within the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import RunDirError
from harness.store.records import MAX_DURATION_NS, RequestRecord, read_records

GOOD = {
    "arm": "AMG-ON",
    "attempt": 0,
    "phase": "measure",
    "repetition": 0,
    "context_tokens": 1000,
    "conversation": 0,
    "turn": 2,
    "request_id": "r1",
    "api": "chat",
    "started_ns": 7_000_000_000,
    "ttft_ns": 25_000_000,
    "e2e_ns": 40_000_000,
    "itl_ns": [1_000_000, 2_000_000],
    "ok": True,
    "prompt_tokens": 1000,
    "cached_tokens": 900,
}


def written(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "records.jsonl"
    lines = [json.dumps(GOOD), json.dumps({**GOOD, "request_id": "r2", **changes}), json.dumps(GOOD)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_good_file_loads_and_the_client_tuple_of_gaps_is_accepted(tmp_path: Path) -> None:
    assert len(list(read_records(written(tmp_path)))) == 3
    record = RequestRecord.model_validate({**GOOD, "itl_ns": (1, 2)})
    assert record.itl_ns == [1, 2]


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"ttft_ns": -5_000_000_000}, "ttft_ns", "greater than or equal to 0"),
        ({"ttft_ns": 10**18}, "ttft_ns", f"less than or equal to {MAX_DURATION_NS}"),
        ({"ttft_ns": "12"}, "ttft_ns", "valid integer"),
        ({"ttft_ns": 12.5}, "ttft_ns", "valid integer"),
        ({"ttft_ns": None}, "ok", "true needs a TTFT"),
        ({"itl_ns": [1, -3]}, "itl_ns.1", "greater than or equal to 0"),
        ({"e2e_ns": MAX_DURATION_NS + 1}, "e2e_ns", "less than or equal to"),
        ({"prompt_tokens": -1}, "prompt_tokens", "greater than or equal to 0"),
        ({"turn": 0}, "turn", "greater than or equal to 1"),
        ({"load": "nan"}, "load", "valid number"),
        # impossible orderings of one request's clock readings (all on one monotonic clock)
        ({"ttft_ns": 120_000_000}, "e2e_ns", "earlier than ttft_ns 120000000"),
        ({"first_content_ns": 10_000_000}, "first_content_ns", "earlier than ttft_ns"),
        ({"first_content_ns": 50_000_000}, "e2e_ns", "earlier than first_content_ns"),
        ({"first_chunk_ns": 30_000_000}, "first_chunk_ns", "later than ttft_ns"),
        ({"ttft_ns": None, "ok": False, "first_chunk_ns": 50_000_000}, "first_chunk_ns", "later than e2e_ns"),
        ({"itl_ns": [10_000_000, 10_000_000]}, "itl_ns", "more than e2e_ns - ttft_ns = 15000000"),
        ({"cached_tokens": 1001}, "cached_tokens", "more than prompt_tokens 1000"),
    ],
)
def test_an_impossible_record_is_one_line_naming_file_line_and_field(
    tmp_path: Path, changes: dict[str, object], field: str, problem: str
) -> None:
    path = written(tmp_path, **changes)
    with pytest.raises(RunDirError) as caught:
        list(read_records(path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:2: not a valid RequestRecord: {field}: ")
    assert problem in message


def test_a_failed_request_without_a_ttft_is_a_record(tmp_path: Path) -> None:
    path = written(tmp_path, ok=False, ttft_ns=None, error_kind="timeout")
    assert [r.ok for r in read_records(path)] == [True, False, True]
