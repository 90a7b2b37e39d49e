"""Every run kind stores what the client saw of a request through one function, so none stores less of it."""

from __future__ import annotations

import dataclasses

from harness.client.openai import RequestOutcome
from harness.runs.recording import OutcomeFields, outcome_fields
from harness.store.records import RequestRecord


def test_every_field_the_outcome_and_the_record_share_is_copied() -> None:
    shared = {field.name for field in dataclasses.fields(RequestOutcome)} & set(RequestRecord.model_fields)
    assert shared and shared <= set(OutcomeFields.__annotations__)


def test_a_record_keeps_the_outcome_it_was_built_from() -> None:
    outcome = RequestOutcome(
        started_ns=10,
        ttft_ns=200,
        e2e_ns=900,
        itl_ns=(300, 400),
        output_chunks=3,
        first_chunk_ns=150,
        first_content_ns=200,
        empty_token_chunks=1,
        prompt_tokens=1000,
        completion_tokens=3,
        cached_tokens=512,
        http_status=200,
        finish_reason="length",
        replica=1,
        moved=True,
    )
    fields = outcome_fields(outcome)
    record = RequestRecord(
        arm="A",
        attempt=0,
        phase="measure",
        repetition=0,
        context_tokens=1000,
        conversation=0,
        turn=1,
        api="chat",
        **fields,
    )
    for name in OutcomeFields.__annotations__:
        if name != "request_id":
            expected = getattr(outcome, name)
            assert getattr(record, name) == (list(expected) if isinstance(expected, tuple) else expected), name
    assert len(record.request_id) == 16 and outcome_fields(outcome)["request_id"] != record.request_id
