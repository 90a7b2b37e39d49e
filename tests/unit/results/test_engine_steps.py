"""``harness.calibrate.engine_steps``: the engine's steps, rebuilt from the token arrival times of a window."""

from __future__ import annotations

import numpy as np
import pytest

from harness.calibrate.engine_steps import reconstruct
from harness.store.records import RequestRecord
from tests.resultfiles import request_record

MS = 1_000_000


def _record(
    name: str, sent_ms: float, token_ms: list[float], prompt: int, cached: int = 0, chunks: int | None = None
) -> RequestRecord:
    """A request sent at ``sent_ms`` whose tokens arrived at ``token_ms`` (absolute, ms)."""
    first = token_ms[0]
    gaps = np.diff(token_ms)
    return request_record(
        "A",
        prompt,
        0,
        1,
        request_id=name,
        started_ns=int(sent_ms * MS),
        ttft_ns=int((first - sent_ms) * MS),
        e2e_ns=int((token_ms[-1] - sent_ms) * MS),
        itl_ns=[int(g * MS) for g in gaps],
        output_chunks=len(token_ms) if chunks is None else chunks,
        prompt_tokens=prompt,
        completion_tokens=len(token_ms),
        cached_tokens=cached,
        ok=True,
    )


def test_steps_decodes_prefill_chunks_and_intake_are_placed() -> None:
    # A: sent at 0, its 10,000-token prompt in two chunks (8,192 + 1,808), first token at 30 ms, then
    # steps of 10 ms (40, 50, ..., 90). B: sent at 44 ms (while the step ending at 50 runs), 96 of its
    # 2,096 tokens to compute after a 2,000-token hit, first token at 60 ms (+0.3 ms client jitter),
    # then 70 and 80.
    a = _record("a", 0.0, [30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0], prompt=10_000)
    b = _record("b", 44.0, [60.3, 70.2, 80.1], prompt=2096, cached=2000)
    steps = reconstruct([a, b], max_batch_tokens=8192)
    assert steps is not None
    assert steps.ends_ns.tolist() == [30 * MS, 40 * MS, 50 * MS, 60 * MS, 70 * MS, 80 * MS, 90 * MS]
    assert steps.first.tolist() == [0, 3] and steps.last.tolist() == [6, 5]
    # A's first chunk ran in the step before its first token (whose start is not in the window)
    assert steps.prefills[0] == ((1808, 8192, True),)
    assert steps.prefills[3] == ((96, 2000, True),)
    # decodes: the context each decoding request had (prompt + tokens generated before)
    assert steps.decodes[1] == (10_001,)
    assert steps.decodes[3] == (10_003,)
    assert steps.decodes[4] == (10_004, 2097)
    # B was sent during the step ending at 50: its intake goes to the step that starts then
    assert steps.intake[3] == (2096,) and not any(steps.intake[k] for k in (0, 1, 2, 4, 5, 6))
    assert steps.busy.tolist() == [False, True, True, True, True, True, True]
    assert steps.durations_s[1:] == pytest.approx([0.010] * 6)
    overheads = steps.intake_overhead_s(0.004, 0.002)
    assert overheads[3] == pytest.approx(0.004 + 0.002 * 2.096) and overheads.sum() == pytest.approx(overheads[3])


def test_the_last_two_tokens_flushed_together_go_to_consecutive_steps() -> None:
    # C's last two tokens reach the client 0.2 ms apart (at D's step ending 30): the later one is the next step's
    c = _record("c", 0.0, [10.0, 20.0, 30.0, 30.2], prompt=100)
    d = _record("d", 0.0, [10.0, 20.0, 30.0, 40.0], prompt=100)
    steps = reconstruct([c, d], max_batch_tokens=8192)
    assert steps is not None
    assert len(steps) == 4 and steps.last.tolist() == [3, 3]
    assert [len(x) for x in steps.decodes] == [0, 2, 2, 2]


def test_a_stream_with_fewer_chunks_than_tokens_cannot_be_placed() -> None:
    silent = _record("s", 0.0, [10.0, 20.0, 30.0], prompt=100, chunks=2)
    assert reconstruct([silent, _record("t", 0.0, [10.0, 20.0], prompt=50)], 8192) is None


def test_a_prefill_takes_the_budget_left_from_its_admission_on() -> None:
    # Steps of 10 ms end at 10, 20, ..., 60; A decodes in every one. The budget is 100 tokens a step: A's
    # decode takes 1, B's 60-token prompt ends in step 2 (ending at 30 ms), C's 70 tokens end in step 3.
    a = _record("a", 0.0, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0], prompt=10)
    b = _record("b", 11.0, [30.0, 40.0], prompt=60)
    early = _record("c", 12.0, [40.0, 50.0], prompt=70)  # schedulable when step 2 starts (20 ms): 39 + 31
    steps = reconstruct([a, b, early], max_batch_tokens=100)
    assert steps is not None
    assert steps.prefills[2] == ((60, 0, True), (39, 0, False)) and steps.prefills[3] == ((31, 39, True),)
    late = _record("c", 21.0, [40.0, 50.0], prompt=70)  # sent while step 2 ran: all of it in step 3
    steps = reconstruct([a, b, late], max_batch_tokens=100)
    assert steps is not None
    assert steps.prefills[2] == ((60, 0, True),) and steps.prefills[3] == ((70, 0, True),)
    # with a 15 ms overhead before admission, the early C could not start before step 3 either
    delayed = reconstruct([a, b, early], max_batch_tokens=100, overhead_s=0.015)
    assert delayed is not None and delayed.prefills[3] == ((70, 0, True),)
    # intake: B and C were sent while A decoded, so theirs stalls the next step; A's own arrival found the
    # engine idle and is charged nowhere
    assert steps.intake[2] == (60,) and steps.intake[3] == (70,) and sum(len(x) for x in steps.intake) == 2
