"""Unmeasured warm-up requests sent after an engine starts (kernels, allocators, connections).

Shared by the sweep and soak runners: each request is recorded with phase ``warmup`` (so the
records file shows everything that was sent) and a failed one stops the arm with the engine's log tail.
"""

from __future__ import annotations

import uuid

from kvbench.harness.client import OpenAIClient
from kvbench.harness.engines.base import RunningEngine
from kvbench.harness.errors import KvbenchError
from kvbench.harness.records import RecordWriter, RequestRecord
from kvbench.workloads.multi_round_qa import build_filler

WARMUP_PROMPT_TOKENS = 128
WARMUP_ANSWER_TOKENS = 8


async def send_warmup_requests(
    engine: RunningEngine,
    client: OpenAIClient,
    writer: RecordWriter,
    *,
    arm: str,
    attempt: int,
    count: int,
    api: str,
    ignore_eos: bool,
    seed: int,
    tag: str,
    error: type[KvbenchError] = KvbenchError,
) -> None:
    """Send ``count`` short requests; raise ``error`` (with the engine log tail) if one fails."""
    for index in range(count):
        prompt = await build_filler(engine.tokenizer(), seed=seed, tag=f"{tag}-{index}", tokens=WARMUP_PROMPT_TOKENS)
        if api == "chat":
            outcome = await client.chat(
                [{"role": "user", "content": prompt}], WARMUP_ANSWER_TOKENS, ignore_eos=ignore_eos
            )
        else:
            outcome = await client.completion(prompt, WARMUP_ANSWER_TOKENS, ignore_eos=ignore_eos)
        writer.append(
            RequestRecord(
                arm=arm, attempt=attempt, phase="warmup", repetition=0,
                context_tokens=WARMUP_PROMPT_TOKENS, conversation=index, turn=1,
                request_id=uuid.uuid4().hex[:16], api="chat" if api == "chat" else "completions",
                started_ns=outcome.started_ns, ttft_ns=outcome.ttft_ns, e2e_ns=outcome.e2e_ns,
                itl_ns=list(outcome.itl_ns), output_chunks=outcome.output_chunks,
                first_chunk_ns=outcome.first_chunk_ns, empty_token_chunks=outcome.empty_token_chunks,
                finish_reason=outcome.finish_reason,
                prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens,
                cached_tokens=outcome.cached_tokens, http_status=outcome.http_status, ok=outcome.ok,
                error_kind=outcome.error_kind, error=outcome.error,
            )
        )  # fmt: skip
        if not outcome.ok:
            raise error(
                f"arm {arm}: warm-up request failed ({outcome.error_kind}: {outcome.error}); "
                "engine log tail:\n" + "\n".join(engine.log_tail(20))
            )
