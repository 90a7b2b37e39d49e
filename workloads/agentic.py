"""Agent sessions (workload kind ``agentic``), synthesized or from an agent trace, and their infinite-cache ceiling.

A session (:class:`AgentSessionPlan`) is a causal tree of calls, stored as branches (chains of calls; a branch
other than the first forks after one call of another): a call's parent is the previous call of its branch, or
the call its branch forks after. A call is sent once its parent has answered, after the call's ``pause_s``.

**Synthesized** sessions are drawn deterministically from ``(seed, session id)`` with the distributions of
:class:`~workloads.config.AgenticSessions`:

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

**Trace** sessions (``trace:``, :class:`TraceSessions`): session ``s`` is the trace's session ``k = s mod N``
(``N`` sessions in the trace, in first-appearance order) in cycle ``c = s // N``. Its calls keep their trace
order (index ``i``, ``turn = i + 1``), parents, hash blocks and ``block_tokens``; ``output_tokens =
max(1, output_length)``; a call without a parent other than the session's first waits for the session's
previous call. A call is due ``max(0, t_call − t_parent)`` seconds of the trace's clock after its parent was
*sent*, or at the parent's answer if that comes later (``gap_from_send``; as ``kvbench replay`` sends a child):
a trace records when calls were sent, not when they were answered, so the gap already holds the traced
deployment's service time and is not added on top of the measured one. Prompts are
whole blocks (``B × blocks`` tokens, the last block rounded up). Hash ids become integers: the ``n``-th
distinct id of the trace (first appearance) is ``n`` when more than one trace session sends it (a shared
system prompt or repository context), and ``(c + 1) · 2^32 + n`` when only one does, so a session replayed in
a later cycle does not hit its own earlier replay's private blocks. A call longer than ``max_context_tokens``
is dropped with its subtree.

Ceiling: with an infinite prefix cache, call ``c`` hits its longest prefix of blocks already sent
(by any earlier call, in send order): ``hit_c = B · #{leading blocks of c seen before}``, and the
ceiling of a sequence of calls is ``Σ hit_c / Σ prompt_c`` (:func:`infinite_cache_hits`; prompt
tokens = ``B`` × blocks, so the rate is a block-count ratio).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from common.errors import KvbenchError

from .config import AgenticSessions, AgentTraceSource
from .multi_user import sample, stream
from .trace import HashId, Trace, TraceRequest, load_trace, resolve_trace_path

SESSION_STRIDE = 1 << 32
"""Hash ids of session ``s`` start at ``(s + 1) × SESSION_STRIDE``; the root's are below it (synthesized). A trace's
private blocks of cycle ``c`` are ``(c + 1) × SESSION_STRIDE + n``, its shared ones ``n``."""
HASH_FORMATS = ("mooncake", "kvbench", "bailian", "claude-code")
"""Trace formats whose calls carry hash blocks, the only ones an agentic sweep can replay."""
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
    """Seconds after the parent call's answer before this call is sent (``gap_from_send``: after its send)."""
    gap_from_send: bool = False
    """``pause_s`` is a trace's gap between the parent's and this call's timestamps: the call is due at the
    parent's send + ``pause_s`` or at the parent's answer, whichever is later (as ``kvbench replay`` sends it)."""

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
    """The index of the call whose answer starts this branch (None: a root branch). Synthesized: a main-branch
    call, whose index is its step."""
    calls: tuple[AgentCall, ...]


@dataclass(frozen=True)
class AgentSessionPlan:
    """A session's calls as a causal tree: :attr:`parents` and :meth:`children` are what a driver follows."""

    session: int
    branches: tuple[AgentBranch, ...]

    @cached_property
    def calls(self) -> tuple[AgentCall, ...]:
        """Every call, in index order."""
        return tuple(sorted((call for branch in self.branches for call in branch.calls), key=lambda c: c.index))

    def call(self, index: int) -> AgentCall:
        return self.calls[index]

    def forks_after(self, step: int) -> list[AgentBranch]:
        return [branch for branch in self.branches if branch.fork_after == step]

    @cached_property
    def parents(self) -> tuple[int | None, ...]:
        """Per call index, the index of the call it waits for (None: a root, sent when the session starts)."""
        out: list[int | None] = [None] * len(self.calls)
        for branch in self.branches:
            previous = branch.fork_after
            for call in branch.calls:
                out[call.index] = previous
                previous = call.index
        return tuple(out)

    @cached_property
    def _children(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.calls]
        for index, parent in enumerate(self.parents):
            if parent is not None:
                out[parent].append(index)
        return tuple(tuple(children) for children in out)

    @property
    def roots(self) -> tuple[int, ...]:
        return tuple(index for index, parent in enumerate(self.parents) if parent is None)

    def children(self, index: int) -> tuple[int, ...]:
        """The calls sent after call ``index``'s answer, in index order (synthesized: the main branch's next call
        first, then the subagents forking there)."""
        return self._children[index]


def _blocks(tokens: float, block_tokens: int) -> int:
    return max(1, math.ceil(tokens / block_tokens))


class AgentSessions:
    """Deterministic session plans of one ``agentic`` workload: session ``s`` is the same on every arm and run."""

    def __init__(self, config: AgenticSessions, *, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.trace = None if config.trace is None else TraceSessions.load(config.trace)
        root = 0 if self.trace is not None else math.ceil(config.system_prompt_tokens / config.block_tokens)
        self.root = tuple(range(root))
        self._plans: dict[int, AgentSessionPlan] = {}

    @property
    def block_tokens(self) -> int:
        """Tokens per hash block of every call (the trace's, with one)."""
        return self.trace.block_tokens if self.trace is not None else self.config.block_tokens

    def plan(self, session: int) -> AgentSessionPlan:
        cached = self._plans.get(session)
        if cached is None:
            if self.trace is not None:
                plan = self.trace.plan(session, self.config.max_context_tokens)
            else:
                plan = self._draw(session)
            cached = self._plans[session] = plan
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


@dataclass(frozen=True)
class _TraceSession:
    requests: tuple[TraceRequest, ...]
    parents: tuple[int | None, ...]
    """Per call, the session-local index of its parent."""


class TraceSessions:
    """An agent trace's sessions as plans (see the module docstring for the mapping)."""

    def __init__(self, trace: Trace) -> None:
        if trace.format not in HASH_FORMATS:
            raise KvbenchError(
                f"{trace.path}: a {trace.format} trace has no hash blocks; agentic sessions need one of the "
                f"formats {', '.join(HASH_FORMATS)}"
            )
        missing = next((r for r in trace.requests if r.hash_ids is None), None)
        if missing is not None:
            raise KvbenchError(
                f"{trace.path}:{missing.line}: a call without hash_ids; agentic sessions need one of the "
                f"formats {', '.join(HASH_FORMATS)} with hash ids on every call"
            )
        self.path = trace.path
        self.block_tokens = trace.block_tokens
        self.sessions = _sessions(trace.requests)
        self.numbers: dict[HashId, int] = {}
        owners: dict[HashId, int] = {}
        self.shared: set[HashId] = set()
        for k, session in enumerate(self.sessions):
            for request in session.requests:
                for block in request.hash_ids or ():
                    self.numbers.setdefault(block, len(self.numbers))
                    if owners.setdefault(block, k) != k:
                        self.shared.add(block)

    @classmethod
    def load(cls, source: AgentTraceSource) -> TraceSessions:
        return cls(load_trace(resolve_trace_path(source.path), source.format, allow_gaps=True))

    def block(self, block: HashId, cycle: int) -> int:
        number = self.numbers[block]
        return number if block in self.shared else (cycle + 1) * SESSION_STRIDE + number

    def plan(self, session: int, max_context_tokens: int | None) -> AgentSessionPlan:
        """Trace session ``session mod N`` in cycle ``session // N``, calls over ``max_context_tokens`` and their
        subtrees dropped (the kept calls are re-indexed in trace order)."""
        cycle, k = divmod(session, len(self.sessions))
        source, size = self.sessions[k], self.block_tokens
        kept: dict[int, int] = {}  # session-local index -> plan index
        calls: list[AgentCall] = []
        parents: list[int | None] = []
        for local, (request, parent) in enumerate(zip(source.requests, source.parents, strict=True)):
            assert request.hash_ids is not None
            blocks = tuple(self.block(block, cycle) for block in request.hash_ids)
            if parent is not None and parent not in kept:
                continue
            if max_context_tokens is not None and len(blocks) * size > max_context_tokens:
                continue
            pause = 0.0
            if parent is not None:
                pause = max(0.0, (request.timestamp_ms - source.requests[parent].timestamp_ms) / 1000.0)
            kept[local] = len(calls)
            parents.append(None if parent is None else kept[parent])
            output = max(1, request.output_length)
            calls.append(AgentCall(session, len(calls), 0, 0, blocks, size, output, pause, gap_from_send=True))
        return AgentSessionPlan(session, _branches(calls, parents))


def _sessions(requests: Sequence[TraceRequest]) -> list[_TraceSession]:
    """The trace's sessions in first-appearance order; a request without a session is a session of its own, a
    parentless call after a session's first waits for the session's previous call."""
    grouped: dict[str, list[int]] = {}
    for position, request in enumerate(requests):
        key = f"session:{request.session}" if request.session is not None else f"request:{position}"
        grouped.setdefault(key, []).append(position)
    out: list[_TraceSession] = []
    for positions in grouped.values():
        local = {position: index for index, position in enumerate(positions)}
        parents: list[int | None] = []
        for index, position in enumerate(positions):
            parent = requests[position].parent
            if parent is not None and parent in local:
                parents.append(local[parent])
            else:
                parents.append(index - 1 if index > 0 else None)
        out.append(_TraceSession(tuple(requests[p] for p in positions), tuple(parents)))
    return out


def _branches(calls: list[AgentCall], parents: list[int | None]) -> tuple[AgentBranch, ...]:
    """``calls`` (in index order) grouped into branches: a call's first child continues its branch, every
    other child (and every root) starts a new one forking after its parent."""
    branch_of: list[int] = []
    members: list[list[AgentCall]] = []
    forks: list[int | None] = []
    continued: set[int] = set()
    for call, parent in zip(calls, parents, strict=True):
        if parent is not None and parent not in continued:
            continued.add(parent)
            number = branch_of[parent]
        else:
            number = len(members)
            members.append([])
            forks.append(parent)
        branch_of.append(number)
        placed = AgentCall(
            call.session,
            call.index,
            number,
            len(members[number]),
            call.blocks,
            call.block_tokens,
            call.output_tokens,
            call.pause_s,
            call.gap_from_send,
        )
        members[number].append(placed)
    return tuple(AgentBranch(n, forks[n], tuple(chain)) for n, chain in enumerate(members))


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
