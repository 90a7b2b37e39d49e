"""Ceilings that say what they assume, and an agent trace's shape: what ``kvbench trace stats`` adds for any trace.

**Ceilings.** The infinite-cache hit rate of a trace, at each block size B (tokens) that an engine or a
tier might cache at: the trace's own block size b, and each of 16, 64, 256, 512 that is a multiple of
b. Calls longer than ``max_context`` tokens are *excluded* (not truncated): an engine started with
``max-model-len`` N refuses a longer prompt outright, so it neither hits nor fills the cache.

* Block-hash traces (mooncake, kvbench, bailian, claude-code): a coarse block of B = k·b tokens is the
  tuple of its k fine ids (its identity); it is a hit only if the same tuple was seen before, i.e. all
  its fine blocks hit together. A call's hit tokens are the sizes of its longest prefix of blocks seen
  before, a block counting only up to the size it was seen in (a last partial block):

      hit(call) = Σ_{j < m} size_j + min(seen(m), size_m),  m = the first block not seen at its full size,
      token hit rate = Σ hit(call) / Σ input tokens;  block hit rate = Σ whole blocks hit / Σ blocks.

* Token traces: a call's hit is the longest common prefix of its token ids with any earlier prompt, in
  whole blocks of B: ``B · floor(LCP / B)`` (a prefix cache stores whole blocks only).
* Text traces: the same over the prompt's characters (``unit: characters``), since a trace without a
  tokenizer has no tokens; an engine's token ceiling is close to it (shared text tokenizes the same up
  to the last token before the point where prompts differ).

``tier_tokens``: the same at the trace's own block size with an LRU cache of that many tokens (blocks a
call touches become most recent; the least recent are evicted until the rest fit).

**Shape.** sessions, roots; depth (calls on the longest parent chain, a root is 1); children per call
(mean, max, calls with two or more); subagent and side shares; reuse distance of each call with a
parent: seconds since the parent arrived, and prompt tokens of the calls that arrived in between (what
an LRU cache must hold besides the parent's blocks for the child to hit).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .agent_trace import prompt_string_of
from .prefix_lru import PrefixLru
from .trace_model import Percentiles, Trace, TraceRequest, percentiles

COARSE_BLOCKS = (16, 64, 256, 512)
"""The block sizes a ceiling is re-blocked to where they divide: engine blocks (16), LMCache chunks (256), ..."""
Unit = Literal["tokens", "characters"]


@dataclass(frozen=True)
class BlockCeiling:
    block_tokens: int
    token_hit_rate: float | None
    """Hit tokens / prompt tokens (characters for a text trace)."""
    block_hit_rate: float | None
    """Whole blocks hit / blocks."""


@dataclass(frozen=True)
class Ceilings:
    unit: Unit
    basis: str
    """What a hit is computed from: hash ids, token ids or prompt characters."""
    max_context: int | None
    excluded_calls: int
    """Calls longer than max_context (refused by an engine with that max-model-len), left out of every rate."""
    by_block: tuple[BlockCeiling, ...]
    tier_tokens: int | None
    tier_hit_rate: float | None
    """LRU cache of tier_tokens at the trace's own block size (token-weighted)."""


@dataclass(frozen=True)
class Shape:
    calls: int
    sessions: int | None
    roots: int
    depth_max: int
    depth_mean: float
    children_mean: float
    children_max: int
    branching_calls: int
    """Calls with two or more children."""
    subagent_share: float
    side_share: float
    reuse_distance_s: Percentiles | None
    reuse_distance_tokens: Percentiles | None


Block = tuple[Hashable, int]
"""(identity, tokens) of one cache block."""


def _hash_blocks(request: TraceRequest, fine: int, factor: int) -> list[Block]:
    """The request's blocks of ``factor`` fine blocks: identity the tuple of fine ids (the id itself for one: the
    same equality, without a tuple per block in the cache), size their tokens."""
    assert request.hash_ids is not None
    sizes = request.block_sizes(fine)
    if factor == 1:
        return list(zip(request.hash_ids, sizes, strict=True))
    return [
        (tuple(request.hash_ids[start : start + factor]), sum(sizes[start : start + factor]))
        for start in range(0, len(request.hash_ids), factor)
    ]


def _sequence_blocks(sequence: Sequence[int], block: int) -> list[Block]:
    """Whole blocks of a token (or character) sequence, each identified by a digest of everything up to its end:
    two prompts share block k exactly when their first (k+1)·block items are equal."""
    out: list[Block] = []
    digest = hashlib.blake2b(digest_size=16)
    for start in range(0, len(sequence) - block + 1, block):
        digest.update(b"".join(item.to_bytes(4, "little") for item in sequence[start : start + block]))
        out.append((digest.copy().digest(), block))
    return out


def prompt_characters(request: TraceRequest) -> list[int]:
    """A text trace's prompt as code points (messages joined as in :func:`~workloads.agent_trace.prompt_string_of`)."""
    text = request.text if request.text is not None else prompt_string_of(request.messages or ())
    return [ord(char) for char in text]


def _length(request: TraceRequest, unit: Unit) -> int:
    return len(prompt_characters(request)) if unit == "characters" else request.input_length


def _blocks(request: TraceRequest, trace: Trace, block: int, unit: Unit) -> list[Block]:
    if request.hash_ids is not None:
        return _hash_blocks(request, trace.block_tokens, block // trace.block_tokens)
    if request.token_ids is not None:
        return _sequence_blocks(request.token_ids, block)
    return _sequence_blocks(prompt_characters(request), block)


def _replay_cache(
    calls: Iterable[tuple[list[Block], int]], block: int, capacity: int | None
) -> tuple[int, int, int, int]:
    """(hit tokens, hit blocks, tokens, blocks) of calls ``(blocks, prompt length)`` through a prefix cache of
    ``capacity`` tokens (None: infinite), LRU; a prompt has ceil(length / block) blocks, whole or not. ``calls``
    is read once, as it comes: one call's blocks in memory at a time besides the cache."""
    cache = PrefixLru(capacity)
    hit_tokens = hit_blocks = tokens = blocks = 0
    for call_blocks, length in calls:
        tokens += length
        blocks += -(-length // block)
        hit = cache.visit(call_blocks)
        hit_tokens += hit[0]
        hit_blocks += hit[1]
    return hit_tokens, hit_blocks, tokens, blocks


def block_sizes(trace: Trace) -> tuple[int, ...]:
    """The trace's own block size and every coarser one of :data:`COARSE_BLOCKS` it divides."""
    own = trace.block_tokens
    return tuple(sorted({own, *(size for size in COARSE_BLOCKS if size > own and size % own == 0)}))


def trace_unit(trace: Trace) -> Unit:
    hashed = any(r.hash_ids is not None or r.token_ids is not None for r in trace.requests)
    return "tokens" if hashed or not trace.requests else "characters"


def ceilings(trace: Trace, *, max_context: int | None = None, tier_tokens: int | None = None) -> Ceilings:
    """The trace's ceilings (see the module docstring); None rates where no call carries a prompt structure."""
    unit = trace_unit(trace)
    kept = [r for r in trace.requests if max_context is None or r.input_length <= max_context]
    structured = [r for r in kept if r.hash_ids is not None or r.token_ids is not None or unit == "characters"]
    by_block: list[BlockCeiling] = []
    for size in block_sizes(trace):
        calls = ((_blocks(r, trace, size, unit), _length(r, unit)) for r in structured)
        hit_tokens, hit_blocks, tokens, blocks = _replay_cache(calls, size, None)
        by_block.append(
            BlockCeiling(size, hit_tokens / tokens if tokens else None, hit_blocks / blocks if blocks else None)
        )
    tier: float | None = None
    if tier_tokens is not None:
        calls = ((_blocks(r, trace, trace.block_tokens, unit), _length(r, unit)) for r in structured)
        hit_tokens, _, tokens, _ = _replay_cache(calls, trace.block_tokens, tier_tokens)
        tier = hit_tokens / tokens if tokens else None
    basis = (
        "hash ids"
        if any(r.hash_ids is not None for r in kept)
        else ("token ids" if unit == "tokens" else "prompt characters")
    )
    return Ceilings(
        unit=unit,
        basis=basis,
        max_context=max_context,
        excluded_calls=len(trace.requests) - len(kept),
        by_block=tuple(by_block),
        tier_tokens=tier_tokens,
        tier_hit_rate=tier,
    )


def own_block_hit_rate(trace: Trace) -> float | None:
    """The token-weighted infinite-cache hit rate at the trace's own block size, no context cap."""
    return ceilings(trace).by_block[0].token_hit_rate if trace.requests else None


def shape(trace: Trace) -> Shape:
    requests = trace.requests
    count = len(requests)
    children = [0] * count
    depth = [1] * count
    for index, request in enumerate(requests):
        if request.parent is not None:
            children[request.parent] += 1
            depth[index] = depth[request.parent] + 1
    # prompt tokens arrived before each position, to sum the tokens between a parent and its child
    before = [0]
    for request in requests:
        before.append(before[-1] + request.input_length)
    seconds: list[float] = []
    tokens: list[float] = []
    for index, request in enumerate(requests):
        if request.parent is not None:
            seconds.append((request.timestamp_ms - requests[request.parent].timestamp_ms) / 1000.0)
            tokens.append(float(before[index] - before[request.parent + 1]))
    sessions = {r.session for r in requests if r.session is not None}
    return Shape(
        calls=count,
        sessions=len(sessions) if sessions else None,
        roots=sum(1 for r in requests if r.parent is None),
        depth_max=max(depth, default=0),
        depth_mean=sum(depth) / count if count else 0.0,
        children_mean=sum(children) / count if count else 0.0,
        children_max=max(children, default=0),
        branching_calls=sum(1 for c in children if c >= 2),
        subagent_share=sum(1 for r in requests if r.call_type == "subagent") / count if count else 0.0,
        side_share=sum(1 for r in requests if r.call_type == "side") / count if count else 0.0,
        reuse_distance_s=percentiles(seconds) if seconds else None,
        reuse_distance_tokens=percentiles(tokens) if tokens else None,
    )
