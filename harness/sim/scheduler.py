"""Continuous batching for the simulator: which tokens run in each step, and when steps end.

:class:`EngineCore` is a pure state machine in the style of vLLM's V1 scheduler. Every step it

1. walks the running requests in admission order: a request still prefilling gets the next chunk
   of its prompt (as much as the step's token budget ``max_batch_tokens`` allows), a decoding
   request gets one token -- and a new KV block when it crosses a block boundary; if none is
   left, the most recently admitted request is preempted (its blocks freed; it is recomputed
   later, as vLLM's recompute preemption does);
2. admits waiting requests first come, first served, while budget, ``max_num_seqs`` and blocks
   allow. Admission looks the prompt up in the HBM prefix cache, then looks the rest up in the
   offload tiers; a tier hit puts the request into a *loading* state until its chunks are in HBM,
   and only then does its prefill of the remaining tokens start. The offload profile's
   ``load_overlap`` changes that: ``layerwise`` lets the prefill start ``load/L + (L-1)/L x
   max(load - compute, 0)`` seconds after the load starts (an ``L``-layer pipeline, ``compute``
   the unloaded prefill of the remaining tokens); ``bidirectional`` (Cake) recomputes the head of
   the cached prefix, up to the chunk boundary that minimises ``max(compute(head), load(tail))``,
   while its tail loads. All blocks of the prompt are allocated at admission (a request that does
   not fit waits: ``num_requests_waiting``).

A calibrated engine holds a request back for its per-request overhead before it can be admitted,
and charges the overhead's engine-blocking share (``Calibration.engine_blocking_share``: prompt
hashing and connector lookups in the engine's own process) to the first step that starts after the
request arrived, less the time the engine was idle since (:meth:`EngineCore._charge_intake`): it
delays every running request's next token, not the arriving request's own first token. A request
that arrives while requests are running also adds its offload backend's ``busy_intake_s`` to that
charge (the backend's lookups and store scheduling beside the running requests).

:meth:`EngineCore.plan` returns the step and its modelled duration; :meth:`EngineCore.complete`
applies it at the step's end time: KV is now computed, full blocks enter the prefix cache, first
and next tokens are sampled and handed to each request's sink, finished requests are written to
the offload tiers and release their blocks. Times are passed in, never read, so tests can drive
the core on a virtual clock.

:class:`EngineLoop` drives the core in real time on asyncio: plan, sleep until the step's end,
complete. Step start times chain from the previous step's end, so the loop's own bookkeeping does
not add to the modelled time.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from offload.shapes import Deployment

from .kvcache import ROOT_HASH, Block, BlockPool, OffloadTiers, StoredPrefix, chain_hashes
from .settings import SimSettings
from .shared_tier import DirectoryChunks
from .timemodel import StepWork, TimeModel
from .tokenizer import GENERATED_FIRST_IDS, GENERATED_NEXT_IDS, token_text

logger = logging.getLogger(__name__)

TTFT_BUCKETS: tuple[float, ...] = (
    # vLLM's buckets for vllm:time_to_first_token_seconds
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    # vLLM's buckets for its per-request phase histograms (vllm:request_queue_time_seconds, ..._prefill_time_...)
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


@dataclass
class Histogram:
    """A Prometheus histogram's state: observations per bucket (not cumulative), their count and sum (s)."""

    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = [0] * len(self.bounds)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        for index, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.buckets[index] += 1
                break


class Phase(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str


@dataclass(frozen=True)
class FinishEvent:
    reason: str
    usage: Usage


@dataclass(frozen=True)
class ErrorEvent:
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent
Sink = Callable[[Event], None]


def ignore_event(event: Event) -> None:
    """The sink of a request whose stream nobody reads (its times are read off the request afterwards)."""
    del event


class SimRequest:
    """One request inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached_tokens",
        "chunk_keys",
        "external_tokens",
        "first_scheduled_at",
        "first_token_at",
        "hashes",
        "hbm_hit_tokens",
        "intake_from",
        "intake_s",
        "load_from",
        "load_ready_at",
        "load_to",
        "max_tokens",
        "num_computed",
        "outputs",
        "phase",
        "prefill_target",
        "prompt_tokens",
        "received_at",
        "registered",
        "remote_tokens",
        "request_id",
        "rng",
        "schedulable_at",
        "sink",
        "tokens",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        sink: Sink,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        self.request_id = request_id
        self.tokens = list(prompt_ids)
        """Prompt ids followed by the ids generated so far."""
        self.prompt_tokens = len(prompt_ids)
        self.max_tokens = max_tokens
        self.sink = sink
        # Greedy (temperature 0) output depends only on the prompt; sampled output on the seed.
        if temperature <= 0:
            self.rng = random.Random(hash(tuple(prompt_ids[-256:])) ^ len(prompt_ids))
        else:
            self.rng = random.Random(seed)
        self.phase = Phase.WAITING
        self.arrival = 0.0
        self.received_at: float | None = None
        """When the server received the request (monotonic s); None: when it was submitted."""
        self.schedulable_at = 0.0
        """Arrival plus the calibrated per-request overhead: not admitted before."""
        self.intake_s = 0.0
        """Engine-blocking share of that overhead not yet charged to a step (seconds)."""
        self.intake_from = 0.0
        """When that engine work started: when the server received the request."""
        self.first_scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.num_computed = 0
        """Tokens whose KV is in HBM."""
        self.prefill_target = 0
        """Tokens to compute before the next token is sampled (set at admission)."""
        self.outputs = 0
        self.blocks: list[Block] = []
        self.registered = 0
        """Leading blocks already offered to the prefix cache."""
        self.hashes: list[int] = []
        self.chunk_keys: list[int] = []
        self.hbm_hit_tokens = 0
        self.external_tokens = 0
        self.cached_tokens: int | None = None
        self.load_ready_at = 0.0
        """When the tokens ``[load_from, load_to)`` being loaded from a tier are in HBM."""
        self.load_from = 0
        self.load_to = 0
        self.remote_tokens = 0
        """Leading prompt tokens whose KV came with the request from a prefill engine (P/D decode side,
        :mod:`harness.sim.disagg`): computed at admission, like a prefix-cache hit. 0: colocated."""

    @property
    def awaiting_load(self) -> bool:
        """Part of the prompt is on its way from an offload tier."""
        return self.load_to > self.load_from

    @property
    def compute_limit(self) -> int:
        """Where prefill must pause: the start of a pending load, else the end of the prompt."""
        return self.load_from if self.awaiting_load else self.prefill_target

    def land_load(self) -> None:
        """The pending load is in HBM: its tokens count as computed."""
        self.num_computed = max(self.num_computed, self.load_to)
        self.load_from = self.load_to = 0

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_target

    def next_token(self) -> int:
        pool = GENERATED_FIRST_IDS if self.outputs == 0 else GENERATED_NEXT_IDS
        return pool[self.rng.randrange(len(pool))]

    def block_hashes(self, block_tokens: int, tokens: int) -> list[int]:
        """Hashes of the full blocks among the first ``tokens`` tokens (extended as needed)."""
        have = len(self.hashes)
        if have < tokens // block_tokens:
            parent = self.hashes[-1] if self.hashes else ROOT_HASH
            self.hashes.extend(chain_hashes(self.tokens[:tokens], block_tokens, have * block_tokens, parent))
        return self.hashes

    def offload_keys(self, tiers: OffloadTiers, tokens: int) -> list[int]:
        have = len(self.chunk_keys)
        if have < tokens // tiers.chunk_tokens:
            parent = self.chunk_keys[-1] if self.chunk_keys else ROOT_HASH
            self.chunk_keys.extend(tiers.chunk_hashes(self.tokens[:tokens], have * tiers.chunk_tokens, parent))
        return self.chunk_keys[: tokens // tiers.chunk_tokens]


@dataclass
class Stats:
    """Counters behind ``/metrics`` (token counts, like vLLM's)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    tier_hits: dict[str, int] = field(default_factory=dict)
    """Tokens loaded per tier kind (fleets: own tier vs the shared tier)."""
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    """Arrival (the engine core taking the request, after the server parsed and tokenized it) to the first token."""
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    """Arrival to the first scheduling: the calibrated request overhead and any wait for a place in a batch."""
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS))
    """First scheduling to the first token: tier loads and prefill steps."""


@dataclass
class Plan:
    """One step: what runs, the work it does and how long it takes."""

    prefills: list[tuple[SimRequest, int]]
    decodes: list[SimRequest]
    work: StepWork
    seconds: float


class EngineCore:
    """The simulated engine's state: queues, KV cache, tiers and counters."""

    def __init__(self, settings: SimSettings, shared_chunks: OrderedDict[int, float] | None = None) -> None:
        """``shared_chunks``: the fleet's shared-tier index (:class:`OffloadTiers`); default: the
        directory ``settings.shared_tier_dir`` names, if any."""
        self.settings = settings
        if shared_chunks is None and settings.shared_tier_dir:
            shared_chunks = DirectoryChunks(Path(settings.shared_tier_dir))
        self.deployment: Deployment = settings.deployment()
        self.time_model = TimeModel(self.deployment, settings.efficiencies())
        kv_tokens = self.deployment.kv_cache_tokens(settings.gpu_memory_utilization, settings.max_batch_tokens)
        self.block_tokens = settings.block_tokens
        num_blocks = settings.num_gpu_blocks_override or kv_tokens // settings.block_tokens
        self.pool = BlockPool(num_blocks, settings.block_tokens, settings.hbm_prefix_caching)
        self.pool.on_evict = self._offload_evicted
        self.kv_cache_tokens = self.pool.num_blocks * settings.block_tokens
        limit = min(self.deployment.model.max_position_embeddings, self.kv_cache_tokens)
        self.max_model_len = min(settings.max_model_len, limit) if settings.max_model_len else limit
        # a calibrated load rate is the effective end-to-end one, host link included: no second cap
        link = self.deployment.hardware.host_link_bytes_per_s * self.deployment.tp
        self.tiers = OffloadTiers(
            settings.tier_profile(),
            self.deployment.kv_bytes_per_token,
            link if settings.calibration is None else float("inf"),
            instant_writes=settings.calibration is not None,
            shared_chunks=shared_chunks,
        )
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = Stats()
        self._now = 0.0
        self._last_end = -math.inf
        """When the last step ended (the engine is idle from then until the next step starts)."""
        self._intake: list[SimRequest] = []
        """Requests whose engine-blocking intake work is not yet charged to a step."""
        # hash of the HBM block holding the end of an offload chunk -> that chunk's key, for the
        # write-on-eviction path (filled when requests finish, emptied by eviction and reset)
        self._chunk_of_block: dict[int, int] = {}

    # -- requests ---------------------------------------------------------------------------

    def check_fits(self, request: SimRequest) -> None:
        """ValueError (vLLM's message) if the prompt and the output it asks for exceed ``max_model_len``."""
        total = request.prompt_tokens + request.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request "
                f"has {request.prompt_tokens} prompt tokens and asks for {request.max_tokens} output tokens"
            )

    def add_request(self, request: SimRequest, now: float) -> None:
        self.check_fits(request)
        request.arrival = now
        # a calibrated engine spends this long on a request before scheduling it (HTTP, tokenising);
        # counted from when the server received it, so the simulator's own Python time is part of it
        received = request.received_at if request.received_at is not None else now
        request.schedulable_at = received + self.settings.request_overhead_s(request.prompt_tokens)
        # the backend's per-request intake stalls running requests only: none when the engine was idle
        request.intake_s = self.settings.request_intake_s(request.prompt_tokens, busy=bool(self.running))
        request.intake_from = received
        if request.intake_s > 0:
            self._intake.append(request)
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Stop a request whose client went away (no tier write, blocks released)."""
        if request.phase in (Phase.FINISHED, Phase.ABORTED):
            return
        if request.phase is Phase.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
            self.pool.release(request.blocks)
            request.blocks = []
        request.phase = Phase.ABORTED
        self.stats.aborted += 1

    def fail_all(self, message: str) -> None:
        """Fail every request (the engine loop died)."""
        for request in [*self.running, *self.waiting]:
            request.sink(ErrorEvent(message))
            self.abort(request)

    def reset_prefix_cache(self) -> int:
        self._chunk_of_block.clear()
        return self.pool.reset()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def overdue_since(self, now: float) -> float | None:
        """When work that is due by ``now`` became runnable, if the idle engine loop woke up after it.

        A tier load that finished before the loop woke (its timer fires late on a busy host) is due
        at its end. On calibrated engines a waiting request is also due once its per-request overhead
        has passed: that overhead already stands for the server's HTTP and tokenising time, so when
        the simulator's own Python took longer, the request's first step starts at that moment
        instead of now and the time is not counted twice.
        """
        due = [r.load_ready_at for r in self.running if r.phase is Phase.LOADING and r.load_ready_at < now]
        if self.settings.calibration is not None and self.waiting and self.waiting[0].schedulable_at < now:
            due.append(self.waiting[0].schedulable_at)
        return min(due) if due else None

    def next_wakeup(self) -> float | None:
        """When the earliest loading request has its KV in HBM, or the first waiting request becomes
        schedulable after its calibrated overhead (None if neither)."""
        times = [r.load_ready_at for r in self.running if r.phase is Phase.LOADING]
        if self.waiting and self.waiting[0].schedulable_at > self._now:
            times.append(self.waiting[0].schedulable_at)
        return min(times) if times else None

    # -- one step ---------------------------------------------------------------------------

    def plan(self, now: float) -> Plan | None:
        """The next step starting at ``now``, or None if nothing can run yet."""
        self._now = now
        budget = self.settings.max_batch_tokens
        work = StepWork()
        prefills: list[tuple[SimRequest, int]] = []
        decodes: list[SimRequest] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            index += 1
            if request.phase is Phase.LOADING or (request.awaiting_load and request.num_computed >= request.load_from):
                if request.load_ready_at > now:
                    request.phase = Phase.LOADING  # (bidirectional: the head is computed, the tail not in yet)
                    continue
                request.land_load()
                request.phase = Phase.RUNNING
            if request.prefilling:
                budget -= self._add_prefill_chunk(request, budget, work, prefills)
            else:
                if not self._grow(request, request.num_computed + 1):
                    break  # the request preempted itself: nothing after it is running
                work.add_decode(request.num_computed)
                decodes.append(request)
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < self.settings.max_num_seqs:
            request = self.waiting[0]
            if not self._admit(request, now):
                break
            self.waiting.popleft()
            self.running.append(request)
            if request.first_scheduled_at is None:
                request.first_scheduled_at = now
                self.stats.queue.observe(max(0.0, now - request.arrival))
            if request.phase is Phase.LOADING:
                continue
            budget -= self._add_prefill_chunk(request, budget, work, prefills)
        if not prefills and not decodes:
            return None
        work.intake_s = self._charge_intake(now)
        return Plan(prefills, decodes, work, self.time_model.step_seconds(work))

    def complete(self, plan: Plan, end: float) -> None:
        """Apply a planned step that ended at ``end``."""
        self._now = end
        self._last_end = end
        self.stats.steps += 1
        self.stats.busy_s += plan.seconds
        for request, chunk in plan.prefills:
            if request.phase is not Phase.RUNNING:
                continue  # aborted while the step ran
            request.num_computed += chunk
            self._register(request)
            if not request.prefilling:
                if request.first_token_at is None:
                    self.stats.prompt_tokens += request.prompt_tokens
                self._sample(request, end)
        for request in plan.decodes:
            if request.phase is not Phase.RUNNING:
                continue
            request.num_computed += 1
            self._register(request)
            self._sample(request, end)

    # -- internals --------------------------------------------------------------------------

    def _charge_intake(self, now: float) -> float:
        """Seconds of intake work that stall the step starting at ``now`` (calibrated engines only).

        Every request that arrived by ``now`` and whose intake is not yet charged adds its
        engine-blocking seconds, less the time the engine sat idle since it arrived (that part of
        the work ran in the idle time). An unloaded request is never charged: the engine was idle
        for its whole overhead, which is at least its intake. Requests that arrive after ``now``
        (the step was chained to the previous one's end) wait for the next step.
        """
        if not self._intake:
            return 0.0
        charged = 0.0
        later: list[SimRequest] = []
        for request in self._intake:
            if request.intake_from > now:
                later.append(request)
                continue
            idle = max(0.0, now - max(request.intake_from, self._last_end))
            charged += max(0.0, request.intake_s - idle)
            request.intake_s = 0.0
        self._intake = later
        return charged

    @staticmethod
    def _add_prefill_chunk(
        request: SimRequest, budget: int, work: StepWork, prefills: list[tuple[SimRequest, int]]
    ) -> int:
        """Put the request's next prefill chunk into the step; returns its tokens."""
        chunk = min(request.compute_limit - request.num_computed, budget)
        work.add_prefill(chunk, request.num_computed, last=request.num_computed + chunk == request.prefill_target)
        prefills.append((request, chunk))
        return chunk

    def _schedule_load(self, request: SimRequest, prefix: StoredPrefix, hbm_tokens: int, now: float) -> int:
        """Start loading the stored prefix beyond the HBM hit; returns the tokens that will be loaded.

        ``none``: everything from the tier, prefill waits for all of it. ``layerwise``: the same
        bytes, but the prefill of the remaining tokens runs layer by layer behind the load, so the
        request may start computing ``load/L + (L-1)/L x max(load - compute, 0)`` after the load
        starts (``compute``: the unloaded prefill of the remaining tokens). ``bidirectional``: the
        head of the prefix up to the split from :meth:`_bidirectional_split` is recomputed while
        the tail loads; prefill of the remaining tokens starts when both are done.
        """
        mode = self.settings.offload.load_overlap
        end = prefix.tokens
        begin = self._bidirectional_split(prefix, hbm_tokens, now) if mode == "bidirectional" else hbm_tokens
        if begin >= end:
            return 0
        hit = self.tiers.load(prefix, begin, end, now)
        for kind, tokens in hit.by_tier:
            self.stats.tier_hits[kind] = self.stats.tier_hits.get(kind, 0) + tokens
        ready = hit.ready_at
        if mode == "layerwise":
            layers = self.deployment.model.layers
            compute = self.time_model.prefill_seconds(request.prefill_target, end, self.settings.max_batch_tokens)
            queued = hit.ready_at - now - hit.transfer_s
            load = hit.transfer_s
            ready = now + queued + load / layers + (layers - 1) / layers * max(load - compute, 0.0)
        request.load_from, request.load_to = begin, end
        request.load_ready_at = ready
        request.phase = Phase.LOADING if begin == request.num_computed else Phase.RUNNING
        return end - begin

    def _bidirectional_split(self, prefix: StoredPrefix, hbm_tokens: int, now: float) -> int:
        """Cake's meeting point: the token ``s`` minimising ``max(compute(hbm..s), load(s..end))``.

        Candidates are the chunk boundaries between the HBM hit and the end of the stored prefix,
        both ends included (``s = hbm``: load everything; ``s = end``: recompute everything), so
        the result is never worse than either. ``compute`` is the unloaded prefill of the head
        (no LM head), ``load`` includes the wait behind earlier loads of the same tiers. Compute
        rises and load falls with ``s``, so a binary search finds the crossing.
        """
        end = prefix.tokens
        size = self.tiers.chunk_tokens
        candidates: list[int] = [hbm_tokens, *range((hbm_tokens // size + 1) * size, end, size), end]
        chunk = self.settings.max_batch_tokens

        def compute(split: int) -> float:
            return self.time_model.prefill_seconds(split, hbm_tokens, chunk, sample=False)

        def load(split: int) -> float:
            return self.tiers.load(prefix, split, end, now, commit=False).ready_at - now if split < end else 0.0

        low, high = 0, len(candidates) - 1
        while low < high:  # the first candidate whose compute is at least its load
            middle = (low + high) // 2
            if compute(candidates[middle]) >= load(candidates[middle]):
                high = middle
            else:
                low = middle + 1
        best = candidates[low]
        if low > 0:
            before = candidates[low - 1]
            if max(compute(before), load(before)) < max(compute(best), load(best)):
                best = before
        return best

    def _admit(self, request: SimRequest, now: float) -> bool:
        if request.schedulable_at > now:
            return False  # still in the calibrated per-request overhead (first come, first served)
        block_tokens = self.block_tokens
        target = len(request.tokens)
        hashes = request.block_hashes(block_tokens, target)
        hits = self.pool.lookup(hashes, (target - 1) // block_tokens)
        new_blocks = math.ceil(target / block_tokens) - len(hits)
        if not self.pool.can_allocate(hits, new_blocks):
            return False
        self.pool.touch(hits)
        request.blocks = hits + self.pool.allocate(new_blocks)
        request.registered = len(hits)
        request.prefill_target = target
        hbm_tokens = len(hits) * block_tokens
        request.num_computed = max(hbm_tokens, request.remote_tokens)
        request.phase = Phase.RUNNING
        request.load_from = request.load_to = 0
        external = 0
        if self.tiers.enabled:
            keys = request.offload_keys(self.tiers, target)
            prefix = self.tiers.find(keys, target - 1, now)
            if prefix.tokens > request.num_computed:
                external = self._schedule_load(request, prefix, request.num_computed, now)
        if request.cached_tokens is None:  # first admission (not a re-admission after preemption)
            request.hbm_hit_tokens = hbm_tokens
            request.external_tokens = external
            request.cached_tokens = max(hbm_tokens, request.remote_tokens) + external
            if self.pool.caching:
                self.stats.prefix_cache_queries += target
                self.stats.prefix_cache_hits += hbm_tokens
            if self.tiers.enabled:
                self.stats.external_queries += target
                self.stats.external_hits += external
        return True

    def _grow(self, request: SimRequest, tokens: int) -> bool:
        """Give ``request`` blocks for ``tokens`` tokens, preempting newer requests if needed.

        False if ``request`` itself had to be preempted.
        """
        need = math.ceil(tokens / self.block_tokens) - len(request.blocks)
        while need > self.pool.available:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return False
        if need > 0:
            request.blocks.extend(self.pool.allocate(need))
        return True

    def _preempt(self, request: SimRequest) -> None:
        logger.info("preempting %s (%d tokens in KV)", request.request_id, request.num_computed)
        self.running.remove(request)
        self.pool.release(request.blocks)
        request.blocks = []
        request.registered = 0
        request.num_computed = 0
        request.remote_tokens = 0  # the transferred KV is gone with its blocks: recomputed on re-admission
        request.load_from = request.load_to = 0
        request.phase = Phase.WAITING
        self.waiting.appendleft(request)
        self.stats.preemptions += 1

    def _register(self, request: SimRequest) -> None:
        """Offer the request's newly completed full blocks to the prefix cache."""
        if not self.pool.caching:
            return
        full = request.num_computed // self.block_tokens
        if full <= request.registered:
            return
        hashes = request.block_hashes(self.block_tokens, request.num_computed)
        blocks = request.blocks
        register = self.pool.register
        for index in range(request.registered, full):
            register(blocks[index], hashes[index])
        request.registered = full

    def _sample(self, request: SimRequest, now: float) -> None:
        token_id = request.next_token()
        request.tokens.append(token_id)
        request.outputs += 1
        self.stats.generation_tokens += 1
        if request.first_token_at is None:
            request.first_token_at = now
            self.stats.ttft.observe(max(0.0, now - request.arrival))
            scheduled = request.first_scheduled_at if request.first_scheduled_at is not None else now
            self.stats.prefill.observe(max(0.0, now - scheduled))
        request.sink(TokenEvent(token_id, token_text(token_id)))
        if request.outputs >= request.max_tokens:
            self._finish(request, now)

    def _finish(self, request: SimRequest, now: float) -> None:
        request.phase = Phase.FINISHED
        self.running.remove(request)
        if self.tiers.enabled:
            keys = request.offload_keys(self.tiers, request.num_computed)
            self.tiers.store(keys, now)
            if self.pool.caching:
                self._remember_chunk_ends(request, keys)
        self.pool.release(request.blocks)
        request.blocks = []
        self.stats.finished += 1
        usage = Usage(request.prompt_tokens, request.outputs, request.cached_tokens or 0)
        request.sink(FinishEvent("length", usage))

    def _remember_chunk_ends(self, request: SimRequest, keys: list[int]) -> None:
        hashes = request.block_hashes(self.block_tokens, request.num_computed)
        chunk_tokens = self.tiers.chunk_tokens
        for index, key in enumerate(keys):
            block = ((index + 1) * chunk_tokens - 1) // self.block_tokens
            if block < len(hashes):
                self._chunk_of_block[hashes[block]] = key

    def _offload_evicted(self, block_hash: int) -> None:
        # A cached block leaves HBM: if its chunk has meanwhile dropped out of every tier, write
        # it again (write-on-eviction); usually the write at completion already stored it.
        key = self._chunk_of_block.pop(block_hash, None)
        if key is not None and not self.tiers.holds(key):
            self.tiers.store([key], self._now)


MAX_LAG_S = 0.25
"""If the event loop falls this far behind the modelled timeline, restart the timeline at now."""


class RealTimeLoop(abc.ABC):
    """The lifecycle of a simulated engine run in real time on asyncio (one task, the server's only writer of its
    state): start, stop, refuse work once the task has failed, and fail every request in flight when it does."""

    task_name = "kvbench-sim-engine"

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)
        self._task.add_done_callback(self._on_done)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return  # a failed task's error is in self.failure, already logged and sent to its requests
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the simulated engine has failed: {self.failure!r}")

    def _on_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.failure = error
            logger.error("the simulated engine loop (%s) failed", self.task_name, exc_info=error)
            self._fail_all(f"the simulated engine failed: {error!r}")

    @abc.abstractmethod
    def submit(self, request: SimRequest) -> None:
        """Hand ``request`` to the engine; raises RuntimeError once the loop has failed."""

    @abc.abstractmethod
    def abort(self, request: SimRequest) -> None:
        """Stop ``request`` wherever it is (the client went away)."""

    @abc.abstractmethod
    def _fail_all(self, reason: str) -> None:
        """End every request in flight with ``reason``."""

    @abc.abstractmethod
    async def _run(self) -> None: ...


class EngineLoop(RealTimeLoop):
    """Runs an :class:`EngineCore` in real time: the server's only writer of engine state."""

    def __init__(self, core: EngineCore) -> None:
        super().__init__()
        self.core = core

    def submit(self, request: SimRequest) -> None:
        self._check_alive()
        self.core.add_request(request, time.monotonic())
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        self.core.abort(request)

    def _fail_all(self, reason: str) -> None:
        self.core.fail_all(reason)

    async def _run(self) -> None:
        core = self.core
        busy_until: float | None = None
        last_end = 0.0
        while True:
            self._wake.clear()
            now = time.monotonic()
            # chain steps back to back; after idle time (or a long stall) start again from now
            start = busy_until if busy_until is not None and now - busy_until < MAX_LAG_S else now
            overdue = core.overdue_since(now) if busy_until is None else None
            if overdue is not None and now - overdue < MAX_LAG_S:
                start = max(overdue, last_end)  # (never before the last step ended)
            plan = core.plan(start)
            if plan is None:
                busy_until = None
                wakeup = core.next_wakeup()
                timeout = None if wakeup is None else max(0.0, wakeup - time.monotonic())
                if timeout is None or timeout > 0:
                    # a timeout means a load finished: plan again either way
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            end = start + plan.seconds
            delay = end - time.monotonic()
            await asyncio.sleep(max(0.0, delay))
            core.complete(plan, end)
            busy_until = last_end = end
