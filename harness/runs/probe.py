"""``kvbench run``: the multi-round QA probe -- per arm and context length, turn 1 then turn 2.

What differs from the other run kinds (the spine, :mod:`.spine`, does the rest): the work is a
list of (repetition, context length) groups per arm; each group builds its conversations, starts
turn 1 cold (GPU prefix cache reset when the scenario says so), makes turn 2 a *returning* user
(reset, filler traffic, or a disabled GPU prefix cache), scrapes ``/metrics`` around every turn
(``engine_metrics.jsonl``) and, once finished, appends a :class:`GroupDone` to ``progress.jsonl``.
Resume skips every finished group, so a killed run loses at most the group in flight.

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

import logging
from collections.abc import Sequence
from pathlib import Path

from harness.client.scrape import cache_counter_deltas
from harness.engines.base import PrefixCacheResetUnsupported
from harness.results.aggregate import RESET_DETAIL, probe_result_of
from harness.results.run_result import RunResult
from harness.scenario.spec import Arm, Scenario
from harness.store.events import ENGINE_RESTARTS, GroupDone, MetricsDelta
from harness.store.rundir import RunDir
from workloads.config import MultiRoundQAProbe
from workloads.multi_round_qa import ConversationGroup, ConversationState, build_filler
from workloads.tokenizer import TokenIds, tokenizer_facts

from .progress import RunProgress
from .spine import ArmSession, Prompt, Runner, record_from

log = logging.getLogger(__name__)


class ProbeRunner(Runner[RunResult]):
    """Runs a multi-round QA probe scenario into a run directory."""

    verb = "run"
    unit = "requests"

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        source: Path | None = None,
        progress: RunProgress | None = None,
        only_arms: Sequence[str] = (),
    ) -> None:
        super().__init__(scenario, run_dir, source=source, progress=progress, only_arms=only_arms)
        self._no_reset: set[str] = set()
        """Arms whose engine cannot reset its GPU prefix cache (said once; no further tries)."""

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
        if w.between_turns.mode == "reset_prefix_cache":
            await self._reset(session)
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
        if arm in self._no_reset:
            return
        try:
            await session.reset_prefix_cache(required=True)
        except PrefixCacheResetUnsupported as error:
            self._no_reset.add(arm)
            session.note(RESET_DETAIL, str(error))
            message = (
                f"{arm}: {error}, so kvbench cannot drop its GPU prefix cache between turns; the run goes on "
                "(turn 2 may hit that cache) and the validity gates judge it"
            )
            self.progress.note(message)  # once per arm: later resets are not tried

    async def _between_turns(self, session: ArmSession, repetition: int, context_tokens: int, turn: int) -> None:
        mode = self.workload.between_turns.mode
        if mode == "reset_prefix_cache":
            await self._reset(session)
        elif mode == "filler":
            await self._send_filler(session, repetition, context_tokens, turn)

    async def _send_filler(self, session: ArmSession, repetition: int, context_tokens: int, turn: int) -> None:
        w = self.workload
        spec = w.between_turns
        sent = 0
        index = 0
        while sent < spec.filler_tokens:
            tokens = max(min(spec.filler_request_tokens, spec.filler_tokens - sent), 16)
            prompt = await build_filler(
                session.tokenizer,
                seed=self.scenario.seed,
                tag=f"{session.arm.name}-{repetition}-{context_tokens}-{turn}-{index}",
                tokens=tokens,
            )
            outcome = await session.send(prompt, w.answer_tokens, api=w.api, ignore_eos=w.ignore_eos)
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
            sent += tokens
            index += 1

    async def _run_group(self, session: ArmSession, repetition: int, context_tokens: int) -> None:
        w = self.workload
        arm = session.arm.name
        group = ConversationGroup(
            w, session.tokenizer, seed=self.scenario.seed, repetition=repetition, context_tokens=context_tokens
        )
        # index -> answers so far: all a conversation keeps between turns (its document is rebuilt when large)
        alive: dict[int, list[str]] = {index: [] for index in range(w.conversations)}
        _, exact = tokenizer_facts(session.tokenizer)
        if w.between_turns.mode == "reset_prefix_cache":
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


def _counter_deltas(before: str | None, after: str | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    try:
        return cache_counter_deltas(before, after)
    except ValueError as error:
        log.warning("unparseable /metrics page (%s); no cache statistics for this turn", error)
        return None
