"""``kvbench run``: the multi-round QA probe -- per arm and context length, turn 1 then turn 2.

What differs from the other run kinds (the spine, :mod:`.spine`, does the rest): the work is a
list of (repetition, context length) groups per arm; each group builds its conversations, starts
turn 1 cold (GPU prefix cache reset when the scenario says so), makes turn 2 a *returning* user
(reset, filler traffic, or a disabled GPU prefix cache), scrapes ``/metrics`` around every turn
(``engine_metrics.jsonl``) and, once finished, appends a :class:`GroupDone` to ``progress.jsonl``.
Resume skips every finished group, so a killed run loses at most the group in flight. Prompts carry the run's
salt (:mod:`workloads.salt`: a repeated run starts turn 1 cold); a group an earlier attempt left unfinished is
re-run under the salt and the attempt (:meth:`ProbeRunner.group_salt`), so it does not find its own turn 1 in
an attached endpoint's tier.

``between_turns: auto`` (the default) chooses per arm, once, after the warm-up: the GPU prefix-cache reset where
the engine kind drops the GPU cache alone (:func:`harness.engines.kinds.check_supported` of mode
``reset_prefix_cache``) and the endpoint's reset answers; else filler traffic of ceil(capacity x
``FILLER_MARGIN``) prompt tokens per gap, capacity being ``between_turns.gpu_kv_tokens`` (``--gpu-kv-tokens``) or,
without it, the GPU KV-cache size the endpoint's ``/metrics`` reports (:func:`gpu_kv_capacity`: vLLM's
``vllm:cache_config_info``, num_gpu_blocks x block_size, summed over its label sets); else nothing, which the
verdict names with what would make the arm valid.
The choice is said in the console and kept in the manifest (``engines.ARM.details.between_turns`` and, for filler,
``filler_tokens``, ``gpu_kv_tokens``, ``gpu_kv_source``), so the summary names the method that ran. Filler
requests are unique prompts recorded as ``phase: filler``, never measured.

An endpoint that cannot reset its GPU prefix cache (a production vLLM without dev mode, any other
OpenAI-compatible server) is said once per arm, in the console and in the manifest
(``engines.ARM.details.prefix_cache_reset``); the run goes on, turn 2 may hit the GPU cache, and the
validity gates judge what the counters show (:func:`harness.results.validity.with_reset_unavailable`).
Where prompts are built with a tokenizer that is not the engine's (an endpoint without ``/tokenize``),
each measured record keeps the prompt tokens that tokenizer counted (``expected_prompt_tokens``: the
messages' contents for chat, the text for completions), to set beside the server's ``usage.prompt_tokens``.

``arm_order: interleaved`` (:meth:`ProbeRunner.blocks`) runs one repetition per block with the
arms in ABBA order and an engine start per arm and block; each turn's ``/metrics`` delta records
the engine restarts the spine saw (``engine_restarts``), which make the run INCONCLUSIVE.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.client.scrape import SampleKey, cache_counter_deltas, parse_metrics
from harness.engines.base import PrefixCacheResetUnsupported
from harness.engines.kinds import check_supported
from harness.results.aggregate import (
    FILLER_TOKENS_DETAIL,
    GPU_KV_SOURCE_DETAIL,
    GPU_KV_TOKENS_DETAIL,
    METHOD_DETAIL,
    RESET_DETAIL,
    probe_result_of,
)
from harness.results.run_result import BetweenTurnsMethod, ReturningMethod, RunResult
from harness.scenario.spec import Arm
from harness.store.events import ENGINE_RESTARTS, GroupDone, MetricsDelta
from workloads.config import FILLER_MARGIN, MultiRoundQAProbe
from workloads.multi_round_qa import ConversationGroup, ConversationState, build_filler
from workloads.salt import retry_salt
from workloads.tokenizer import TokenIds, tokenizer_facts

from .spine import ArmSession, Prompt, Runner, record_from

log = logging.getLogger(__name__)

FILLER_CONCURRENCY = 8
"""Filler requests in flight at once: the engine batches their prefills (a gap of an H200's 3.7 M KV tokens would
take minutes one request at a time); an engine short of blocks queues the rest, as it would any traffic."""
FILLER_ANSWER_TOKENS = 1
"""max_tokens of a filler request: its prefill is what overwrites the GPU cache, decoding adds only time."""
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""vLLM's info gauge whose labels hold the KV cache's shape (``num_gpu_blocks``, ``block_size``); the simulator
serves it too."""


@dataclass
class _ArmResets:
    """How a probe empties each arm's GPU prefix cache between turns, learnt at the arm's engine starts."""

    no_reset: set[str] = field(default_factory=set)
    """Arms whose engine cannot reset its GPU prefix cache (said once; no further tries)."""
    chosen: dict[str, BetweenTurnsMethod] = field(default_factory=dict)
    """Mode ``auto``: the method chosen per arm (at its first engine start; kept for its later blocks)."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """Mode ``auto``: arms that could neither reset nor size filler -> why, and what would fix it."""


class ProbeRunner(Runner[RunResult]):
    """Runs a multi-round QA probe scenario into a run directory."""

    verb = "run"
    unit = "requests"

    @functools.cached_property
    def _resets(self) -> _ArmResets:
        """Made at first use: each runner learns its arms afresh."""
        return _ArmResets()

    @property
    def workload(self) -> MultiRoundQAProbe:
        return self.scenario.probe_workload

    def _groups(self, arm: Arm, block: int | None = None) -> list[tuple[int, int]]:
        """The arm's unfinished (repetition, context) groups; of one repetition when ``block`` names it."""
        done = {event.key for event in self.run_dir.groups_done()}
        repetitions = range(self.scenario.repetitions) if block is None else (block,)
        return [
            (repetition, context)
            for repetition in repetitions
            for context in self.workload.context_tokens
            if (arm.name, repetition, context) not in done
        ]

    @functools.cached_property
    def _started_before(self) -> frozenset[tuple[str, int, int]]:
        """(arm, repetition, context) groups an earlier attempt sent requests of: their re-run is salted apart."""
        return frozenset(
            (record.arm, record.repetition, record.context_tokens or 0)
            for record in self.run_dir.records()
            if record.attempt < self.attempt and record.phase in ("measure", "filler")
        )

    def group_salt(self, arm: str, repetition: int, context_tokens: int) -> str | None:
        """The run's salt, or for a group an earlier attempt left unfinished the run's salt and this attempt."""
        if (arm, repetition, context_tokens) in self._started_before:
            return retry_salt(self.prompt_salt, self.attempt)
        return self.prompt_salt

    def arms_with_work(self) -> list[Arm]:
        return [arm for arm in self.selected_arms() if self._groups(arm)]

    def blocks(self) -> list[tuple[int | None, list[Arm]]]:
        """``arm_order: interleaved``: block r is repetition r, arms in order for even r and reversed for
        odd r (A B, B A, A B, ...: ABBA), so a drift of the machine over time weighs on every arm alike.
        Resume keeps the same blocks and skips the finished groups in them."""
        if self.scenario.arm_order == "sequential":
            return super().blocks()
        arms = self.selected_arms()
        out: list[tuple[int | None, list[Arm]]] = []
        for repetition in range(self.scenario.repetitions):
            ordered = arms if repetition % 2 == 0 else arms[::-1]
            with_work = [arm for arm in ordered if self._groups(arm, repetition)]
            if with_work:
                out.append((repetition, with_work))
        return out

    def work(self) -> tuple[int, int]:
        per_group = self.workload.conversations * self.workload.turns
        pending = sum(len(self._groups(arm)) for arm in self.selected_arms())
        return pending * per_group, 0

    def prefix_caching(self, arm: Arm) -> bool:
        return arm.profile.prefix_caching and self.workload.between_turns.mode != "disable_prefix_cache"

    def result_of(self) -> RunResult:
        return probe_result_of(self.run_dir)

    async def run_arm(self, session: ArmSession) -> None:
        w = self.workload
        self.progress.describe(f"{session.arm.name}: warming up")
        await session.warm_up(
            w.warmup_requests, api=w.api, ignore_eos=w.ignore_eos, tag="warmup", prompt_tokens=w.warmup_prompt_tokens
        )
        if w.between_turns.mode == "auto":
            await self._choose(session)
        elif w.between_turns.mode == "reset_prefix_cache":
            await self._reset(session)
        await self.wait_for_point(session)
        self.progress.describe(f"{session.arm.name}: measuring")
        for repetition, context_tokens in self._groups(session.arm, session.block):
            await self._run_group(session, repetition, context_tokens)
            self.run_dir.mark_group_done(
                GroupDone(
                    arm=session.arm.name, repetition=repetition, context_tokens=context_tokens, attempt=self.attempt
                )
            )
            session.sync()

    async def _reset(self, session: ArmSession) -> None:
        """Drop the engine's GPU prefix cache; where it cannot, say so once for the arm and go on."""
        arm = session.arm.name
        if arm in self._resets.no_reset:
            return
        try:
            await session.reset_prefix_cache(required=True)
        except PrefixCacheResetUnsupported as error:
            self._resets.no_reset.add(arm)
            session.note(
                RESET_DETAIL,
                f"{error}; between_turns mode auto would evict it with filler traffic instead (sized from /metrics "
                "or --gpu-kv-tokens N)",
            )
            message = (
                f"{arm}: {error}, so kvbench cannot drop its GPU prefix cache between turns; the run goes on "
                "(turn 2 may hit that cache) and the validity gates judge it"
            )
            self.progress.note(message)  # once per arm: later resets are not tried

    async def _choose(self, session: ArmSession) -> None:
        """Mode ``auto``: reset the GPU prefix cache where the engine can; else size filler from the GPU KV capacity
        (the setting, else ``/metrics``); else say what would make the arm valid. Chosen once per arm and noted."""
        arm = session.arm.name
        known = self._resets.chosen.get(arm)
        if known is not None and known.method != "reset_prefix_cache":
            # a later engine start of the arm (a block, a replica set): the same kind, so the same method, noted
            # again since each start records the engine's details afresh
            self._note_method(session, known)
            return
        no_reset = await self._reset_refused(session)
        if no_reset is None:
            if known is None:
                self._note_method(session, BetweenTurnsMethod(arm=arm, method="reset_prefix_cache"))
            return
        spec = self.workload.between_turns
        capacity, source = spec.gpu_kv_tokens, "gpu_kv_tokens"
        if capacity is None:
            page = await session.scrape()
            capacity, source = (gpu_kv_capacity(page) if page is not None else None), "metrics"
        if capacity is None:
            unknown = f"its /metrics gives no GPU KV-cache size ({CACHE_CONFIG_INFO}) to size filler traffic by"
            fix = (
                "pass --gpu-kv-tokens N (its GPU KV capacity in tokens; a scenario's "
                "workload.between_turns.gpu_kv_tokens) or enable its prefix-cache reset (vLLM: VLLM_SERVER_DEV_MODE=1)"
            )
            self._resets.unavailable[arm] = f"{no_reset} and {unknown}; {fix}"
            self._note_method(session, BetweenTurnsMethod(arm=arm, method="unavailable"))
            self.progress.note(
                f"{arm}: {no_reset}, so kvbench cannot drop its GPU prefix cache between turns, and {unknown}; {fix}; "
                "the run goes on and the validity gates judge it"
            )
            return
        method = BetweenTurnsMethod(
            arm=arm,
            method="filler",
            filler_tokens=math.ceil(capacity * FILLER_MARGIN),
            gpu_kv_tokens=capacity,
            gpu_kv_source="metrics" if source == "metrics" else "gpu_kv_tokens",
        )
        self._note_method(session, method)
        self.progress.note(f"{arm}: {no_reset}; between turns kvbench sends {method.describe()} instead")

    async def _reset_refused(self, session: ArmSession) -> str | None:
        """Reset the GPU prefix cache; None when done, else why not: the engine kind cannot drop it alone (SGLang's
        flush empties HiCache, TensorRT-LLM has none: what scenario validation refuses for mode reset_prefix_cache)
        or the endpoint has no reset."""
        try:
            check_supported(self.scenario.engine, session.arm.profile, "reset_prefix_cache")
        except ValueError as error:
            return str(error)
        try:
            await session.reset_prefix_cache(required=True)
        except PrefixCacheResetUnsupported as error:
            return str(error)
        return None

    def _note_method(self, session: ArmSession, method: BetweenTurnsMethod) -> None:
        self._resets.chosen[method.arm] = method
        session.note(METHOD_DETAIL, method.method)
        if method.arm in self._resets.unavailable:
            session.note(RESET_DETAIL, self._resets.unavailable[method.arm])
        if method.method == "filler":
            session.note(FILLER_TOKENS_DETAIL, str(method.filler_tokens))
            session.note(GPU_KV_TOKENS_DETAIL, str(method.gpu_kv_tokens))
            session.note(GPU_KV_SOURCE_DETAIL, str(method.gpu_kv_source))

    def _method(self, arm: str) -> tuple[ReturningMethod, int]:
        """What runs between the arm's turns, and its filler tokens per gap (0 unless filler)."""
        spec = self.workload.between_turns
        if spec.mode != "auto":
            return spec.mode, spec.filler_tokens
        chosen = self._resets.chosen[arm]
        return chosen.method, chosen.filler_tokens or 0

    async def _between_turns(self, session: ArmSession, repetition: int, context_tokens: int, turn: int) -> None:
        method, filler_tokens = self._method(session.arm.name)
        if method == "reset_prefix_cache":
            await self._reset(session)
        elif method == "filler":
            await self._send_filler(session, repetition, context_tokens, turn, filler_tokens)

    async def _send_filler(
        self, session: ArmSession, repetition: int, context_tokens: int, turn: int, total: int
    ) -> None:
        """``total`` prompt tokens of unique filler prompts, :data:`FILLER_CONCURRENCY` at a time, each answered with
        :data:`FILLER_ANSWER_TOKENS` token: their prefill is what overwrites the GPU cache."""
        w = self.workload
        size = w.between_turns.filler_request_tokens
        sizes = [max(min(size, total - start), 16) for start in range(0, total, size)]
        slots = asyncio.Semaphore(FILLER_CONCURRENCY)

        async def send(index: int, tokens: int) -> None:
            async with slots:
                prompt = await build_filler(
                    session.tokenizer,
                    seed=self.scenario.seed,
                    tag=f"{session.arm.name}-{repetition}-{context_tokens}-{turn}-{index}",
                    tokens=tokens,
                    salt=self.group_salt(session.arm.name, repetition, context_tokens),
                )
                outcome = await session.send(prompt, FILLER_ANSWER_TOKENS, api=w.api, ignore_eos=w.ignore_eos)
            session.append(
                record_from(
                    outcome,
                    arm=session.arm.name,
                    attempt=self.attempt,
                    phase="filler",
                    api=w.api,
                    repetition=repetition,
                    context_tokens=context_tokens,
                    conversation=index,
                    turn=turn,
                    expected_prompt_tokens=tokens,
                )
            )

        await asyncio.gather(*(send(index, tokens) for index, tokens in enumerate(sizes)))

    async def _run_group(self, session: ArmSession, repetition: int, context_tokens: int) -> None:
        w = self.workload
        arm = session.arm.name
        group = ConversationGroup(
            w,
            session.tokenizer,
            seed=self.scenario.seed,
            repetition=repetition,
            context_tokens=context_tokens,
            salt=self.group_salt(arm, repetition, context_tokens),
        )
        # index -> answers so far: all a conversation keeps between turns (its document is rebuilt when large)
        # a shard (--shard I/N) runs the conversations I, I+N, ... of each group
        alive: dict[int, list[str]] = {index: [] for index in range(w.conversations) if self.shard.owns(index)}
        _, exact = tokenizer_facts(session.tokenizer)
        if self._method(arm)[0] == "reset_prefix_cache":
            await self._reset(session)  # turn 1 starts cold
        for turn in range(1, w.turns + 1):
            if turn > 1:
                await self._between_turns(session, repetition, context_tokens, turn)
            before = await session.scrape()
            survivors: dict[int, list[str]] = {}
            for index, answers in alive.items():
                state = await group.state(index, answers)
                prompt = await self._prompt(session, state)
                counted = None if exact else await _counted_tokens(session, prompt)
                key = f"{repetition}:{context_tokens}:{state.conversation.index}"
                outcome = await session.send(prompt, w.answer_tokens, api=w.api, ignore_eos=w.ignore_eos, key=key)
                session.append(
                    record_from(
                        outcome,
                        arm=arm,
                        attempt=self.attempt,
                        phase="measure",
                        api=w.api,
                        repetition=repetition,
                        context_tokens=context_tokens,
                        conversation=state.conversation.index,
                        turn=turn,
                        expected_prompt_tokens=counted,
                    )
                )
                self.progress.advance(f"{arm} {context_tokens} tok t{turn}")
                if outcome.ok:
                    state.record_answer(outcome.text)
                    survivors[index] = state.answers
                # a failed turn means later turns would not measure a returning user: stop that conversation
            after = await session.scrape()
            alive = survivors
            values = _counter_deltas(before, after)
            if values is not None:
                values[ENGINE_RESTARTS] = float(session.take_restarts())
                self.run_dir.append_metrics(
                    MetricsDelta(
                        arm=arm,
                        attempt=self.attempt,
                        repetition=repetition,
                        context_tokens=context_tokens,
                        turn=turn,
                        values=values,
                    )
                )

    async def _prompt(self, session: ArmSession, state: ConversationState) -> Prompt:
        """The next turn as the scenario sends it: chat messages, completion text, or that text's token ids (built
        before the request starts, so the client's clock holds none of it)."""
        if self.workload.api == "chat":
            return state.chat_messages()
        text = state.completion_prompt()
        if self.workload.prompt == "token_ids":
            return TokenIds(tuple(await session.tokenizer.prompt_ids(text)))
        return text


async def _counted_tokens(session: ArmSession, prompt: Prompt) -> int:
    """The prompt's tokens as the run's tokenizer counts them: token ids as sent, a text prompt's text, chat messages
    as the sum of their contents (the server's special tokens and chat template add their own)."""
    if isinstance(prompt, TokenIds):
        return len(prompt.ids)
    if isinstance(prompt, str):
        return len(await session.tokenizer.encode(prompt))
    return sum([len(await session.tokenizer.encode(message["content"])) for message in prompt])


def gpu_kv_capacity(page: str) -> int | None:
    """The GPU KV-cache capacity in tokens a ``/metrics`` page reports: Σ over the label sets of
    :data:`CACHE_CONFIG_INFO` of num_gpu_blocks x block_size (data-parallel engines: one set each); None when
    the page has no such gauge or its labels are not positive whole numbers."""
    try:
        snapshot = parse_metrics(page)
    except ValueError:
        return None
    return _capacity_of(key for key in snapshot if key[0] == CACHE_CONFIG_INFO)


def _capacity_of(keys: Iterable[SampleKey]) -> int | None:
    total = 0
    for _, labels in keys:
        found: Mapping[str, str] = dict(labels)
        try:
            blocks, block_size = int(found.get("num_gpu_blocks", "")), int(found.get("block_size", ""))
        except ValueError:
            return None
        if blocks <= 0 or block_size <= 0:
            return None
        total += blocks * block_size
    return total or None


def _counter_deltas(before: str | None, after: str | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    try:
        return cache_counter_deltas(before, after)
    except ValueError as error:
        log.warning("unparseable /metrics page (%s); no cache statistics for this turn", error)
        return None
