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

Resume (``kvbench replay --resume RUN_DIR``) replays, from the start, every arm without a
ReplayDone: an arm is one unit, because half a replay on a fresh engine would not see the cache
state the trace built up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from pathlib import Path

from common.errors import KvbenchError
from harness.client.openai import RequestOutcome
from harness.client.scrape import cache_counter_deltas
from harness.results.replay import summarize_replay
from harness.results.replay_result import ReplayResult
from harness.scenario.spec import Arm, Scenario
from harness.store.events import ReplayDone, ReplaySample, TraceInfo
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.config import TraceReplay
from workloads.trace import Trace, TracePrompts, TraceRequest, load_trace, trace_stats

from .load import run_schedule
from .progress import RunProgress
from .spine import DEFAULT_CONNECTIONS, ArmSession, Runner

log = logging.getLogger(__name__)

NS = 1_000_000_000
MAX_CONNECTIONS = 4096


def load_replayed_trace(config: TraceReplay) -> Trace:
    """The window of the trace file the scenario replays (a clear error naming file, line and field)."""
    trace = load_trace(Path(config.path), config.format, block_tokens=config.block_tokens, allow_gaps=config.allow_gaps)
    window = trace.window(config.start, config.limit)
    if not window.requests:
        raise KvbenchError(f"{config.path}: no requests from position {config.start} ({len(trace.requests)} in file)")
    return window


def trace_info(config: TraceReplay, trace: Trace) -> TraceInfo:
    stats = trace_stats(trace)
    digest = hashlib.sha256(Path(config.path).read_bytes()).hexdigest()
    return TraceInfo(
        path=config.path,
        format=config.format,
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


def due_times(trace: Trace, time_scale: float) -> list[float]:
    """Seconds from the start at which each request is due: (timestamp − first timestamp) × time_scale / 1000."""
    first = trace.requests[0].timestamp_ms
    return [(request.timestamp_ms - first) * time_scale / 1000.0 for request in trace.requests]


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
        self._last_page: str | None = None
        self._last_ns = 0
        self._start_ns = 0

    @property
    def config(self) -> TraceReplay:
        return self.scenario.trace_workload

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

    def summarize(self) -> ReplayResult:
        return summarize_replay(self.run_dir)

    def conversation(self, request: TraceRequest, position: int) -> int:
        """The record's conversation number: the session's order of first appearance, else the position."""
        if request.session is None:
            return position
        return self._conversations.setdefault(request.session, len(self._conversations))

    async def _prompts(self, session: ArmSession) -> list[str]:
        builder = TracePrompts(session.tokenizer, seed=self.scenario.seed, block_tokens=self.trace.block_tokens)
        prompts = []
        total = len(self.trace.requests)
        for index, request in enumerate(self.trace.requests):
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
        requests = self.trace.requests
        self.progress.describe(f"{arm.name}: replaying {len(requests)} requests ({config.mode} loop)")

        async def send_one(index: int) -> RequestOutcome:
            prompt = prompts[index]
            return await session.send(
                prompt, requests[index].output_length, api=config.api, ignore_eos=config.ignore_eos
            )

        def on_outcome(index: int, outcome: RequestOutcome, due_ns: int | None) -> None:
            session.append(self._record(arm.name, index, outcome, due_ns))
            self.progress.advance(f"{arm.name} line {requests[index].line}")

        self._last_page = await session.scrape()  # the baseline of the first interval
        self._start_ns = self._last_ns = time.monotonic_ns()
        sampler = asyncio.ensure_future(self._sample(session))
        try:
            window = await run_schedule(
                len(requests),
                send_one,
                on_outcome,
                due_s=due_times(self.trace, config.time_scale) if config.mode == "open" else None,
                concurrency=config.concurrency,
                drain_timeout_s=config.drain_timeout_s,
            )
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

    def _record(self, arm: str, index: int, outcome: RequestOutcome, due_ns: int | None) -> RequestRecord:
        request = self.trace.requests[index]
        api = self.config.api
        return RequestRecord(
            arm=arm,
            attempt=self.attempt,
            phase="measure",
            repetition=0,
            context_tokens=request.input_length,
            conversation=self.conversation(request, index),
            turn=request.turn or 1,
            request_id=uuid.uuid4().hex[:16],
            api="chat" if api == "chat" else "completions",
            started_ns=outcome.started_ns,
            ttft_ns=outcome.ttft_ns,
            first_content_ns=outcome.first_content_ns,
            e2e_ns=outcome.e2e_ns,
            itl_ns=list(outcome.itl_ns),
            output_chunks=outcome.output_chunks,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            cached_tokens=outcome.cached_tokens,
            expected_prompt_tokens=request.input_length if request.hash_ids is not None else None,
            http_status=outcome.http_status,
            ok=outcome.ok,
            error_kind=outcome.error_kind,
            error=outcome.error,
            scheduled_ns=due_ns,
            trace_line=request.line,
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
