"""The runner: for each arm, start the engine, warm it up, run the workload, scrape metrics, stop.

One direction only: scenario -> engine lifecycle -> workload -> client -> records (appended as they
arrive) -> aggregation -> summary.json. Re-running with ``resume`` skips every (arm, repetition,
context length) group that already finished, so a killed run loses at most the group in flight.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

from kvbench.harness.aggregate import GroupDone, MetricsDelta, aggregate
from kvbench.harness.client import OpenAIClient, RequestOutcome
from kvbench.harness.engines.base import LaunchContext, RunningEngine, Tokenizer
from kvbench.harness.engines.registry import create_engine
from kvbench.harness.errors import KvbenchError
from kvbench.harness.manifest import Manifest
from kvbench.harness.metrics_scrape import cache_counter_deltas
from kvbench.harness.records import Phase, RecordWriter, RequestRecord
from kvbench.harness.result import RunResult, write_result
from kvbench.harness.rundir import RunDir
from kvbench.harness.scenario import Arm, MultiRoundQAProbe, Scenario
from kvbench.workloads.multi_round_qa import ConversationState, build_conversations, build_filler

log = logging.getLogger(__name__)

WARMUP_PROMPT_TOKENS = 128


class ProgressSink(Protocol):
    """Where the runner reports progress (the CLI draws a rich progress bar from it)."""

    def start(self, total: int, description: str) -> None: ...

    def advance(self, description: str) -> None: ...

    def describe(self, description: str) -> None: ...


class _NoProgress:
    def start(self, total: int, description: str) -> None:
        return None

    def advance(self, description: str) -> None:
        return None

    def describe(self, description: str) -> None:
        return None


@dataclass(frozen=True)
class _Slot:
    """Identity of one measured request."""

    arm: str
    repetition: int
    context_tokens: int
    conversation: int
    turn: int


def _record(
    outcome: RequestOutcome,
    *,
    slot: _Slot,
    attempt: int,
    phase: Phase,
    api: str,
    expected_prompt_tokens: int | None,
) -> RequestRecord:
    return RequestRecord(
        arm=slot.arm,
        attempt=attempt,
        phase=phase,
        repetition=slot.repetition,
        context_tokens=slot.context_tokens,
        conversation=slot.conversation,
        turn=slot.turn,
        request_id=uuid.uuid4().hex[:16],
        api="chat" if api == "chat" else "completions",
        started_ns=outcome.started_ns,
        ttft_ns=outcome.ttft_ns,
        e2e_ns=outcome.e2e_ns,
        itl_ns=list(outcome.itl_ns),
        output_chunks=outcome.output_chunks,
        first_chunk_ns=outcome.first_chunk_ns,
        empty_token_chunks=outcome.empty_token_chunks,
        finish_reason=outcome.finish_reason,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        cached_tokens=outcome.cached_tokens,
        expected_prompt_tokens=expected_prompt_tokens,
        http_status=outcome.http_status,
        ok=outcome.ok,
        error_kind=outcome.error_kind,
        error=outcome.error,
    )


class ProbeRunner:
    """Runs a multi-round QA probe scenario into a run directory."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        source: Path | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        self.scenario = scenario
        self.workload: MultiRoundQAProbe = scenario.probe_workload
        self.run_dir = run_dir
        self.source = source
        self.progress: ProgressSink = progress or _NoProgress()
        self.attempt = run_dir.last_attempt() + 1

    # -- planning ---------------------------------------------------------------------------
    def _pending_groups(self, arm: Arm, done: set[tuple[str, int, int]]) -> list[tuple[int, int]]:
        return [
            (repetition, context)
            for repetition in range(self.scenario.repetitions)
            for context in self.workload.context_tokens
            if (arm.name, repetition, context) not in done
        ]

    def _prefix_caching(self, arm: Arm) -> bool:
        return arm.profile.prefix_caching and self.workload.between_turns.mode != "disable_prefix_cache"

    # -- running ----------------------------------------------------------------------------
    async def run(self) -> RunResult:
        done = {event.key for event in self.run_dir.groups_done()}
        plan = {arm.name: self._pending_groups(arm, done) for arm in self.scenario.arms}
        total = (
            sum(len(groups) for groups in plan.values()) * self.workload.conversations * self.workload.turns
        )
        self.progress.start(total, "starting")
        manifest = Manifest.start(self.run_dir.manifest_file, self.scenario, self.source, self.attempt)
        status = "interrupted"
        try:
            with RecordWriter(self.run_dir.records_file) as writer:
                for arm in self.scenario.arms:
                    if plan[arm.name]:
                        await self._run_arm(arm, plan[arm.name], writer, manifest)
            status = "completed"
        except KvbenchError:
            status = "failed"
            raise
        finally:
            manifest.finish(status)
        return self.summarize()

    def summarize(self) -> RunResult:
        return summarize_run_dir(self.run_dir)

    async def _run_arm(
        self, arm: Arm, groups: list[tuple[int, int]], writer: RecordWriter, manifest: Manifest
    ) -> None:
        context = LaunchContext(
            arm=arm.name,
            profile=arm.profile,
            log_dir=self.run_dir.log_dir(arm.name),
            prefix_caching=self._prefix_caching(arm),
        )
        self.progress.describe(f"{arm.name}: starting {self.scenario.engine.kind} engine")
        async with create_engine(self.scenario.engine, context) as engine:
            manifest.record_engine(arm.name, engine.facts)
            async with OpenAIClient(engine.endpoint, timeout_s=self.workload.request_timeout_s) as client:
                session = _ArmSession(self, arm, engine, client, writer)
                self.progress.describe(f"{arm.name}: warming up")
                await session.warm_up()
                for repetition, context_tokens in groups:
                    await session.run_group(repetition, context_tokens)
                    self.run_dir.mark_group_done(
                        GroupDone(
                            arm=arm.name,
                            repetition=repetition,
                            context_tokens=context_tokens,
                            attempt=self.attempt,
                        )
                    )
                    writer.sync()


class _ArmSession:
    """One arm's engine, client and tokenizer while the arm runs."""

    def __init__(
        self,
        runner: ProbeRunner,
        arm: Arm,
        engine: RunningEngine,
        client: OpenAIClient,
        writer: RecordWriter,
    ) -> None:
        self.runner = runner
        self.workload = runner.workload
        self.scenario = runner.scenario
        self.arm = arm
        self.engine = engine
        self.client = client
        self.writer = writer
        self.tokenizer: Tokenizer = engine.tokenizer()

    async def _send(self, state_or_prompt: ConversationState | str) -> RequestOutcome:
        w = self.workload
        if isinstance(state_or_prompt, ConversationState):
            if w.api == "chat":
                return await self.client.chat(
                    state_or_prompt.chat_messages(), w.answer_tokens, ignore_eos=w.ignore_eos
                )
            return await self.client.completion(
                state_or_prompt.completion_prompt(), w.answer_tokens, ignore_eos=w.ignore_eos
            )
        if w.api == "chat":
            return await self.client.chat(
                [{"role": "user", "content": state_or_prompt}], w.answer_tokens, ignore_eos=w.ignore_eos
            )
        return await self.client.completion(state_or_prompt, w.answer_tokens, ignore_eos=w.ignore_eos)

    async def warm_up(self) -> None:
        """Unmeasured requests (kernels, allocators, connections), then a clean GPU cache."""
        for index in range(self.workload.warmup_requests):
            prompt = await build_filler(
                self.tokenizer, seed=self.scenario.seed, tag=f"warmup-{index}", tokens=WARMUP_PROMPT_TOKENS
            )
            outcome = await self._send(prompt)
            slot = _Slot(self.arm.name, -1, WARMUP_PROMPT_TOKENS, index, 1)
            self.writer.append(
                _record(
                    outcome,
                    slot=slot,
                    attempt=self.runner.attempt,
                    phase="warmup",
                    api=self.workload.api,
                    expected_prompt_tokens=None,
                )
            )
            if not outcome.ok:
                raise KvbenchError(
                    f"arm {self.arm.name}: warm-up request failed ({outcome.error_kind}: {outcome.error}); "
                    "engine log tail:\n" + "\n".join(self.engine.log_tail(20))
                )
        if self.workload.between_turns.mode == "reset_prefix_cache":
            await self.engine.reset_prefix_cache()

    async def _scrape(self) -> str | None:
        """The engine's /metrics page, or None when it has none (the run goes on without cache stats)."""
        try:
            return await self.client.metrics_text()
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("arm %s: /metrics unavailable (%s); no cache statistics", self.arm.name, error)
            return None

    async def between_turns(self, repetition: int, context_tokens: int, turn: int) -> None:
        mode = self.workload.between_turns.mode
        if mode == "reset_prefix_cache":
            await self.engine.reset_prefix_cache()
        elif mode == "filler":
            await self._send_filler(repetition, context_tokens, turn)

    async def _send_filler(self, repetition: int, context_tokens: int, turn: int) -> None:
        spec = self.workload.between_turns
        sent = 0
        index = 0
        while sent < spec.filler_tokens:
            tokens = min(spec.filler_request_tokens, spec.filler_tokens - sent)
            tokens = max(tokens, 16)
            prompt = await build_filler(
                self.tokenizer,
                seed=self.scenario.seed,
                tag=f"{self.arm.name}-{repetition}-{context_tokens}-{turn}-{index}",
                tokens=tokens,
            )
            outcome = await self._send(prompt)
            slot = _Slot(self.arm.name, repetition, context_tokens, index, turn)
            self.writer.append(
                _record(
                    outcome,
                    slot=slot,
                    attempt=self.runner.attempt,
                    phase="filler",
                    api=self.workload.api,
                    expected_prompt_tokens=tokens,
                )
            )
            sent += tokens
            index += 1

    async def run_group(self, repetition: int, context_tokens: int) -> None:
        conversations = await build_conversations(
            self.workload,
            self.tokenizer,
            seed=self.scenario.seed,
            repetition=repetition,
            context_tokens=context_tokens,
        )
        states = [ConversationState(conv) for conv in conversations]
        alive = list(states)
        if self.workload.between_turns.mode == "reset_prefix_cache":
            await self.engine.reset_prefix_cache()  # turn 1 starts cold
        for turn in range(1, self.workload.turns + 1):
            if turn > 1:
                await self.between_turns(repetition, context_tokens, turn)
            before = await self._scrape()
            survivors = []
            for state in alive:
                outcome = await self._send(state)
                slot = _Slot(self.arm.name, repetition, context_tokens, state.conversation.index, turn)
                self.writer.append(
                    _record(
                        outcome,
                        slot=slot,
                        attempt=self.runner.attempt,
                        phase="measure",
                        api=self.workload.api,
                        expected_prompt_tokens=None,
                    )
                )
                self.runner.progress.advance(f"{self.arm.name} {context_tokens} tok t{turn}")
                if outcome.ok:
                    state.record_answer(outcome.text)
                    survivors.append(state)
                # a failed turn means later turns would not measure a returning user: stop that conversation
            after = await self._scrape()
            alive = survivors
            values = _counter_deltas(before, after)
            if values is not None:
                self.runner.run_dir.append_metrics(
                    MetricsDelta(
                        arm=self.arm.name,
                        attempt=self.runner.attempt,
                        repetition=repetition,
                        context_tokens=context_tokens,
                        turn=turn,
                        values=values,
                    )
                )


def _counter_deltas(before: str | None, after: str | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    try:
        return cache_counter_deltas(before, after)
    except ValueError as error:
        log.warning("unparseable /metrics page (%s); no cache statistics for this turn", error)
        return None


def summarize_run_dir(run_dir: RunDir) -> RunResult:
    """Aggregate a run directory's stored files into summary.json (used by run and report)."""
    scenario = run_dir.scenario()
    result = aggregate(scenario, run_dir.run_id, run_dir.records(), run_dir.groups_done(), run_dir.metrics())
    write_result(result, run_dir.summary_file)
    return result
