"""Synthesized agent sessions (workload kind ``agentic``) and their infinite-cache ceiling.

A session (:class:`AgentSessionPlan`) is a tree of branches of calls, drawn deterministically from
``(seed, session id)`` with the distributions of :class:`~workloads.config.AgenticSessions`:

* the **root prefix**: ``⌈system_prompt_tokens / B⌉`` blocks (``B`` = ``block_tokens``) with the same
  hash ids in every session (the system prompt and tool definitions every agent of a deployment sends);
* the **main branch**: call 1 sends root + ``⌈task / B⌉`` new blocks; call ``k > 1`` resends the whole
  previous prompt plus ``⌈(answer_{k−1} + tool_result_k) / B⌉`` new blocks, after ``tool_time_s``;
* a **subagent** forks, with probability ``subagent_probability``, after a main-branch call: its first
  call resends the main branch's prompt at the fork plus its own task blocks, then grows the same way
  and runs concurrently with the main branch (which does not wait for it);
* a branch ends after its drawn call count, or before a prompt would exceed ``max_context_tokens``.

The previous answer is resent as *new* blocks: a synthesized session cannot know the model's text,
so (as in a Mooncake replay) the engine's decode KV is never reused. Hash ids are integers: the
root's are ``0 … R−1``, a session's own are ``(session + 1) · 2^32 + n``, so no two sessions share
a block outside the root.

Ceiling: with an infinite prefix cache, call ``c`` hits its longest prefix of blocks already sent
(by any earlier call, in send order): ``hit_c = B · #{leading blocks of c seen before}``, and the
ceiling of a sequence of calls is ``Σ hit_c / Σ prompt_c`` (:func:`infinite_cache_hits`; prompt
tokens = ``B`` × blocks, so the rate is a block-count ratio).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .config import AgenticSessions
from .multi_user import sample, stream
from .trace import TraceRequest

SESSION_STRIDE = 1 << 32
"""Hash ids of session ``s`` start at ``(s + 1) × SESSION_STRIDE``; the root's are below it."""
MAIN = 0
"""The main branch's number; subagents are 1, 2, ..."""


@dataclass(frozen=True)
class AgentCall:
    """One call of a session: the prompt's hash blocks, the answer's max_tokens, the pause before it."""

    session: int
    index: int
    """0-based position in the session's plan (main branch first, then each subagent); ``turn`` = index + 1."""
    branch: int
    step: int
    """0-based position within its branch."""
    blocks: tuple[int, ...]
    block_tokens: int
    output_tokens: int
    pause_s: float
    """Seconds after the branch's previous answer (or the fork) before this call is sent."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.blocks) * self.block_tokens

    def trace_request(self) -> TraceRequest:
        """The call as a hash-block trace request (prompts are built as a trace replay builds them)."""
        return TraceRequest(
            line=self.index + 1,
            timestamp_ms=0.0,
            input_length=self.prompt_tokens,
            output_length=self.output_tokens,
            hash_ids=self.blocks,
            session=str(self.session),
            turn=self.step + 1,
            call_type="normal" if self.branch == MAIN else "subagent",
        )


@dataclass(frozen=True)
class AgentBranch:
    branch: int
    fork_after: int | None
    """The main-branch step whose answer starts this branch (None: the main branch)."""
    calls: tuple[AgentCall, ...]


@dataclass(frozen=True)
class AgentSessionPlan:
    session: int
    branches: tuple[AgentBranch, ...]

    @property
    def calls(self) -> tuple[AgentCall, ...]:
        return tuple(call for branch in self.branches for call in branch.calls)

    def call(self, index: int) -> AgentCall:
        return self.calls[index]

    def forks_after(self, step: int) -> list[AgentBranch]:
        return [branch for branch in self.branches if branch.fork_after == step]


def _blocks(tokens: float, block_tokens: int) -> int:
    return max(1, math.ceil(tokens / block_tokens))


class AgentSessions:
    """Deterministic session plans of one ``agentic`` workload: session ``s`` is the same on every arm and run."""

    def __init__(self, config: AgenticSessions, *, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.root = tuple(range(math.ceil(config.system_prompt_tokens / config.block_tokens)))
        self._plans: dict[int, AgentSessionPlan] = {}

    def plan(self, session: int) -> AgentSessionPlan:
        cached = self._plans.get(session)
        if cached is None:
            cached = self._plans[session] = self._draw(session)
        return cached

    def _draw(self, session: int) -> AgentSessionPlan:
        config, size = self.config, self.config.block_tokens
        rng = stream(self.seed, "agentic", session)
        counter = (session + 1) * SESSION_STRIDE
        limit = config.max_context_tokens

        def fresh(count: int) -> tuple[int, ...]:
            nonlocal counter
            ids = tuple(range(counter, counter + count))
            counter += count
            return ids

        def chain(branch: int, start: tuple[int, ...], calls: int, first_index: int) -> list[AgentCall]:
            out: list[AgentCall] = []
            context = start + fresh(_blocks(sample(config.task_tokens, rng, integer=True), size))
            answer = 0
            for step in range(calls):
                if step > 0:
                    added = answer + sample(config.tool_result_tokens, rng, integer=True)
                    context = context + fresh(_blocks(added, size))
                pause = sample(config.tool_time_s, rng, integer=False) if step > 0 else 0.0
                answer = int(sample(config.output_tokens, rng, integer=True, minimum=1))
                if limit is not None and len(context) * size > limit:
                    break
                out.append(AgentCall(session, first_index + step, branch, step, context, size, answer, pause))
            return out

        main = chain(MAIN, self.root, int(sample(config.calls, rng, integer=True, minimum=1)), 0)
        branches = [AgentBranch(MAIN, None, tuple(main))]
        index = len(main)
        for call in main:
            if config.subagent_probability > 0 and rng.random() < config.subagent_probability:
                count = int(sample(config.subagent_calls, rng, integer=True, minimum=1))
                sub = chain(len(branches), call.blocks, count, index)
                if sub:
                    branches.append(AgentBranch(len(branches), call.step, tuple(sub)))
                    index += len(sub)
        return AgentSessionPlan(session, tuple(branches))


def infinite_cache_hits(calls: Iterable[AgentCall], seen: set[int] | None = None) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of ``calls`` in send order with an infinite prefix cache that already holds
    ``seen`` (updated in place): each call hits its longest prefix of blocks sent before."""
    cache = seen if seen is not None else set()
    hits = total = 0
    for call in calls:
        total += call.prompt_tokens
        prefix = 0
        for block in call.blocks:
            if block not in cache:
                break
            prefix += 1
        hits += prefix * call.block_tokens
        cache.update(call.blocks)
    return hits, total


def ceiling(calls: Iterable[AgentCall]) -> float | None:
    """The infinite-cache hit rate of ``calls`` sent in this order (None without prompt tokens)."""
    hits, total = infinite_cache_hits(calls)
    return hits / total if total else None
