"""From one request's outcome to its stored record: the fields every run kind copies the same way.

Each run kind knows what a request *was* (its arm, phase, conversation, turn, trace line, load point);
what the client *saw* (timings, token counts, stream accounting, errors, the replica that served it) is copied
from the :class:`~harness.client.openai.RequestOutcome` here, once, so that no run kind stores less of it.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from harness.client.openai import RequestOutcome


class OutcomeFields(TypedDict):
    """The :class:`~harness.store.records.RequestRecord` fields that come from the client's outcome."""

    request_id: str
    started_ns: int
    ttft_ns: int | None
    e2e_ns: int | None
    itl_ns: list[int]
    output_chunks: int
    first_chunk_ns: int | None
    empty_token_chunks: int
    first_content_ns: int | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    http_status: int | None
    ok: bool
    error_kind: str | None
    error: str | None
    replica: int | None
    moved: bool | None


def outcome_fields(outcome: RequestOutcome) -> OutcomeFields:
    """What the client saw of one request, with a fresh request id (16 hex digits)."""
    return OutcomeFields(
        request_id=uuid.uuid4().hex[:16],
        started_ns=outcome.started_ns,
        ttft_ns=outcome.ttft_ns,
        e2e_ns=outcome.e2e_ns,
        itl_ns=list(outcome.itl_ns),
        output_chunks=outcome.output_chunks,
        first_chunk_ns=outcome.first_chunk_ns,
        empty_token_chunks=outcome.empty_token_chunks,
        first_content_ns=outcome.first_content_ns,
        finish_reason=outcome.finish_reason,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        cached_tokens=outcome.cached_tokens,
        http_status=outcome.http_status,
        ok=outcome.ok,
        error_kind=outcome.error_kind,
        error=outcome.error,
        replica=outcome.replica,
        moved=outcome.moved,
    )
