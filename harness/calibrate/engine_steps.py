"""Engine steps reconstructed from the request records of one window: who ran in each step, and when it ended.

A continuous-batching engine (vLLM, the simulator) gives every running request one token per
step, and the tokens of one step reach their clients together: on the measured 1x H100 sweep
(vLLM 0.26.0 + LMCache 0.5.3, ``--enforce-eager``) 99.5 % of the gaps between consecutive token
arrivals of different requests are under 1 ms or over 6 ms, and steps are 10-30 ms apart. So the
arrival times of all tokens of the requests one engine served in a window (``started_ns + ttft_ns
+ cumsum(itl_ns)`` per record) fall into clusters, one per step; a gap longer than
``min(4 ms, 0.25 x the window's median inter-token gap)`` starts a new step, and a step *ends* at
its cluster's first arrival. (When two tokens of one request land in one cluster -- vLLM's API
server sometimes flushes the last two together -- the later one is moved to the next step.)

Per step ``k`` (ending at ``ends_ns[k]``; it started when step ``k-1`` ended):

* ``decodes[k]``: the context (prompt + tokens generated before) of each request decoding in it;
* ``prefills[k]``: the prefill chunks it computed, as ``(new tokens, tokens already in the KV
  cache, whether it ends the prompt)``. A request whose first token is in step ``k`` computed its
  ``prompt - cached`` tokens (``cached_tokens`` of its usage: HBM and tier hits) in the steps up to
  ``k``: each step's budget of ``max_batch_tokens`` goes to its decodes first, then to the prefills in
  the order the requests finish them (vLLM's and the simulator's schedulers serve running requests
  in admission order). A prefill takes all the budget left in every step from its admission on; its
  admission is the first step that starts once its per-request overhead has passed (the
  calibration's, an argument), moved as little as needed for the prefill to end in the first
  token's step;
* ``intake[k]``: the prompt lengths of the requests sent while step ``k-1`` ran (their engine-blocking
  intake work is charged to the first step that starts after they arrived, as the simulator does;
  never later than the request's own first prefill chunk). A request sent while the engine was idle
  (no other request between its admission, its send plus overhead, and its last token) has its
  intake run in the idle time and charged nowhere, as in the simulator when the idle time is at
  least the intake;
  ``busy[k]``: whether some request decoded across the start of step ``k`` (the engine was not idle,
  so that work stalled it).

Per request (the records' order): ``first[i]`` / ``last[i]`` the steps of its first and last token.
Its decode window is steps ``first[i]+1 .. last[i]``, lasting ``ends_ns[last] - ends_ns[first]``.

:func:`reconstruct` returns None when the records cannot be placed: more than 5 % of the streams carried
fewer content chunks than tokens (outputs that decode to no text), so their tokens were not timed. (On
the 1x H100 sweep 2 of 3,333 streams merged two tokens into one chunk.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.sim.timemodel import StepWork, TimeModel
from harness.store.records import RequestRecord

MAX_SAME_STEP_NS = 4_000_000
"""Arrivals closer than this (and than a quarter of the median inter-token gap) belong to one step."""
MAX_UNTIMED = 0.05
"""Share of a window's requests whose stream may carry fewer chunks than tokens (their chunks are placed as
they came: a request missing a chunk or two skips those steps); beyond it the window cannot be rebuilt."""


@dataclass(frozen=True)
class EngineSteps:
    """The reconstructed steps of one window (see the module docstring)."""

    records: tuple[RequestRecord, ...]
    ends_ns: np.ndarray
    decodes: tuple[tuple[int, ...], ...]
    prefills: tuple[tuple[tuple[int, int, bool], ...], ...]
    intake: tuple[tuple[int, ...], ...]
    busy: np.ndarray
    first: np.ndarray
    last: np.ndarray

    def __len__(self) -> int:
        return len(self.ends_ns)

    @property
    def durations_s(self) -> np.ndarray:
        """Seconds each step took (step 0: NaN, its start is unknown)."""
        return np.concatenate(([np.nan], np.diff(self.ends_ns) / 1e9))

    def work(self, k: int) -> StepWork:
        """What step ``k`` computed (its intake not included)."""
        work = StepWork()
        for context in self.decodes[k]:
            work.add_decode(context)
        for new, cached, last in self.prefills[k]:
            work.add_prefill(new, cached, last)
        return work

    def modelled_s(self, timing: TimeModel) -> np.ndarray:
        """Seconds per step under ``timing``, intake left out (it is :meth:`intake_overhead_s`'s)."""
        return np.array([timing.step_seconds(self.work(k)) if k else np.nan for k in range(len(self))])

    def intake_overhead_s(self, overhead_s: float, overhead_s_per_ktoken: float) -> np.ndarray:
        """Per step, the per-request overhead of the requests whose intake it is charged (0 while idle)."""
        out = np.zeros(len(self))
        for k, prompts in enumerate(self.intake):
            if prompts and self.busy[k]:
                out[k] = sum(overhead_s + overhead_s_per_ktoken * p / 1000.0 for p in prompts)
        return out

    def intake_arrivals(self) -> np.ndarray:
        """Per step, how many requests' intake it is charged (0 while idle): each adds its backend's
        ``busy_intake_s``."""
        return np.array(
            [len(prompts) if prompts and self.busy[k] else 0 for k, prompts in enumerate(self.intake)], dtype=float
        )


def _admission(budget: np.ndarray, first: int, new: int, earliest: int, full: int) -> tuple[int, int]:
    """(step, tokens before the window): where a prefill of ``new`` tokens began, taking every step's budget
    left from then on, to end in step ``first``.

    It ends there when the budget of the steps from its start to ``first - 1`` falls short of ``new``
    and the budget up to ``first`` reaches it; of those starts, the one nearest ``earliest`` (when it could
    be admitted). When even the window's first step is too late a start, the prefill began before the
    window: the steps before the window are taken as having had all ``full`` tokens of budget, and as many
    of its tokens as they took are returned.
    """
    room = budget.clip(min=0)
    room[first] = max(int(room[first]), 1)
    after = np.concatenate((np.cumsum(room[first::-1])[::-1], [0]))  # after[a] = room of steps a..first
    # consistent starts: room(a..first-1) = after[a] - room[first] < new <= after[a]
    starts = [a for a in range(first + 1) if after[a] - room[first] < new <= after[a]]
    if starts:
        return min(max(earliest, starts[0]), starts[-1]), 0
    if new <= after[0]:  # the budgets left do not add up (others took the first token's step): the latest start
        return max(a for a in range(first + 1) if after[a] >= new), 0
    before_first = int(after[0]) - int(room[first])  # the window's room before the first token's step
    earlier_steps = -(-(new - int(after[0])) // full)
    return 0, min(earlier_steps * full, new - before_first - 1)


def _timed(record: RequestRecord) -> bool:
    tokens = record.completion_tokens or 0
    return record.ok and record.ttft_ns is not None and tokens >= 1 and record.output_chunks >= tokens


def reconstruct(
    records: Sequence[RequestRecord],
    max_batch_tokens: int,
    overhead_s: float = 0.0,
    overhead_s_per_ktoken: float = 0.0,
) -> EngineSteps | None:
    """The steps of the window ``records`` were served in (every successful request of it, warm-up included).

    ``overhead_s + overhead_s_per_ktoken x prompt / 1000`` is the per-request overhead a request waits before
    it can be admitted (the calibration's): where a prefill shares steps with others, it decides which of
    them the prefill's chunks ran in, as in the simulator.
    """
    served = tuple(r for r in records if r.ok and r.ttft_ns is not None and r.prompt_tokens)
    if not served or sum(not _timed(r) for r in served) > MAX_UNTIMED * len(served):
        return None
    times: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for i, r in enumerate(served):
        assert r.ttft_ns is not None
        arrivals = r.started_ns + r.ttft_ns + np.concatenate(([0], np.cumsum(np.asarray(r.itl_ns, dtype=np.int64))))
        times.append(arrivals.astype(np.float64))
        owners.append(np.full(len(arrivals), i))
    at = np.concatenate(times)
    who = np.concatenate(owners)
    order = np.argsort(at, kind="stable")
    at, who = at[order], who[order]
    gaps = [float(np.median(r.itl_ns)) for r in served if r.itl_ns]
    same_step = min(MAX_SAME_STEP_NS, 0.25 * float(np.median(gaps))) if gaps else MAX_SAME_STEP_NS
    new_step = np.concatenate(([True], np.diff(at) > same_step))
    cluster = np.cumsum(new_step) - 1
    ends = at[new_step]
    steps = len(ends)
    # each request's tokens in order; a second token in one cluster moves to the next step
    placed: list[list[int]] = [[] for _ in served]
    for c, i in zip(cluster.tolist(), who.tolist(), strict=True):
        mine = placed[i]
        mine.append(c if not mine or c > mine[-1] else min(mine[-1] + 1, steps - 1))
    decodes: list[list[int]] = [[] for _ in range(steps)]
    prefills: list[list[tuple[int, int, bool]]] = [[] for _ in range(steps)]
    intake: list[list[int]] = [[] for _ in range(steps)]
    first = np.array([mine[0] for mine in placed], dtype=int)
    last = np.array([mine[-1] for mine in placed], dtype=int)
    decoding = np.zeros(steps + 1, dtype=int)  # +1 at a request's first step, -1 after its last
    for r, mine in zip(served, placed, strict=True):
        for j, k in enumerate(mine[1:]):
            decodes[k].append((r.prompt_tokens or 0) + j + 1)
        decoding[mine[0]] += 1
        decoding[mine[-1]] -= 1
    # a request decodes across the start of step k when its first step is before k and its last at or after k
    running = np.cumsum(decoding)[:steps]
    busy = np.concatenate(([False], running[:-1] > 0))
    # prefill chunks: each step's token budget goes to its decodes, then to the prefills of running requests
    # in admission order (taken as the order they finish prefilling, then send order); a request computes as
    # much as the budget left allows in every step from its admission on: the first step that starts once
    # its overhead has passed, moved as little as needed for its prefill to end in its first token's step
    budget = np.array([max_batch_tokens - len(d) for d in decodes])
    delays_ns = np.array([(overhead_s + overhead_s_per_ktoken * (r.prompt_tokens or 0) / 1000.0) * 1e9 for r in served])
    admitted_ns = np.array([r.started_ns for r in served], dtype=np.float64) + delays_ns
    last_ns = ends[last]
    for i in sorted(range(len(served)), key=lambda i: (first[i], served[i].started_ns)):
        r = served[i]
        prompt = r.prompt_tokens or 0
        hit = min(r.cached_tokens or 0, prompt - 1)
        k = int(first[i])
        # the step running when it was sent ends at ends[during] and the intake goes to the next one; if the
        # engine was idle at the send (no request between admission and last token), the intake ran then
        during = int(np.searchsorted(ends, r.started_ns, side="left"))
        engaged = (admitted_ns <= r.started_ns) & (last_ns > r.started_ns)
        engaged[i] = False
        sent_before = during + 1 if engaged.any() else steps
        schedulable = int(np.searchsorted(ends, admitted_ns[i], side="left")) + 1
        admitted, before = _admission(budget, k, prompt - hit, schedulable, max_batch_tokens)
        done = hit + before
        for step in range(admitted, k + 1):
            take = prompt - done if step == k else min(prompt - done, max(int(budget[step]), 0))
            if take <= 0:
                continue
            prefills[step].append((take, done, step == k))
            budget[step] -= take
            done += take
        # intake: the first step that starts at or after the request was sent, and no later than its
        # admission; unknown when the prefill began before the window
        if sent_before < steps and not before:
            intake[min(sent_before, admitted)].append(prompt)
    return EngineSteps(
        records=served,
        ends_ns=ends,
        decodes=tuple(tuple(d) for d in decodes),
        prefills=tuple(tuple(p) for p in prefills),
        intake=tuple(tuple(p) for p in intake),
        busy=busy,
        first=first,
        last=last,
    )
