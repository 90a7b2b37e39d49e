"""``kvbench replay``: a timestamped trace, the same requests on every arm, open or closed loop.

What differs from the other run kinds (the spine, :mod:`.spine`, does the rest): per arm, after the
warm-up, every prompt of the trace window is built with the engine's tokenizer
(:class:`~workloads.trace.TracePrompts`, before any load, because building is CPU work that would
stall the event loop timing the answers), the engine's GPU prefix cache is reset, and
:func:`~harness.runs.load.run_schedule` sends the requests at their scaled timestamps (open) or
``concurrency`` at a time (closed). Every record keeps its trace line and, open loop, the time it
was due (``scheduled_ns``; ``started_ns − scheduled_ns`` is the send lag). ``/metrics`` is scraped
every ``metrics_interval_s`` into ``samples.jsonl`` (hit tokens by source over time). An arm that
sent everything appends a :class:`~harness.store.events.ReplayDone`.

Agent traces (calls with a ``parent``) replay causally (:func:`run_causal`): a child is sent only after
its parent has completed, at

    due(child) = max(send(parent) + (t_child − t_parent) × time_scale, completion(parent)),

subagent branches (children of one call) run concurrently, and roots are due at their scaled
timestamps, open loop across sessions (closed loop: roots as slots free, children at their parent's
completion). Prompts make the engine see the trace's reuse: hash ids through
:class:`~workloads.trace.TracePrompts` at the trace's block size, token ids sent as token ids
(completions), text as recorded (chat messages through the chat API). Records keep ``call_id`` and
``parent_call``; their ``started_ns`` is the send order.

Resume (``kvbench replay --resume RUN_DIR``) replays, from the start, every arm without a
ReplayDone: an arm is one unit, because half a replay on a fresh engine would not see the cache
state the trace built up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import KvbenchError
from harness.client.openai import RequestOutcome
from harness.client.scrape import cache_counter_deltas
from harness.results.replay import replay_result_of
from harness.results.replay_result import ReplayResult
from harness.scenario.spec import Arm, Scenario
from harness.store.events import ReplayDone, ReplaySample, TraceInfo
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.config import TraceReplay
from workloads.tokenizer import TokenIds
from workloads.trace import Trace, TracePrompts, TraceRequest, load_trace, resolve_trace_path, trace_stats

from .load import OnOutcome, ScheduleWindow, SendOne, run_schedule
from .progress import RunProgress
from .recording import outcome_fields
from .shard import START_LEAD_S, Shard, sleep_until
from .spine import DEFAULT_CONNECTIONS, ArmSession, Prompt, Runner

log = logging.getLogger(__name__)

NS = 1_000_000_000
MAX_CONNECTIONS = 4096


def load_replayed_trace(config: TraceReplay) -> Trace:
    """The window of the trace file the scenario replays (a clear error naming file, line and field)."""
    path = resolve_trace_path(config.path)
    trace = load_trace(path, config.format, block_tokens=config.block_tokens, allow_gaps=config.allow_gaps)
    window = trace.window(config.start, config.limit)
    if not window.requests:
        raise KvbenchError(f"{config.path}: no requests from position {config.start} ({len(trace.requests)} in file)")
    return window


def trace_info(config: TraceReplay, trace: Trace) -> TraceInfo:
    stats = trace_stats(trace)
    digest = hashlib.sha256(Path(trace.path).read_bytes()).hexdigest()
    return TraceInfo(
        path=config.path,
        format=trace.format,
        sha256=digest,
        block_tokens=trace.block_tokens,
        start=config.start,
        requests=len(trace.requests),
        duration_s=trace.duration_s,
        time_scale=config.time_scale,
        mode=config.mode,
        concurrency=config.concurrency,
        prompt_tokens_total=stats.prompt_tokens_total,
        input_p50=stats.input_tokens.p50,
        input_p99=stats.input_tokens.p99,
        output_p50=stats.output_tokens.p50,
        infinite_cache_hit_rate=stats.infinite_cache_hit_rate,
    )


def due_times(trace: Trace, time_scale: float, origin_ms: float | None = None) -> list[float]:
    """Seconds from the start at which each request is due: (timestamp − first timestamp) × time_scale / 1000; a
    shard's requests count from the whole trace's first timestamp (``origin_ms``), so the shards' union keeps the
    trace's schedule."""
    first = trace.requests[0].timestamp_ms if origin_ms is None else origin_ms
    return [(request.timestamp_ms - first) * time_scale / 1000.0 for request in trace.requests]


def shard_of_trace(
    trace: Trace, shard: Shard, conversation: Callable[[TraceRequest, int], int]
) -> tuple[Trace, list[int]]:
    """The requests of the conversations ``shard`` owns (conversation ``k mod N == I``; a request without a session
    is its own conversation, numbered by position) and each one's position in ``trace``; a parent in another shard
    is dropped (its child becomes a root, as at a window's edge)."""
    positions = [index for index, request in enumerate(trace.requests) if shard.owns(conversation(request, index))]
    local = {position: index for index, position in enumerate(positions)}
    kept = tuple(
        dataclasses.replace(request, parent=None if request.parent is None else local.get(request.parent))
        for request in (trace.requests[position] for position in positions)
    )
    return Trace(trace.path, trace.format, trace.block_tokens, kept), positions


@dataclass
class _CausalState:
    """Send and completion times (monotonic ns) of every call, and the counters of a causal replay."""

    count: int
    sent_ns: list[int] = field(default_factory=list)
    ended_ns: list[int] = field(default_factory=list)
    done: list[asyncio.Event] = field(default_factory=list)
    in_flight: dict[int, asyncio.Future[RequestOutcome]] = field(default_factory=dict)
    stalled: set[int] = field(default_factory=set)
    last_event_ns: int = 0
    sent: int = 0
    errors: int = 0
    cancelled: int = 0
    max_in_flight: int = 0
    late: int = 0

    def __post_init__(self) -> None:
        self.sent_ns = [0] * self.count
        self.ended_ns = [0] * self.count
        self.done = [asyncio.Event() for _ in range(self.count)]


async def run_causal(
    trace: Trace,
    send_one: SendOne,
    on_outcome: OnOutcome,
    *,
    time_scale: float,
    open_loop: bool,
    concurrency: int | None,
    drain_timeout_s: float,
    origin_ms: float | None = None,
) -> ScheduleWindow:
    """Send every call of ``trace`` once its parent has completed (see the module docstring); ``on_outcome(i,
    outcome, due_ns)`` as each completes. A request in flight while nothing else was sent or completed for
    ``drain_timeout_s`` is cancelled (a ``timeout`` error), and its children are sent as if it had completed."""
    requests = trace.requests
    state = _CausalState(len(requests))
    slots = asyncio.Semaphore(concurrency) if concurrency is not None else None
    start = state.last_event_ns = time.monotonic_ns()
    first_ms = origin_ms if origin_ms is not None else requests[0].timestamp_ms if requests else 0.0

    def scaled_ns(gap_ms: float) -> int:
        return int(gap_ms * time_scale * 1_000_000) if open_loop else 0

    async def one(index: int) -> None:
        request = requests[index]
        if request.parent is None:
            due = start + scaled_ns(request.timestamp_ms - first_ms)
        else:
            parent = request.parent
            await state.done[parent].wait()
            gap = scaled_ns(request.timestamp_ms - requests[parent].timestamp_ms)
            due = max(state.sent_ns[parent] + gap, state.ended_ns[parent])
        await asyncio.sleep(max(0.0, (due - time.monotonic_ns()) / NS))
        if slots is not None:
            if slots.locked():
                state.late += 1
            await slots.acquire()
        state.sent_ns[index] = state.last_event_ns = time.monotonic_ns()
        state.sent += 1
        sending = asyncio.ensure_future(send_one(index))
        state.in_flight[index] = sending
        state.max_in_flight = max(state.max_in_flight, len(state.in_flight))
        try:
            outcome = await sending
        except asyncio.CancelledError:
            if index not in state.stalled:
                raise  # the replay itself is being cancelled
            state.cancelled += 1
            outcome = RequestOutcome(
                started_ns=state.sent_ns[index],
                e2e_ns=time.monotonic_ns() - state.sent_ns[index],
                error_kind="timeout",
                error=f"nothing else completed for {drain_timeout_s:g} s while it ran; cancelled",
            )
        finally:
            state.in_flight.pop(index, None)
            state.ended_ns[index] = state.last_event_ns = time.monotonic_ns()
            if slots is not None:
                slots.release()
            state.done[index].set()
        if not outcome.ok:
            state.errors += 1
        on_outcome(index, outcome, due if open_loop else None)

    tasks = [asyncio.ensure_future(one(index)) for index in range(len(requests))]
    try:
        pending: set[asyncio.Future[None]] = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=min(1.0, drain_timeout_s))
            idle_s = (time.monotonic_ns() - state.last_event_ns) / NS
            if state.in_flight and idle_s > drain_timeout_s:
                for index, sending in list(state.in_flight.items()):
                    state.stalled.add(index)
                    sending.cancel()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return ScheduleWindow(
        start_ns=start,
        end_ns=time.monotonic_ns(),
        sent=state.sent,
        errors=state.errors,
        cancelled=state.cancelled,
        max_in_flight=state.max_in_flight,
        waited_for_slot=state.late,
    )


class TraceRunner(Runner[ReplayResult]):
    """Replays a trace scenario into a run directory."""

    verb = "replay"
    unit = "requests"

    def __init__(
        self, scenario: Scenario, run_dir: RunDir, *, source: Path | None = None, progress: RunProgress | None = None
    ) -> None:
        super().__init__(scenario, run_dir, source=source, progress=progress)
        self.trace = load_replayed_trace(self.config)
        info = trace_info(self.config, self.trace)
        stored = run_dir.trace_info()
        if stored is None:
            run_dir.write_trace_info(info)
        elif stored.sha256 != info.sha256:
            # every arm must replay the same requests: a resume on another file would compare two traces
            raise KvbenchError(
                f"{self.config.path}: the trace changed since {run_dir.path} started (sha256 {stored.sha256[:12]}… "
                f"then, {info.sha256[:12]}… now); start a new replay"
            )
        self._conversations: dict[str, int] = {}
        self._positions = list(range(len(self.trace.requests)))
        """Each replayed request's position in the scenario's trace window (a shard replays part of it)."""
        self._origin_ms = self.trace.requests[0].timestamp_ms
        self._last_page: str | None = None
        self._last_ns = 0
        self._start_ns = 0

    @property
    def config(self) -> TraceReplay:
        return self.scenario.trace_workload

    def set_shard(self, shard: Shard, start_at: float | None) -> None:
        super().set_shard(shard, start_at)
        if shard.sharded:
            self.trace, self._positions = shard_of_trace(self.trace, shard, self.conversation)

    def _finished(self) -> set[str]:
        return {event.arm for event in self.run_dir.replayed()}

    def arms_with_work(self) -> list[Arm]:
        finished = self._finished()
        return [arm for arm in self.scenario.arms if arm.name not in finished]

    def work(self) -> tuple[int, int]:
        per_arm = len(self.trace.requests)
        return per_arm * len(self.scenario.arms), per_arm * len(self._finished())

    def connections(self) -> int:
        if self.config.concurrency is not None:
            return self.config.concurrency + 8
        return max(DEFAULT_CONNECTIONS, min(len(self.trace.requests), MAX_CONNECTIONS) + 8)

    def result_of(self) -> ReplayResult:
        return replay_result_of(self.run_dir)

    def conversation(self, request: TraceRequest, position: int) -> int:
        """The record's conversation number: the session's order of first appearance, else the position."""
        if request.session is None:
            return position
        return self._conversations.setdefault(request.session, len(self._conversations))

    async def _prompts(self, session: ArmSession) -> list[Prompt]:
        """Each call's prompt as the engine is sent it: token ids, chat messages, or text (hash blocks built)."""
        builder = TracePrompts(
            session.tokenizer, seed=self.scenario.seed, block_tokens=self.trace.block_tokens, salt=self.prompt_salt
        )
        prompts: list[Prompt] = []
        total = len(self.trace.requests)
        for index, request in enumerate(self.trace.requests):
            if request.token_ids is not None:
                prompts.append(TokenIds(request.token_ids))
            elif request.messages is not None:
                prompts.append([{"role": role, "content": content} for role, content in request.messages])
            else:
                prompts.append(await builder.prompt(request))
            if index % 50 == 0:
                self.progress.describe(f"{session.arm.name}: building prompts {index + 1}/{total}")
        return prompts

    async def run_arm(self, session: ArmSession) -> None:
        config, arm = self.config, session.arm
        self.progress.describe(f"{arm.name}: warming up")
        await session.warm_up(config.warmup_requests, api=config.api, ignore_eos=config.ignore_eos, tag="replay")
        prompts = await self._prompts(session)
        await session.reset_prefix_cache(required=False)
        start = await self.wait_for_point(session, 0, START_LEAD_S)
        requests = self.trace.requests
        self.progress.describe(f"{arm.name}: replaying {len(requests)} requests ({config.mode} loop)")

        async def send_one(index: int) -> RequestOutcome:
            prompt = prompts[index]
            return await session.send(
                prompt, max(1, requests[index].output_length), api=self._api(prompt), ignore_eos=config.ignore_eos
            )

        def on_outcome(index: int, outcome: RequestOutcome, due_ns: int | None) -> None:
            session.append(self._record(arm.name, index, outcome, due_ns))
            self.progress.advance(f"{arm.name} line {requests[index].line}")

        self._last_page = await session.scrape()  # the baseline of the first interval
        await sleep_until(start)  # a shard: the common start (--start-at)
        self._start_ns = self._last_ns = time.monotonic_ns()
        sampler = asyncio.ensure_future(self._sample(session))
        try:
            if any(request.parent is not None for request in requests):
                replayed = run_causal(
                    self.trace,
                    send_one,
                    on_outcome,
                    time_scale=config.time_scale,
                    open_loop=config.mode == "open",
                    concurrency=config.concurrency,
                    drain_timeout_s=config.drain_timeout_s,
                    origin_ms=self._origin_ms,
                )
            else:
                replayed = run_schedule(
                    len(requests),
                    send_one,
                    on_outcome,
                    due_s=due_times(self.trace, config.time_scale, self._origin_ms) if config.mode == "open" else None,
                    concurrency=config.concurrency,
                    drain_timeout_s=config.drain_timeout_s,
                )
            # a dead engine ends the arm as a finding at once, not after the rest of the trace has been refused
            window = await session.while_alive(replayed)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        await self._sample_once(session)
        session.sync()
        self.run_dir.mark_replayed(
            ReplayDone(
                arm=arm.name,
                attempt=self.attempt,
                start_ns=window.start_ns,
                end_ns=window.end_ns,
                sent=window.sent,
                errors=window.errors,
                cancelled=window.cancelled,
                max_in_flight=window.max_in_flight,
            )
        )

    def _api(self, prompt: Prompt) -> str:
        """Token ids go through completions and chat messages through chat, whatever the scenario's ``api``."""
        if isinstance(prompt, TokenIds):
            return "completions"
        return self.config.api if isinstance(prompt, str) else "chat"

    def _record(self, arm: str, index: int, outcome: RequestOutcome, due_ns: int | None) -> RequestRecord:
        request = self.trace.requests[index]
        api = "chat" if request.messages is not None else ("completions" if request.token_ids else self.config.api)
        parent = None if request.parent is None else self.trace.requests[request.parent].call_id
        return RequestRecord(
            arm=arm,
            attempt=self.attempt,
            phase="measure",
            repetition=0,
            context_tokens=request.input_length,
            conversation=self.conversation(request, self._positions[index]),
            turn=request.turn or 1,
            api="chat" if api == "chat" else "completions",
            expected_prompt_tokens=request.input_length
            if request.hash_ids is not None or request.token_ids is not None
            else None,
            scheduled_ns=due_ns,
            trace_line=request.line,
            call_id=request.call_id,
            parent_call=parent,
            **outcome_fields(outcome),
        )

    # -- /metrics over time ---------------------------------------------------------------------
    async def _sample(self, session: ArmSession) -> None:
        """Scrape every ``metrics_interval_s`` until cancelled."""
        interval = self.config.metrics_interval_s
        while True:
            await asyncio.sleep(interval)
            await self._sample_once(session)

    async def _sample_once(self, session: ArmSession) -> None:
        page = await session.scrape()
        now = time.monotonic_ns()
        before, self._last_page = self._last_page, page
        previous, self._last_ns = self._last_ns, now
        if before is None or page is None:
            return
        try:
            values = cache_counter_deltas(before, page)
        except ValueError as error:
            log.warning("unparseable /metrics page (%s); no cache statistics for this interval", error)
            return
        self.run_dir.append_sample(
            ReplaySample(
                arm=session.arm.name,
                attempt=self.attempt,
                t_s=(now - self._start_ns) / NS,
                duration_s=(now - previous) / NS,
                values=values,
            )
        )
