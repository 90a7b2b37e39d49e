"""Events appended to a run directory as work finishes (one JSON object per line, never rewritten).

* :class:`GroupDone` (``progress.jsonl``): a probe group (arm, repetition, context length) finished
  in an attempt; resume skips it.
* :class:`MetricsDelta` (``engine_metrics.jsonl``): the engine's ``/metrics`` counter deltas over
  one turn of one group, keyed by metric tag (tokens or queries, as counted by the engine).
* :class:`PointDone` (``points.jsonl``): a sweep's load point finished, with its window edges
  (monotonic ns), counters and the client's own lag (:class:`ClientLag`).
* :class:`ReplicaCounters` (``replica_metrics.jsonl``): fleets only -- every replica's cumulative
  cache counters at each scrape (probe turns, load-point edges, soak intervals), so per-replica
  deltas come from the stored files alone.
* :class:`IntervalStats` (``intervals.jsonl``): a soak interval's aggregates (a soak keeps raw
  records on disk and aggregates per interval as it goes, so memory stays flat over hours).
* :class:`FaultEvent` (``faults.jsonl``): a failure a soak rehearsed (``soak.faults``), when it
  began and when the engine was back, on the records' monotonic clock.
* :class:`TraceInfo` (``trace.json``, written once): the replayed trace's identity and its
  statistics (the infinite-cache ceiling), so reports never need the trace file.
* :class:`ReplaySample` (``samples.jsonl``): a replay's ``/metrics`` counter deltas over one scrape
  interval of one arm (hit tokens by source over time).
* :class:`ReplayDone` (``replayed.jsonl``): one arm replayed the whole trace in an attempt; resume
  skips it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.client.fidelity import LoopLag, percentile_ns
from harness.client.power import EnergyWindow

GroupKey = tuple[str, int, int]
"""(arm, repetition, context_tokens)"""
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
ENGINE_RESTARTS = "engine_restarts"
"""The :class:`MetricsDelta` value counting engine restarts seen since the previous scrape of the arm."""


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class GroupDone(Frozen):
    """A progress event: this group finished in this attempt."""

    arm: str
    repetition: int
    context_tokens: int
    attempt: int

    @property
    def key(self) -> GroupKey:
        return (self.arm, self.repetition, self.context_tokens)


class MetricsDelta(Frozen):
    """Engine /metrics counter deltas over one turn of one group (values keyed by metric tag)."""

    arm: str
    attempt: int
    repetition: int
    context_tokens: int
    turn: int
    values: dict[str, float]

    @property
    def key(self) -> GroupKey:
        return (self.arm, self.repetition, self.context_tokens)


class ReplicaCounters(Frozen):
    """A fleet's per-replica counters at one scrape: ``counters[i]`` is replica ``i``'s running totals
    (metric tag -> value, :func:`harness.client.scrape.counter_values` of its page; ``tier_hits:<kind>``
    for per-tier hit tokens where the engine reports them), None where it served no page."""

    arm: str
    attempt: int
    at_ns: int = Field(description="time.monotonic_ns() right after the scrape (compare with records' started_ns).")
    counters: list[dict[str, float] | None]


class EngineDown(Frozen):
    """An arm's engine died (its process exited, or the endpoint refused connections) and the arm ended there."""

    arm: str
    attempt: int
    at_unix_ns: int = Field(description="Wall clock when kvbench found it down (time.time_ns()).")
    reason: str = Field(description="What kvbench saw: the exit code, or the refused connection.")
    during: str = Field(
        description="What the arm was doing when the error surfaced (its exception, one line); empty when the engine "
        "never started."
    )


class ProcessLag(Frozen):
    """One client process over a load point's window (:class:`harness.client.fidelity.LoopMonitor`'s ticks)."""

    pid: int
    role: Literal["runner", "worker"] = Field(
        description="runner: the process that runs the sessions (and, without a client pool, sends); worker: a "
        "client pool's process that sends requests."
    )
    ticks: int = Field(description="Monitor ticks (every 10 ms) inside the window.")
    loop_delay_p99_ms: float | None = Field(description="p99 of how late a tick woke (ms): the event loop's backlog.")
    loop_delay_max_ms: float | None
    cpu_fraction: float | None = Field(description="Process CPU time / wall time over the window: share of one core.")

    @classmethod
    def of(cls, lag: LoopLag) -> ProcessLag:
        return cls(
            pid=lag.pid,
            role=lag.role,
            ticks=lag.ticks,
            loop_delay_p99_ms=None if lag.delay_p99_ns is None else lag.delay_p99_ns / NS_PER_MS,
            loop_delay_max_ms=None if lag.delay_max_ns is None else lag.delay_max_ns / NS_PER_MS,
            cpu_fraction=lag.cpu_fraction,
        )


class ClientLag(Frozen):
    """How far behind its own schedule the client fell over one load point's window (ms; nearest-rank
    percentiles).

    * send lag, per request sent inside the window: ``started_ns − due_ns``, where ``due_ns`` is an open-loop
      arrival's scheduled time, or a closed-loop user's previous answer's last byte plus its think time (its
      ramp-up start for the first request): whatever kept the request from leaving on time (a busy loop, a slot,
      building the prompt);
    * slot wait, per open-loop arrival that found ``max_active_users`` sessions busy: from its scheduled time until
      a session was free (a concurrency budget too small for the rate);
    * per process (``processes``): event-loop delay and CPU use (:class:`ProcessLag`).
    """

    send_lag_n: int = Field(description="Requests sent inside the window (their send lag is counted).")
    send_lag_p50_ms: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    slot_waits: int = Field(description="Open-loop arrivals in the window that waited for a free session.")
    slot_wait_p99_ms: float | None = Field(description="p99 of those waits (None: none waited).")
    slot_wait_max_ms: float | None
    processes: list[ProcessLag]

    @classmethod
    def of(cls, send_lags_ns: Sequence[int], slot_waits_ns: Sequence[int], loops: Sequence[LoopLag]) -> ClientLag:
        def ms(values: Sequence[int], q: float) -> float | None:
            return percentile_ns(values, q) / NS_PER_MS if values else None

        return cls(
            send_lag_n=len(send_lags_ns),
            send_lag_p50_ms=ms(send_lags_ns, 50),
            send_lag_p99_ms=ms(send_lags_ns, 99),
            send_lag_max_ms=ms(send_lags_ns, 100),
            slot_waits=len(slot_waits_ns),
            slot_wait_p99_ms=ms(slot_waits_ns, 99),
            slot_wait_max_ms=ms(slot_waits_ns, 100),
            processes=[ProcessLag.of(loop) for loop in loops],
        )

    @property
    def loop_delay_p99_ms(self) -> float | None:
        """The worst process's event-loop delay p99 (ms)."""
        values = [p.loop_delay_p99_ms for p in self.processes if p.loop_delay_p99_ms is not None]
        return max(values) if values else None

    @property
    def cpu_fraction(self) -> float | None:
        """The busiest process's share of one core."""
        values = [p.cpu_fraction for p in self.processes if p.cpu_fraction is not None]
        return max(values) if values else None


class PointDone(Frozen):
    """A progress event (``points.jsonl``): one load point of one arm finished in this attempt."""

    arm: str
    point: int
    load: float
    attempt: int
    start_ns: int
    window_start_ns: int
    window_end_ns: int
    end_ns: int
    sent: int
    measured: int
    errors: int
    sessions: int
    max_in_flight: int
    late_arrivals: int
    cancelled: int
    metrics: dict[str, float] | None = None
    """Engine /metrics counter deltas over the window (tag -> value), when the engine has /metrics."""
    energy: EnergyWindow | None = None
    """The GPUs' energy over the window (:mod:`harness.client.power`); None: written before energy was metered."""
    client: ClientLag | None = None
    """How far behind its schedule the client fell over the window; None: written before the client measured it."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.arm, self.point)


class IntervalStats(Frozen):
    """Aggregates of the requests that completed in one interval, plus the engine's /metrics."""

    index: int = Field(description="0-based interval number within the window.")
    attempt: int = Field(description="Which invocation (0 = first, each --resume adds one) measured it.")
    start_unix_ns: int = Field(description="Wall clock at the interval's start (time.time_ns()).")
    duration_ns: int
    requests: int = Field(description="Requests that completed (or failed) in the interval.")
    ok: int
    errors: int
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    http_statuses: dict[str, int] = Field(default_factory=dict, description="Failed requests by HTTP status.")
    rps: float = Field(description="Completed requests per second.")
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    slo_met: int | None = Field(default=None, description="Requests that succeeded within every SLO target.")
    slo_missed: dict[str, int] = Field(
        default_factory=dict, description="Requests over each target (ttft, tpot, e2e) or failed (failed)."
    )
    slo_missed_cached: int = Field(
        default=0, description="Successful requests over a target that were served partly from a cache."
    )
    hit_rate: float | None = Field(default=None, description="Prompt tokens served from a cache / prompt tokens.")
    hit_rate_source: Literal["metrics", "usage"] | None = None
    kv_usage: float | None = Field(default=None, description="GPU KV-cache usage (0..1) at the interval's end.")
    restarts: int = Field(default=0, description="Engine restarts seen at the interval's end.")
    metrics_error: str | None = Field(default=None, description="Why /metrics could not be read, if it could not.")
    counters: dict[str, float] = Field(
        default_factory=dict, description="Cumulative /metrics counters at the end (restart detection on resume)."
    )
    energy: EnergyWindow | None = Field(
        default=None, description="The GPUs' energy over the interval (harness.client.power); None: not metered."
    )

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def slo_compliance(self) -> float | None:
        if self.slo_met is None or not self.requests:
            return None
        return self.slo_met / self.requests

    @property
    def elapsed_start_s(self) -> float:
        return self.index * self.duration_ns / NS_PER_S

    def metric(self, name: str) -> float | None:
        value = getattr(self, f"{name}_ms", None)
        return None if value is None else float(value)


class FaultEvent(Frozen):
    """One rehearsed failure of a soak (``kill_engine``, ``pause_engine``, ``restart_tier``)."""

    index: int = Field(description="Position of the fault in soak.faults (resume skips those recorded).")
    kind: Literal["kill_engine", "pause_engine", "restart_tier"]
    attempt: int
    at_s: float = Field(description="When it was planned, seconds into the window.")
    start_unix_ns: int = Field(description="Wall clock when the signal was sent (time.time_ns()).")
    started_ns: int = Field(description="time.monotonic_ns() when the signal was sent (the records' clock).")
    ended_ns: int = Field(description="time.monotonic_ns() when the engine (or tier) answered again / got SIGCONT.")
    recovery_s: float | None = Field(
        default=None, description="kill_engine / restart_tier: seconds from SIGKILL until healthy again."
    )
    error: str | None = Field(default=None, description="Why the drill itself failed (e.g. no restart).")


class TraceInfo(Frozen):
    """The trace a replay sends (its window: ``start``, ``requests``) and that window's statistics."""

    path: str
    format: str
    sha256: str = Field(description="Of the whole trace file.")
    block_tokens: int
    start: int
    requests: int
    duration_s: float = Field(description="Last minus first timestamp of the window, before time_scale.")
    time_scale: float
    mode: Literal["open", "closed"]
    concurrency: int | None
    prompt_tokens_total: int
    input_p50: float
    input_p99: float
    output_p50: float
    infinite_cache_hit_rate: float | None = Field(description="Token-weighted prefix hit rate of an unbounded cache.")


class ReplaySample(Frozen):
    """Engine /metrics counter deltas over one scrape interval of a replay (values keyed by metric tag)."""

    arm: str
    attempt: int
    t_s: float = Field(description="End of the interval, seconds since the arm's replay started.")
    duration_s: float
    values: dict[str, float]


class ReplayDone(Frozen):
    """A progress event: this arm replayed every request of the trace in this attempt."""

    arm: str
    attempt: int
    start_ns: int
    end_ns: int
    sent: int
    errors: int
    cancelled: int
    max_in_flight: int
