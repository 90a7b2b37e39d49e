"""The versioned run-result file (``summary.json``) that every report reads.

Reports never look at engines or raw sockets: they read this file (and the manifest), so
``kvbench report RUN_DIR`` can rebuild every output offline. Bump its ``schema_version`` on any
incompatible change; readers refuse versions they do not know. Fields added since are optional
(``validity``), so run directories written before them still load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from offload.hits import counter_hit_rate

from .header import ResultHeader
from .verdict import Outcome, Validity, outcome_of


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class LatencyStats(Frozen):
    """Distribution of one latency over the successful requests of a cell (milliseconds)."""

    n: int
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


class TtftCell(Frozen):
    """TTFT of one (arm, context length, turn) cell."""

    arm: str
    context_tokens: int
    turn: int
    ttft: LatencyStats | None = Field(description="None when no request of the cell succeeded.")
    errors: int
    prompt_tokens_median: float | None = None
    cached_tokens_median: float | None = None
    text_chunks_per_token: float | None = Field(
        default=None,
        description="Chunks that carried generated text / completion tokens the server reported, over the cell's "
        "successful requests (None in summaries written before it existed, or without usage).",
    )
    answer: LatencyStats | None = Field(
        default=None,
        description="Time to the first answer token (content, not reasoning), where a reasoning model streamed "
        "reasoning first in the cell; None when no request did (then it equals ttft).",
    )


class PctDiff(Frozen):
    """(baseline / arm − 1) × 100 on median TTFT: how much slower the baseline is than the arm."""

    arm: str
    baseline: str
    context_tokens: int
    turn: int
    value: float | None


class CacheStats(Frozen):
    """Prefix-cache counters of one (arm, context length, turn), from /metrics deltas (tokens)."""

    arm: str
    context_tokens: int
    turn: int
    gpu_queries: float | None = None
    gpu_hits: float | None = None
    external_queries: float | None = None
    external_hits: float | None = None
    prompt_tokens: float | None = None

    @property
    def gpu_hit_rate(self) -> float | None:
        return _rate(self.gpu_hits, self.gpu_queries)

    @property
    def external_hit_rate(self) -> float | None:
        return _rate(self.external_hits, self.external_queries)

    @property
    def hit_rate(self) -> float | None:
        """Share of prompt tokens served from any cache (GPU prefix cache or offload tier).

        The denominator is the engine's prompt-token counter, which counts with the prefix cache
        off too (then hit counters stay at zero and the rate is 0, not unknown).
        """
        return counter_hit_rate(self.prompt_tokens or self.gpu_queries, self.gpu_hits, self.external_hits)


class EngineTiming(Frozen):
    """Where one (arm, context length, turn)'s TTFT went inside the engine: means per request in ms.

    From the engine's own per-request histograms (``/metrics``), as Δ _sum / Δ _count over the cell's
    groups: ``ttft_ms`` from the request's arrival in the engine's front end (vLLM 0.26: when its renderer
    takes a chat request, before the chat template and tokenizing) to its first token, ``queue_ms`` waiting
    in the engine core's queue, ``prefill_ms`` from the first scheduling to the first token (prefill steps
    and KV loads from a tier); the rest of ``ttft_ms`` is the request's way into the engine core (template,
    tokenizing, hand-over, block hashing) and the first token's way back. The client's mean TTFT minus
    ``ttft_ms`` is the time outside the engine's clock: HTTP, the server's parsing of the request body, the
    stream back. ``requests`` counts what the engine timed in those intervals (the cell's requests where
    nothing else ran then).
    """

    arm: str
    context_tokens: int
    turn: int
    requests: int
    ttft_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None


class LMCacheSplit(Frozen):
    """One (arm, context length, turn)'s TTFT split by LMCache's own log lines: medians per request in ms.

    ``before_lookup_ms``: sent → the scheduler's LMCache lookup logged, relative to the arm's fastest request (HTTP,
    tokenizing, the engine's intake, the lookup); ``lookup_to_loaded_ms``: → the KV retrieved into GPU memory, and
    ``retrieve_ms`` LMCache's own time for that load (with tensor parallelism: the slowest rank's, which the forward
    waits for); ``rank_spread_ms``: how long after the first rank the slowest finished (None with one rank);
    ``after_load_ms``: the rest of the TTFT (the new tokens' prefill, the first token back); ``store_ms``: LMCache's
    own time storing the request's new KV (the slowest rank's sum over its chunks; None: nothing stored, or a result
    written before the field). :mod:`harness.results.lmcache_log` has the formulas.
    """

    arm: str
    context_tokens: int
    turn: int
    requests: int
    ttft_ms: float
    before_lookup_ms: float
    lookup_to_loaded_ms: float | None = None
    retrieve_ms: float | None = None
    rank_spread_ms: float | None = None
    after_load_ms: float
    store_ms: float | None = None


class LMCacheRank(Frozen):
    """One worker (TP rank) of an arm's LMCache loads of :data:`harness.results.lmcache_log.RANK_MIN_TOKENS` tokens
    or more, from LMCache's "Retrieved" lines: how fast it loads, and how often the others waited for it."""

    arm: str
    worker: str
    loads: int
    median_gbps: float
    min_gbps: float
    slowest_loads: int = Field(description="Loads with several ranks in which this one took the longest.")


SETTLE_WARN = 0.05
"""A cell whose median the last pass still moved by more than this share is not settled: more passes would move the
table (:class:`PassMedians`)."""


class PassMedians(Frozen):
    """One cell's median TTFT over its first k passes (repetitions), k = 1 … the passes run: whether more passes would
    still move it.

    ``medians_ms[k - 1]`` = median TTFT (ms) of the cell's successful measured requests of its first k passes, in
    pass order; the last pass's move = ``medians_ms[-1] / medians_ms[-2] − 1``.
    """

    arm: str
    context_tokens: int
    turn: int
    medians_ms: list[float]

    @property
    def last_move(self) -> float | None:
        return last_move(self.medians_ms)


def last_move(medians: Sequence[float]) -> float | None:
    """How far the last pass moved a cell's median: ``medians[-1] / medians[-2] − 1`` (None with fewer than 2)."""
    if len(medians) < 2 or not medians[-2]:
        return None
    return medians[-1] / medians[-2] - 1


def _rate(hits: float | None, queries: float | None) -> float | None:
    if hits is None or not queries:
        return None
    return hits / queries


STREAM_RATIO_WARN = 0.9
"""Below this share of text-bearing chunks per generated token, TTFT may include decode steps."""


class StreamCheck(Frozen):
    """Did every generated token reach the client as text, in its own chunk? (measured, successful requests)

    TTFT is the first chunk that carries text. When text-bearing chunks are far fewer than the tokens
    the server says it generated, either some tokens decode to no text (a tokenizer that cannot show
    every id: the first token may be one of them) or the server delivered several tokens in one
    chunk (it was busy when they were produced); in both cases TTFT may include decode steps.
    """

    requests: int = Field(description="Measured successful requests with a usage block.")
    text_chunks: int
    completion_tokens: int
    ratio: float | None = Field(description="text_chunks / completion_tokens.")
    empty_token_chunks: int | None = Field(
        default=None, description="Chunks with an empty content delta (None when no record has the field)."
    )
    late_text: int | None = Field(
        default=None,
        description="Requests whose first text arrived after an earlier empty token chunk (ttft_ns > first_chunk_ns).",
    )
    short_answers: int = Field(default=0, description="Answers with fewer completion tokens than answer_tokens.")
    answer_tokens: int | None = None
    warnings: list[str] = Field(default_factory=list)


class PromptLengths(Frozen):
    """One arm's prompt lengths as the tokenizer that built them counted them vs the server's ``usage.prompt_tokens``.

    Written where the prompts were built with a tokenizer that is not the engine's (an endpoint without
    ``/tokenize``), over the arm's measured successful requests with both counts; relative difference =
    usage / counted − 1 (chat: counted = the messages' contents, so the server's template tokens are in it).
    """

    arm: str
    built_with: str = Field(description="The tokenizer that built the prompts (the manifest's prompts_built_with).")
    requests: int
    median_diff: float | None = Field(description="Median relative difference (usage / counted − 1).")
    max_abs_diff: float | None = Field(description="Largest |usage / counted − 1|.")


ReturningMethod = Literal["reset_prefix_cache", "filler", "disable_prefix_cache", "none", "unavailable"]
"""What made turn 2 a returning user in an arm: a GPU prefix-cache reset, filler traffic, a GPU prefix cache that was
off, nothing (``between_turns: none``), or nothing because the arm could neither reset nor size filler."""


class BetweenTurnsMethod(Frozen):
    """The method that ran between the turns of one arm (``workload.between_turns``; with mode ``auto``, what
    the arm's engine allowed)."""

    arm: str
    method: ReturningMethod
    filler_tokens: int | None = Field(default=None, description="Filler prompt tokens sent per gap (method filler).")
    gpu_kv_tokens: int | None = Field(
        default=None, description="The GPU KV capacity in tokens the filler was sized from (mode auto)."
    )
    gpu_kv_source: Literal["metrics", "gpu_kv_tokens"] | None = Field(
        default=None,
        description="Where that capacity came from: the endpoint's /metrics or workload.between_turns.gpu_kv_tokens "
        "(--gpu-kv-tokens).",
    )

    def describe(self) -> str:
        """E.g. ``filler 150,000 tokens (GPU KV 120,000 tokens from /metrics)``, ``reset of the GPU prefix cache``."""
        if self.method == "filler":
            text = f"filler {self.filler_tokens or 0:,} tokens"
            if self.gpu_kv_tokens is not None:
                source = "/metrics" if self.gpu_kv_source == "metrics" else "gpu_kv_tokens"
                text += f" (GPU KV {self.gpu_kv_tokens:,} tokens from {source})"
            return text
        return {
            "reset_prefix_cache": "reset of the GPU prefix cache",
            "disable_prefix_cache": "GPU prefix cache disabled",
            "none": "nothing (between_turns none)",
            "unavailable": "nothing: no reset, and no GPU KV size to size filler by",
        }[self.method]


class RequestCounts(Frozen):
    measured: int
    ok: int
    errors: int
    warmup: int
    filler: int
    discarded: int = Field(description="Records of groups re-run after an interrupted attempt.")
    errors_by_kind: dict[str, int] = Field(default_factory=dict)


class RunResult(ResultHeader):
    FILE_NAME: ClassVar[str] = "summary.json"
    """Everything reports need, aggregated from records.jsonl and engine_metrics.jsonl."""
    schema_version: Literal[2] = 2  # 2: provenance, and the method that ran between turns per arm

    workload_kind: str
    arms: list[str]
    baseline_arm: str
    context_tokens: list[int]
    turns: int
    repetitions: int
    complete: bool = Field(description="Every planned group of every arm finished.")
    cells: list[TtftCell]
    pct_diff: list[PctDiff]
    cache: list[CacheStats]
    requests: RequestCounts
    validity: Validity | None = Field(
        default=None, description="The verdict of the validity gates; None in files written before they existed."
    )
    stream: StreamCheck | None = Field(
        default=None, description="Text chunks vs generated tokens (None in summaries written before it existed)."
    )
    engine_timing: list[EngineTiming] = Field(
        default_factory=list,
        description="Per cell, the engine's own TTFT, queue and prefill time (empty where the engine's /metrics "
        "has no such histograms, and in summaries written before 2026-11-27).",
    )
    lmcache_timeline: list[LMCacheSplit] = Field(
        default_factory=list,
        description="Per cell of an arm with LMCache's in-process connector, its TTFT split by LMCache's log lines "
        "(empty without them, and in summaries written before 2026-11-27).",
    )
    lmcache_ranks: list[LMCacheRank] = Field(
        default_factory=list,
        description="Per worker of an arm with LMCache's in-process connector, its load rate and how often it was "
        "the slowest rank (empty without LMCache's lines, and in summaries written before 2026-11-28).",
    )
    pass_medians: list[PassMedians] = Field(
        default_factory=list,
        description="Per cell of a run of 2 passes or more, its median TTFT after each pass (empty with one pass, "
        "and in summaries written before 2026-11-28).",
    )

    prompt_lengths: list[PromptLengths] = Field(
        default_factory=list,
        description="Per arm whose prompts a tokenizer other than the engine's built: its counts vs the server's "
        "usage.prompt_tokens (empty otherwise).",
    )
    reset_unavailable: dict[str, str] = Field(
        default_factory=dict,
        description="Arms whose engine could not reset its GPU prefix cache between turns, and why (empty when every "
        "reset happened or none was asked for).",
    )
    between_turns: list[BetweenTurnsMethod] = Field(
        description="Per arm, what made turn 2 a returning user (schema 2)."
    )

    def outcome(self) -> Outcome:
        return outcome_of(self.validity)

    def cell(self, arm: str, context_tokens: int, turn: int) -> TtftCell | None:
        return _find(self.cells, arm, context_tokens, turn)

    def diff(self, arm: str, context_tokens: int, turn: int) -> float | None:
        found = _find(self.pct_diff, arm, context_tokens, turn)
        return found.value if found is not None else None

    def cache_stats(self, arm: str, context_tokens: int, turn: int) -> CacheStats | None:
        return _find(self.cache, arm, context_tokens, turn)

    def lmcache_split(self, arm: str, context_tokens: int, turn: int) -> LMCacheSplit | None:
        return _find(self.lmcache_timeline, arm, context_tokens, turn)

    def timing(self, arm: str, context_tokens: int, turn: int) -> EngineTiming | None:
        return _find(self.engine_timing, arm, context_tokens, turn)


CellT = TypeVar("CellT", TtftCell, PctDiff, CacheStats, LMCacheSplit, EngineTiming)


def _find(items: list[CellT], arm: str, context_tokens: int, turn: int) -> CellT | None:
    """The item of one (arm, context length, turn) cell, or None."""
    for item in items:
        if (item.arm, item.context_tokens, item.turn) == (arm, context_tokens, turn):
            return item
    return None


def pct_diff(baseline_ms: float | None, arm_ms: float | None) -> float | None:
    """(baseline / arm − 1) × 100; e.g. OFF 22998.583 ms vs ON 301.481 ms -> 7528.53."""
    if baseline_ms is None or arm_ms is None or arm_ms <= 0:
        return None
    return (baseline_ms / arm_ms - 1.0) * 100.0
