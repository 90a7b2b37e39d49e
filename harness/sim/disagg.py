"""Prefill/decode disaggregation (P/D) on a virtual clock: pools of engine cores joined by a KV link.

A P/D deployment (:class:`Disaggregation`) splits ``prefill_gpus`` and ``decode_gpus`` into instances of the
deployment's tensor parallelism (``gpus / tp`` each); every instance is the simulator's
:class:`~harness.sim.scheduler.EngineCore`, unchanged. A request goes

1. to a prefill instance (the one its key hashes to, else the least busy): its queue, its HBM prefix cache and,
   when the arm has one, its offload tier -- a returning user's prefix is loaded from the tier instead of
   recomputed. The prefill instance runs the prompt with one output token (vLLM's P/D proxy sends
   ``max_tokens: 1`` to the producer); that token is discarded;
2. over the prefill instance's KV link (:class:`KvLink`) to a decode instance (the one the key hashes to,
   else the least busy): ``per_transfer_s + bytes / bandwidth`` alone, where ``bytes = tokens x KV bytes per
   token`` and ``tokens`` is the prompt less what the decode instance already holds in its HBM prefix cache
   (vLLM's NIXL consumer asks only for the tokens beyond its own hit): a prompt the prefill side loaded from
   its tier or found in its HBM still moves whole unless the decode side has it. With TP every rank moves its
   own KV heads over its own link, so the instance's link is ``tp x link_gbps``; transfers that overlap share
   the bandwidth equally (processor sharing) after their fixed cost;
3. the decode instance admits it when its KV blocks fit (first come, first served: it waits otherwise) with
   the prompt's KV counted as computed, and emits the first token at the end of its next step -- vLLM
   recomputes the prompt's last token there, so that step is a one-token prefill among the running decodes --
   then decodes the rest.

Each request's TTFT is taken apart (:class:`TtftParts`), every part a difference of consecutive instants:

    TTFT = queue + load + prefill + transfer + admission + first step

``queue``: arrival to the prefill instance scheduling it; ``load``: scheduling to the tier load landing (load
overlap ``none`` only; 0 otherwise, where the load hides in ``prefill``); ``prefill``: the rest until the
prefill instance's last prompt chunk ends; ``transfer``: the link; ``admission``: transfer end to the decode
instance scheduling it; ``first step``: that step. A colocated deployment (``disaggregation`` None: replicas
that do both) has only the first three; its first token ends ``prefill``.

Not modelled: the prefill instance keeping the request's blocks until the transfer ends (they return to its
prefix cache at once), the decode instance reserving blocks before a pull (the transfer here is a push that
needs no reservation), and transfer setup beyond the fixed per-transfer cost. Defaults: ``link_gbps``
:data:`NIXL_PUSH_GBPS` and ``per_transfer_ms`` :data:`PER_TRANSFER_MS` are reported and assumed figures, not
fitted on any measured P/D run.

:class:`Cluster` is a discrete-event loop over its cores' steps, its links' completions and load wake-ups;
times are passed in, never read, so the what-ifs run hours of traffic in CPU seconds and nothing sleeps.
:class:`ClusterLoop` runs it in real time for ``kvbench sim serve`` (``engine.kind: sim`` with
``disaggregation``), its clock ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .config import NIXL_PULL_TCP_GBPS, NIXL_PUSH_GBPS, PER_TRANSFER_MS, Disaggregation
from .scheduler import (
    EngineCore,
    ErrorEvent,
    Event,
    FinishEvent,
    Plan,
    RealTimeLoop,
    SimRequest,
    TokenEvent,
    ignore_event,
)
from .settings import SimSettings

logger = logging.getLogger(__name__)

__all__ = [
    "NIXL_PULL_TCP_GBPS",
    "NIXL_PUSH_GBPS",
    "PER_TRANSFER_MS",
    "Cluster",
    "ClusterLoop",
    "ClusterRequest",
    "Disaggregation",
    "KvLink",
    "Transfer",
    "TtftParts",
]


@dataclass
class Transfer:
    """One request's KV on its way from a prefill to a decode instance."""

    bytes: float
    started_at: float
    flows_at: float
    """When the fixed per-transfer cost is paid and the bytes start to move."""
    remaining: float = 0.0
    done_at: float | None = None


class KvLink:
    """A link whose bandwidth the transfers moving bytes at once share equally (processor sharing).

    A transfer started at ``t`` first pays ``per_transfer_s`` without using bandwidth, then moves its bytes
    at ``bytes_per_s / n`` while ``n`` transfers move bytes. Alone it takes ``per_transfer_s + bytes /
    bytes_per_s``.
    """

    def __init__(self, bytes_per_s: float, per_transfer_s: float) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"the KV link's bandwidth must be positive, got {bytes_per_s} B/s")
        self.bytes_per_s = bytes_per_s
        self.per_transfer_s = per_transfer_s
        self._clock = 0.0
        self._setting_up: list[Transfer] = []
        self._flowing: list[Transfer] = []

    @property
    def busy(self) -> bool:
        return bool(self._setting_up or self._flowing)

    def start(self, transfer_bytes: float, now: float) -> Transfer:
        done = self.advance(now)
        assert not done, "advance the link to each of its events before starting a transfer"
        transfer = Transfer(transfer_bytes, now, now + self.per_transfer_s, remaining=transfer_bytes)
        self._setting_up.append(transfer)
        return transfer

    def next_event(self) -> float | None:
        """When a transfer next starts moving bytes or finishes (None: idle)."""
        times = [t.flows_at for t in self._setting_up]
        if self._flowing:
            least = min(t.remaining for t in self._flowing)
            times.append(self._clock + least * len(self._flowing) / self.bytes_per_s)
        return min(times) if times else None

    def advance(self, now: float) -> list[Transfer]:
        """Move the link's clock to ``now``; returns the transfers that finished by then (``done_at`` set)."""
        finished: list[Transfer] = []
        while True:
            event = self.next_event()
            until = now if event is None or event > now else event
            ends_flow = False
            if self._flowing:
                least = min(self._flowing, key=lambda t: t.remaining)
                ends_flow = until >= self._clock + least.remaining * len(self._flowing) / self.bytes_per_s
                moved = (until - self._clock) * self.bytes_per_s / len(self._flowing)
                for transfer in self._flowing:
                    transfer.remaining -= moved
            self._clock = max(self._clock, until)
            if until != event:
                return finished
            if ends_flow:
                # the one with the least left is done, and any within rounding of it
                done = [t for t in self._flowing if t is least or t.remaining <= 1e-9 * t.bytes]
                for transfer in done:
                    transfer.remaining, transfer.done_at = 0.0, until
                    self._flowing.remove(transfer)
                    finished.append(transfer)
            for transfer in [t for t in self._setting_up if t.flows_at <= until]:
                self._setting_up.remove(transfer)
                if transfer.bytes <= 0:
                    transfer.done_at = until
                    finished.append(transfer)
                else:
                    self._flowing.append(transfer)


@dataclass(frozen=True)
class TtftParts:
    """One request's TTFT taken apart (seconds); the parts sum to ``ttft_s``."""

    request_id: str
    prompt_tokens: int
    loaded_tokens: int
    """Prompt tokens loaded from the (prefill side's) offload tier."""
    hbm_hit_tokens: int
    """Prompt tokens found in the (prefill side's) HBM prefix cache."""
    decode_hit_tokens: int
    """Prompt tokens the decode instance already held (P/D): their KV is not sent."""
    transfer_bytes: float
    queue_s: float
    load_s: float
    prefill_s: float
    transfer_s: float
    admission_s: float
    first_step_s: float
    ttft_s: float
    """Arrival to the first token the client sees."""

    @property
    def parts_s(self) -> float:
        return self.queue_s + self.load_s + self.prefill_s + self.transfer_s + self.admission_s + self.first_step_s


@dataclass
class ClusterRequest:
    """A client's request in a :class:`Cluster`: its prefill-side and (P/D) decode-side engine requests."""

    request_id: str
    prompt_ids: list[int]
    arrival: float
    key: str
    prefill_instance: int
    first: SimRequest
    """The request on the prefill instance (colocated: the client's whole request)."""
    decode: SimRequest | None = None
    """P/D: the client's request, which runs on the decode instance once its KV is there."""
    transfer: Transfer | None = None
    aborted: bool = False
    delivered: bool = False
    """P/D: the KV arrived and the decode instance has the request."""
    decode_instance: int | None = None
    decode_hit_tokens: int = 0
    """Prompt tokens the decode instance had in its HBM prefix cache when the transfer started (not sent)."""

    @property
    def served(self) -> SimRequest:
        """The engine request whose tokens the client sees."""
        return self.first if self.decode is None else self.decode

    def parts(self, load_overlap_none: bool) -> TtftParts:
        first, served = self.first, self.served
        if served.first_token_at is None:
            raise ValueError(f"{self.request_id} has no first token yet")
        assert first.first_scheduled_at is not None and first.first_token_at is not None
        scheduled, prefilled = first.first_scheduled_at, first.first_token_at
        load = 0.0
        if load_overlap_none and first.external_tokens:
            load = min(max(0.0, first.load_ready_at - scheduled), prefilled - scheduled)
        transfer = admission = step = 0.0
        transfer_bytes = 0.0
        if self.decode is not None:
            assert self.transfer is not None and self.transfer.done_at is not None
            assert self.decode.first_scheduled_at is not None and self.decode.first_token_at is not None
            transfer = self.transfer.done_at - prefilled
            admission = self.decode.first_scheduled_at - self.transfer.done_at
            step = self.decode.first_token_at - self.decode.first_scheduled_at
            transfer_bytes = self.transfer.bytes
        return TtftParts(
            request_id=self.request_id,
            prompt_tokens=first.prompt_tokens,
            loaded_tokens=first.external_tokens,
            hbm_hit_tokens=first.hbm_hit_tokens,
            decode_hit_tokens=self.decode_hit_tokens,
            transfer_bytes=transfer_bytes,
            queue_s=scheduled - self.arrival,
            load_s=load,
            prefill_s=prefilled - scheduled - load,
            transfer_s=transfer,
            admission_s=admission,
            first_step_s=step,
            ttft_s=served.first_token_at - self.arrival,
        )


def decode_side(settings: SimSettings) -> SimSettings:
    """The decode pool's settings: the deployment's, without offload tiers (the tier is on the prefill side)."""
    profile = settings.offload.model_copy(update={"tiers": (), "name": f"{settings.offload.name}-decode"})
    return settings.model_copy(update={"offload": profile, "shared_tier_dir": None})


@dataclass
class _Pending:
    plan: Plan | None = None
    scheduled: bool = False
    busy_s: float = 0.0


class Cluster:
    """Engine cores on one virtual clock: ``replicas`` colocated instances, or a P/D deployment.

    ``settings`` is one instance's deployment (its ``tp`` GPUs) and offload profile (P/D: the prefill side's).
    Drive it with :meth:`submit` and :meth:`advance_to` (or :meth:`run`), in non-decreasing time.
    """

    def __init__(
        self,
        settings: SimSettings,
        disaggregation: Disaggregation | None = None,
        replicas: int = 1,
        shared_chunks: OrderedDict[int, float] | None = None,
    ) -> None:
        """``replicas``: colocated only, instances of ``settings.tp`` GPUs each; ``shared_chunks``: the shared
        tier's chunk index, one for all instances (see :class:`~harness.sim.scheduler.EngineCore`)."""
        self.settings = settings
        self.disaggregation = disaggregation
        self.clock = 0.0
        self.window = (-math.inf, math.inf)
        """Steps count as busy time inside this interval only (:meth:`busy_s`)."""
        tp = settings.tp
        self.decode: list[EngineCore] = []
        self.links: list[KvLink] = []
        self._bytes_per_token = 0
        if disaggregation is None:
            self.prefill = [EngineCore(settings, shared_chunks) for _ in range(replicas)]
        else:
            prefill, decode = disaggregation.instances(tp)
            self.prefill = [EngineCore(settings, shared_chunks) for _ in range(prefill)]
            self.decode = [EngineCore(decode_side(settings)) for _ in range(decode)]
            self._bytes_per_token = self.prefill[0].deployment.kv_bytes_per_token_per_gpu * tp
            bandwidth = disaggregation.link_gbps * 1e9 * tp
            self.links = [KvLink(bandwidth, disaggregation.per_transfer_ms / 1e3) for _ in self.prefill]
        self._cores = [*self.prefill, *self.decode]
        self._state = [_Pending() for _ in self._cores]
        self._link_due: list[float | None] = [None] * len(self.links)
        self._events: list[tuple[float, int, str, int]] = []
        self._order = itertools.count()
        self._handoffs: list[tuple[int, ClusterRequest]] = []
        self._in_flight: dict[int, ClusterRequest] = {}
        """id() of a transfer on a link -> its request."""

    @property
    def gpus(self) -> int:
        return len(self._cores) * self.settings.tp

    @property
    def load_overlap_none(self) -> bool:
        return self.settings.offload.load_overlap == "none"

    def transfer_bytes(self, tokens: int) -> float:
        """Bytes the link moves for ``tokens`` tokens' KV (every TP rank's KV heads)."""
        return tokens * self._bytes_per_token

    def busy_s(self) -> list[float]:
        """Busy seconds per core (prefill instances first) inside :attr:`window`, steps counted when planned."""
        return [state.busy_s for state in self._state]

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        sink: Callable[[Event], None],
        key: str = "",
        instance: int | None = None,
    ) -> ClusterRequest:
        """A client's request arriving now at prefill (colocated: serving) ``instance``; None: the one ``key``
        (a session) hashes to, else the least busy."""
        return self.submit_request(SimRequest(request_id, list(prompt_ids), max_tokens, sink), key, instance)

    def submit_request(self, client: SimRequest, key: str = "", instance: int | None = None) -> ClusterRequest:
        """:meth:`submit` for a request built by the caller (its sampling, when the server received it)."""
        index = self._pick(range(len(self.prefill)), key) if instance is None else instance
        for core in self.decode:  # refused now, not when its KV arrives
            core.check_fits(client)
        prompt = client.tokens[: client.prompt_tokens]
        if self.disaggregation is None:
            request = ClusterRequest(client.request_id, prompt, self.clock, key, index, client)
        else:
            first = SimRequest(f"{client.request_id}-prefill", prompt, 1, ignore_event)
            first.received_at, client.received_at = client.received_at, None  # the decode side gets it later
            request = ClusterRequest(client.request_id, prompt, self.clock, key, index, first, client)
            first.sink = self._on_prefill(index, request)
        self.prefill[index].add_request(request.first, self.clock)
        self._kick(index)
        return request

    def abort(self, request: ClusterRequest) -> None:
        """Stop a request whose client went away, wherever it is (its transfer, if moving, still ends)."""
        request.aborted = True
        self.prefill[request.prefill_instance].abort(request.first)
        if request.delivered and request.decode is not None and request.decode_instance is not None:
            self._cores[request.decode_instance].abort(request.decode)

    def next_event_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    def advance_to(self, until: float) -> None:
        """Process every event at or before ``until``; the clock ends at ``until``."""
        while self._events and self._events[0][0] <= until:
            at, _, kind, index = heapq.heappop(self._events)
            self.clock = at
            if kind == "link":
                if self._link_due[index] == at:
                    self._link_due[index] = None
                    self._on_link(index)
                continue
            state = self._state[index]
            state.scheduled = False
            if kind == "step" and state.plan is not None:
                plan, state.plan = state.plan, None
                self._cores[index].complete(plan, at)
                for prefill, request in self._handoffs:
                    self._start_transfer(prefill, request)
                self._handoffs.clear()
            self._kick(index)
        self.clock = max(self.clock, until)

    def run(self) -> float:
        """Run until nothing is left to do; returns the clock."""
        while self._events:
            self.advance_to(self._events[0][0])
        return self.clock

    def reset_prefix_caches(self) -> None:
        for core in self._cores:
            core.reset_prefix_cache()

    def tier_writes_done_at(self) -> float:
        return max([self.clock, *(tier.write_busy_until for core in self.prefill for tier in core.tiers.tiers)])

    # -- internals ----------------------------------------------------------------------------

    def _pick(self, indices: range, key: str) -> int:
        if key and len(indices) > 1:
            return indices[zlib.crc32(key.encode()) % len(indices)]
        return min(indices, key=lambda i: (self._cores[i].num_running + self._cores[i].num_waiting, i))

    def _push(self, at: float, kind: str, index: int) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, index))

    def _kick(self, index: int) -> None:
        state, core = self._state[index], self._cores[index]
        if state.scheduled or not core.has_work:
            return
        plan = core.plan(self.clock)
        if plan is not None:
            state.plan, state.scheduled = plan, True
            start, end = self.clock, self.clock + plan.seconds
            state.busy_s += max(0.0, min(end, self.window[1]) - max(start, self.window[0]))
            self._push(self.clock + plan.seconds, "step", index)
            return
        wakeup = core.next_wakeup()
        if wakeup is not None:
            state.scheduled = True
            self._push(max(wakeup, self.clock), "wake", index)

    def _on_prefill(self, index: int, request: ClusterRequest) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if isinstance(event, FinishEvent):
                self._handoffs.append((index, request))  # started once the step's completion is applied

        return sink

    def _start_transfer(self, prefill: int, request: ClusterRequest) -> None:
        """Pick the decode instance and send it the prompt's KV beyond its own prefix-cache hit."""
        decode = request.decode
        assert decode is not None
        if request.aborted:
            return
        prompt = len(request.prompt_ids)
        # vLLM's consumer recomputes the last prompt token to sample the first output token
        decode.remote_tokens = prompt - 1
        request.decode_instance = self._pick(range(len(self.prefill), len(self._cores)), request.key)
        core = self._cores[request.decode_instance]
        hits = core.pool.lookup(decode.block_hashes(core.block_tokens, prompt), (prompt - 1) // core.block_tokens)
        request.decode_hit_tokens = len(hits) * core.block_tokens
        link = self.links[prefill]
        self._on_link(prefill)  # finish what ended by now before the bandwidth is shared anew
        request.transfer = link.start(self.transfer_bytes(prompt - request.decode_hit_tokens), self.clock)
        self._in_flight[id(request.transfer)] = request
        self._schedule_link(prefill)

    def _schedule_link(self, index: int) -> None:
        due = self.links[index].next_event()
        self._link_due[index] = due
        if due is not None:
            self._push(due, "link", index)

    def _on_link(self, index: int) -> None:
        for transfer in self.links[index].advance(self.clock):
            request = self._in_flight.pop(id(transfer))
            assert request.decode is not None and request.decode_instance is not None
            if request.aborted:
                continue
            request.delivered = True
            self._cores[request.decode_instance].add_request(request.decode, self.clock)
            self._kick(request.decode_instance)
        self._schedule_link(index)


MAX_LAG_S = 0.25
"""Lateness of the event loop behind the modelled timeline that is logged (the host is too slow to keep up)."""


class ClusterLoop(RealTimeLoop):
    """Runs a :class:`Cluster` in real time (``kvbench sim serve`` with ``disaggregation``), as
    :class:`~harness.sim.scheduler.EngineLoop` runs one core: the server's only writer of its state.

    The cluster's clock is ``time.monotonic()``: each wake-up processes the events due by now, steps chain from
    their modelled ends, and a request arriving while the loop sleeps is processed at its arrival.
    """

    task_name = "kvbench-sim-cluster"

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster
        self._live: dict[int, ClusterRequest] = {}
        """id() of a client's request -> where it is, until it finishes or is aborted."""

    def submit(self, request: SimRequest) -> None:
        self._check_alive()
        self._catch_up(time.monotonic())
        client_sink = request.sink

        def sink(event: Event) -> None:
            client_sink(event)
            if not isinstance(event, TokenEvent):
                self._live.pop(id(request), None)

        request.sink = sink
        self._live[id(request)] = self.cluster.submit_request(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        where = self._live.pop(id(request), None)
        if where is not None:
            self.cluster.abort(where)

    def _catch_up(self, now: float) -> None:
        # events the loop woke too late for run at their modelled times, at once: say so when it is a lot
        due = self.cluster.next_event_time()
        if due is not None and now - due > MAX_LAG_S:
            logger.warning("the P/D simulator fell %.2f s behind its timeline", now - due)
        self.cluster.advance_to(now)

    def _fail_all(self, reason: str) -> None:
        for where in list(self._live.values()):
            where.served.sink(ErrorEvent(reason))
        self._live.clear()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._catch_up(time.monotonic())
            due = self.cluster.next_event_time()
            timeout = None if due is None else max(0.0, due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
