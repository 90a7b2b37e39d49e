"""``kvbench sweep`` of workload kind ``agentic``: concurrent agent sessions per load point, against SLO tiers.

What differs from a multi-user sweep (:mod:`.sweep`; the spine, :mod:`.spine`, does the rest): the load is
``agents`` sessions at once (closed loop over sessions: a finished session is replaced by the next one, session
ids of point ``p`` from ``p × SESSIONS_PER_POINT``; a shard runs slots ``j mod N == I`` and sessions ``k·N + I``,
:mod:`.shard`), and a session is a plan of
:mod:`workloads.agentic` (synthesized, or drawn from an agent trace): a causal tree whose calls are each sent
after their parent's answer and their pause (tool time), every child of a call concurrently, each chain that
forks off tracked like any sender so the drain waits for it. A failed call stops its subtree.
Prompts are built from the calls' hash blocks exactly as a trace replay
builds them (:class:`~workloads.trace.TracePrompts`: equal blocks, identical text), lazily, since a closed loop
cannot know in advance which sessions it will reach.

Each point: ``warmup_s`` of load unmeasured, ``window_s`` measured (calls *sent* inside it are ``measure``), then
``drain_timeout_s`` for what is in flight; ``/metrics`` is scraped at the window's edges and a
:class:`~harness.store.events.PointDone` appended to ``points.jsonl``, so ``--resume`` re-runs only unfinished
points. The result (``agentic.json``) is :func:`harness.results.agentic.agentic_result_of` of the stored files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from harness.client.fidelity import LoopMonitor
from harness.client.openai import RequestOutcome
from harness.results.agentic import agentic_result_of
from harness.results.agentic_result import AgenticResult
from harness.store.records import Phase, RequestRecord
from workloads.agentic import AgentCall, AgentSessionPlan, AgentSessions
from workloads.config import AgenticSessions
from workloads.salt import point_salt
from workloads.trace import TracePrompts

from .load import NS, LoadWindow, RecordContext, RefusedBackoff, _cancelled, _Driver, _Stopped
from .points import SESSIONS_PER_POINT, PointGridRunner
from .recording import outcome_fields
from .shard import SETUP_ALLOWANCE_S, START_LEAD_S, WHOLE, Shard, sleep_until
from .spine import ArmSession

TICK_S = 0.5


class AgenticRunner(PointGridRunner[AgenticResult]):
    """Runs an agentic scenario's sweep into a run directory."""

    verb = "sweep"
    unit = "points"

    @property
    def config(self) -> AgenticSessions:
        return self.scenario.agentic_workload

    @cached_property
    def sessions(self) -> AgentSessions:
        return AgentSessions(self.config, seed=self.scenario.seed)

    def work(self) -> tuple[int, int]:
        _ = self.sessions  # a trace that cannot be replayed is refused before any engine starts
        return super().work()

    def grid_size(self) -> int:
        return len(self.config.agents)

    def connections(self) -> int:
        # a session has its main branch and its subagents in flight at once
        return max(self.config.agents) * 4 + 8

    def point_period_s(self) -> float:
        config = self.config
        return config.warmup_s + config.window_s + config.drain_timeout_s + SETUP_ALLOWANCE_S

    def shares(self) -> list[dict[str, float]]:
        return [
            {"point": index, "load": float(agents), "share": float(self.shard.share(agents))}
            for index, agents in enumerate(self.config.agents)
        ]

    def result_of(self) -> AgenticResult:
        return agentic_result_of(self.run_dir)

    async def run_arm(self, session: ArmSession) -> None:
        arm, config = session.arm, self.config
        self.progress.describe(f"{arm.name}: warming up")
        await session.warm_up(config.warmup_requests, api=config.api, ignore_eos=config.ignore_eos, tag="agentic")
        sessions = self.sessions
        await session.reset_prefix_cache(required=False)
        for index in self.pending()[arm.name]:
            if config.reset_between_points:
                await session.reset_prefix_cache(required=False)
            # a point's own salt: an agent trace's sessions come round again at the next point, and must not find
            # the blocks this point sent
            prompts = TracePrompts(
                session.tokenizer,
                seed=self.scenario.seed,
                block_tokens=sessions.block_tokens,
                salt=point_salt(self.prompt_salt, index),
            )
            start = await self.wait_for_point(session, index, START_LEAD_S)
            await session.while_alive(self._run_point(session, index, sessions, prompts, start))

    async def _run_point(
        self,
        session: ArmSession,
        index: int,
        sessions: AgentSessions,
        prompts: TracePrompts,
        start_unix_s: float | None,
    ) -> None:
        config, arm = self.config, session.arm
        agents = config.agents[index]

        async def drive(on_record: Callable[[RequestRecord], None], on_tick: Callable[[int], None]) -> LoadWindow:
            driver = _AgentDriver(
                arm_session=session,
                sessions=sessions,
                prompts=prompts,
                config=config,
                agents=agents,
                first_session=index * SESSIONS_PER_POINT,
                shard=self.shard,
                start_unix_s=start_unix_s,
                context=RecordContext(arm=arm.name, attempt=self.attempt, point=index),
                on_record=on_record,
            )
            return await driver.run(on_tick)

        window = await self.measure_point(
            session,
            index,
            float(agents),
            label=f"{arm.name} @ {agents} agents",
            warmup_s=config.warmup_s,
            window_s=config.window_s,
            noun="calls",
            start_unix_s=start_unix_s,
            drive=drive,
        )
        self.progress.advance(f"{arm.name} @ {agents} agents: {window.measured} calls measured")


@dataclass(kw_only=True)
class _AgentDriver(_Driver):
    """``agents`` session slots, each running sessions one after another until sending stops."""

    arm_session: ArmSession
    sessions: AgentSessions
    prompts: TracePrompts
    config: AgenticSessions
    agents: int
    first_session: int
    shard: Shard = WHOLE
    """Runs the agent slots ``j mod N == I`` and sessions ``k·N + I`` (:mod:`.shard`)."""
    start_unix_s: float | None = None
    """Wall-clock start (a shard's common start); None: at once."""
    context: RecordContext
    window_start_ns: int = 0
    next_session: int = 0
    backoff: RefusedBackoff | None = None
    """Waits after calls that could not connect (a dead engine must not be hammered; see RefusedBackoff)."""

    @property
    def drain_timeout(self) -> float:
        return self.config.drain_timeout_s

    def launch(self) -> None:
        for slot in range(self.agents):
            if self.shard.owns(slot):
                self.spawn(self._slot(slot))

    async def _slot(self, slot: int) -> None:
        await self.pause_until(self.start_ns + int(slot * self.config.ramp_up_s * NS / self.agents))
        while not self.stopping:
            plan = self.sessions.plan(self.first_session + self.shard.global_number(self.next_session))
            self.next_session += 1
            self.counters.sessions += 1
            await self._session(plan)

    async def _session(self, plan: AgentSessionPlan) -> None:
        """The plan's causal tree: a call is sent after its parent's answer and its pause (a trace's call: at its
        parent's send + its gap, or at the answer if later), all children of a call start together, and the session
        ends when every call is done. The first root's chain of first children (synthesized: the main branch) runs
        in this task; every other child runs in a tracked task of its own, so that the drain waits for it."""
        forks: list[asyncio.Task[Any]] = []
        roots = plan.roots
        if not roots:
            return
        forks += [self.spawn(self._chain(plan, root, forks)) for root in roots[1:]]
        await self._chain(plan, roots[0], forks)
        while pending := [task for task in forks if not task.done()]:
            await asyncio.wait(pending)

    async def _chain(
        self, plan: AgentSessionPlan, index: int, forks: list[asyncio.Task[Any]], parent_sent_ns: int | None = None
    ) -> None:
        """Call ``index``, then its first child, and so on, forking the other children into ``forks``."""
        current: int | None = index
        while current is not None:
            sent_ns = await self._call(plan.call(current), parent_sent_ns)
            if sent_ns is None:
                return  # a failed call: its subtree cannot go on without its answer
            children = plan.children(current)
            forks += [self.spawn(self._chain(plan, child, forks, sent_ns)) for child in children[1:]]
            current = children[0] if children else None
            parent_sent_ns = sent_ns

    async def _call(self, call: AgentCall, parent_sent_ns: int | None) -> int | None:
        """Wait until the call is due, send it, record it; when it was sent, or None when it failed."""
        answered_ns = time.monotonic_ns()  # the parent's answer is in (or there is none)
        start_ns = parent_sent_ns if call.gap_from_send and parent_sent_ns is not None else answered_ns
        due_ns = start_ns + int(call.pause_s * NS)
        if due_ns > time.monotonic_ns():
            await self.pause_until(due_ns)
        if self.stopping:
            raise _Stopped
        prompt = await self.prompts.prompt(call.trace_request())
        now = time.monotonic_ns()
        phase: Phase = "warmup" if now < self.window_start_ns else "measure"
        config = self.config
        outcome = await self.counted(
            self.arm_session.send(
                prompt, call.output_tokens, api=config.api, ignore_eos=config.ignore_eos, key=str(call.session)
            ),
            lambda: self._emit(call, phase, _cancelled(now)),
        )
        self._emit(call, phase, outcome)
        # a call due before its parent answered could not leave before the answer: that wait is not the client's
        self.sent_late(outcome.started_ns, max(due_ns, answered_ns), self.window_start_ns)
        if self.backoff is None:
            self.backoff = RefusedBackoff(seed=self.first_session)
        wait_s = self.backoff.after(outcome)
        if wait_s > 0:
            await self.pause_until(time.monotonic_ns() + int(wait_s * NS))
        return outcome.started_ns if outcome.ok else None

    def _emit(self, call: AgentCall, phase: Phase, outcome: RequestOutcome) -> None:
        self.emit(
            RequestRecord(
                arm=self.context.arm,
                attempt=self.context.attempt,
                phase=phase,
                repetition=0,
                context_tokens=call.prompt_tokens,
                conversation=call.session,
                turn=call.index + 1,
                api=self.config.api,
                expected_prompt_tokens=call.prompt_tokens,
                point=self.context.point,
                load=float(self.agents),
                **outcome_fields(outcome),
            ),
        )

    async def run(self, on_tick: Callable[[int], None]) -> LoadWindow:
        config = self.config
        await sleep_until(self.start_unix_s)
        self.start_ns = time.monotonic_ns()
        self.window_start_ns = self.start_ns + int(config.warmup_s * NS)
        self.planned_end_ns = self.window_start_ns + int(config.window_s * NS)
        async with LoopMonitor("runner") as monitor:
            await self.drive(None, on_tick, TICK_S)
        return await self.judged_window(self.window_start_ns, monitor, self.arm_session)
