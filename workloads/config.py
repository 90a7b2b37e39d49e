"""Workload configuration: the ``workload:`` section of a scenario, owned by the workload stage.

Four kinds, joined on ``kind``: ``multi_round_qa`` (the unloaded probe: per context length, N
conversations of T turns, turn 2 measuring a returning user), ``multi_user_qa`` (many users
under load, for sweeps and soaks; lengths, rounds and think times drawn from :data:`Distribution`),
``trace`` (a timestamped trace file replayed by ``kvbench replay``, :mod:`workloads.trace`) and
``agentic`` (concurrent agent sessions swept by ``kvbench sweep`` against SLO tiers, :mod:`workloads.agentic`).
Token counts are tokens of the engine's own tokenizer; times are seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from common.schema import StrictModel, sorted_unique

from .salt import PromptSaltMode
from .trace_model import FormatChoice

MAX_COUNT = 1_000_000
"""Upper bound of any count of requests, users or conversations: a typo (a billion conversations)
is refused at validation instead of running for years or exhausting memory building prompts."""
MAX_TOKENS = 2_000_000
"""Upper bound of any token count (the longest context any engine serves today)."""
MAX_TIMEOUT_S = 7 * 86400.0

RequestTimeout = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, description="Seconds one request may take in all.")]
StallTimeout = Annotated[
    float | None,
    Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Seconds the connection may stay silent between two reads before the request fails as a "
        "timeout (default: only request_timeout_s applies).",
    ),
]


PromptSalt = Annotated[
    PromptSaltMode,
    Field(
        default="per_run",
        description="per_run: every run's prompts start with a salt of its own (manifest prompt_salt; --resume keeps "
        "it), so no run finds an earlier run's KV and turn 1 starts cold; fixed: the same prompts on every run (a "
        "warm start, measured on purpose: the report says so and the turn-1 hit check does not apply).",
    ),
]


class BetweenTurns(StrictModel):
    """How turn 2 is made to measure a *returning* user, whose KV has left GPU memory.

    * ``auto`` (the default): reset the GPU prefix cache where the engine can (started engines that offer a
      reset, an attached endpoint whose reset answers); otherwise filler traffic sized from the GPU KV
      capacity, which the endpoint's ``/metrics`` reports (vLLM's ``vllm:cache_config_info``: num_gpu_blocks
      x block_size) or ``gpu_kv_tokens`` gives: filler prompt tokens = ceil(capacity x :data:`FILLER_MARGIN`).
      Where neither is possible the arm runs on and the verdict says what would make it valid.
    * ``reset_prefix_cache``: ask the engine to drop its GPU prefix cache between turns
      (vLLM ``POST /reset_prefix_cache``, SGLang ``/flush_cache``, the simulator); offload tiers stay.
    * ``disable_prefix_cache``: start the engine with its GPU prefix cache off, so only an
      offload tier can serve turn 2.
    * ``filler``: send unrelated prompts between turns until the GPU cache has been overwritten.
    * ``none``: do nothing (measures the hot-cache case, useful as a sanity check).
    """

    mode: Literal["auto", "reset_prefix_cache", "disable_prefix_cache", "filler", "none"] = "auto"
    filler_tokens: int = Field(
        default=0,
        ge=0,
        le=MAX_COUNT * 1000,
        description="With mode=filler: total prompt tokens of filler traffic per gap.",
    )
    filler_request_tokens: int = Field(
        default=4000, ge=16, le=MAX_TOKENS, description="Prompt tokens per filler request."
    )
    gpu_kv_tokens: int | None = Field(
        default=None,
        ge=16,
        le=MAX_COUNT * 1000,
        description="With mode=auto: the GPU KV-cache capacity in tokens (all of an arm's GPUs), for an endpoint "
        "that cannot reset its prefix cache; default: what its /metrics reports (vllm:cache_config_info).",
    )

    @model_validator(mode="after")
    def _filler_needs_tokens(self) -> BetweenTurns:
        if self.mode == "filler" and self.filler_tokens <= 0:
            raise ValueError("mode 'filler' needs filler_tokens > 0 (enough to overwrite the GPU KV cache)")
        if self.gpu_kv_tokens is not None and self.mode != "auto":
            raise ValueError(
                f"gpu_kv_tokens sizes mode 'auto''s filler traffic; mode {self.mode!r} does not use it "
                "(allowed: mode auto with gpu_kv_tokens, or filler_tokens with mode filler)"
            )
        return self


FILLER_MARGIN = 1.25
"""Filler prompt tokens per GPU KV token in mode ``auto``: a quarter more than the cache holds, so the blocks
that turn 1 left (the least recently used once the filler's are freed) are all overwritten even where the
engine keeps some blocks back (vLLM's null block, a scheduler watermark)."""


class MultiRoundQAProbe(StrictModel):
    """Unloaded multi-round QA probe: per context length, N conversations with T turns each."""

    kind: Literal["multi_round_qa"]
    context_tokens: list[Annotated[int, Field(ge=16, le=MAX_TOKENS)]] = Field(min_length=1, max_length=1000)
    conversations: int = Field(default=2, ge=1, le=MAX_COUNT, description="Independent conversations per length.")
    turns: int = Field(default=2, ge=2, le=64)
    question_tokens: int = Field(default=32, ge=4, le=MAX_TOKENS)
    answer_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS, description="max_tokens of every answer.")
    ignore_eos: bool = Field(
        default=True, description="Ask the engine to ignore EOS so every answer has answer_tokens tokens."
    )
    api: Literal["chat", "completions"] = "chat"
    prompt: Literal["text", "token_ids"] = Field(
        default="text",
        description="token_ids (api: completions only): send each prompt as the ids the engine's tokenizer makes of "
        "it, special tokens included, so the engine skips tokenizing; the same tokens reach the model either way.",
    )
    between_turns: BetweenTurns = BetweenTurns()
    warmup_requests: int = Field(default=2, ge=0, le=MAX_COUNT, description="Unmeasured requests after start-up.")
    warmup_prompt_tokens: list[Annotated[int, Field(ge=16)]] = Field(
        default=[128],
        min_length=1,
        description="Prompt lengths of the warm-up requests, used in turn. A freshly started engine runs its "
        "first prompts of a new length slowly (kernel selection, allocator growth: the 8B H100 run's first "
        "1k-token turn 1 took 84 ms, its third 55 ms), so GPU scenarios warm up at the lengths they measure.",
    )
    request_timeout_s: RequestTimeout = 600.0
    stall_timeout_s: StallTimeout
    prompt_salt: PromptSalt

    @field_validator("context_tokens")
    @classmethod
    def _sorted_unique(cls, values: list[int]) -> list[int]:
        return sorted_unique(values, "context lengths")

    @model_validator(mode="after")
    def _token_ids_need_completions(self) -> MultiRoundQAProbe:
        if self.prompt == "token_ids" and self.api != "completions":
            raise ValueError(
                f"prompt: token_ids needs api: completions (a chat request's messages are text), got api: {self.api}; "
                "allowed: prompt: text with either api, prompt: token_ids with api: completions"
            )
        return self


class _DistBase(StrictModel):
    """Optional clipping bounds shared by every distribution (applied after sampling)."""

    min: float | None = Field(default=None, description="Samples below are raised to it.")
    max: float | None = Field(default=None, description="Samples above are lowered to it.")

    @model_validator(mode="after")
    def _bounds_ordered(self) -> _DistBase:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) is above max ({self.max:g})")
        return self


class FixedDist(_DistBase):
    """Always ``value`` (a bare number in YAML means this)."""

    dist: Literal["fixed"]
    value: float = Field(ge=0)


class UniformDist(_DistBase):
    """Uniform on [low, high]; integer quantities (tokens, rounds) draw integers, both ends included."""

    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformDist:
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        return self


class NormalDist(_DistBase):
    """Normal with this mean and standard deviation (negative samples become 0)."""

    dist: Literal["normal"]
    mean: float = Field(ge=0)
    std: float = Field(ge=0)


class LogNormalDist(_DistBase):
    """Log-normal whose own mean and standard deviation are ``mean`` and ``std`` (long right tail)."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)


class ExponentialDist(_DistBase):
    """Exponential with this mean (think times, gaps)."""

    dist: Literal["exponential"]
    mean: float = Field(gt=0)


class ChoiceDist(_DistBase):
    """One of ``values``, with optional relative ``weights``."""

    dist: Literal["choice"]
    values: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    weights: list[Annotated[float, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _weights_match(self) -> ChoiceDist:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"{len(self.weights)} weights for {len(self.values)} values")
            if not sum(self.weights) > 0:
                raise ValueError("weights must not all be 0")
        return self


def _bare_number_is_fixed(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Distribution = Annotated[
    FixedDist | UniformDist | NormalDist | LogNormalDist | ExponentialDist | ChoiceDist,
    Field(discriminator="dist"),
    BeforeValidator(_bare_number_is_fixed),
]
"""A number (fixed) or a mapping with ``dist``: fixed, uniform, normal, lognormal, exponential, choice."""


class MultiUserQA(StrictModel):
    """Many users, each a multi-round QA conversation, driven under load by ``kvbench sweep``.

    Every user has the shared system prompt, a private context (document, code, history) and a
    number of rounds; each round resends the whole history plus a new question. Lengths, rounds
    and think times are drawn per user from the distributions below, deterministically from the
    scenario seed, so every arm and every load point sees the same users.
    """

    kind: Literal["multi_user_qa"]
    users: int = Field(
        default=10_000,
        ge=1,
        le=MAX_COUNT,
        description="Distinct users; sessions cycle through them (user = session % users) unless user_skew > 0.",
    )
    rounds: Distribution = Field(description="Rounds per session (integer), e.g. {dist: uniform, low: 2, high: 11}.")
    user_skew: float = Field(
        default=0.0,
        ge=0,
        le=4,
        description="Zipf exponent of user activity: 0 = users in turn (user = session % users); s > 0 = each "
        "session's user drawn with weight (u + 1)^-s, so a few heavy users return often (fleets: hotspots).",
    )
    system_prompt_tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Shared system prompt S (same for all users)."
    )
    context_tokens: Distribution = Field(description="Per-user context tokens (sent in round 1, kept in history).")
    question_tokens: Distribution = Field(default=FixedDist(dist="fixed", value=32))
    answer_tokens: Distribution = Field(
        default=FixedDist(dist="fixed", value=100), description="max_tokens of each answer (integer, >= 1)."
    )
    think_time_s: Distribution = Field(
        default=FixedDist(dist="fixed", value=0), description="Pause after an answer before the user's next round."
    )
    max_prompt_tokens: int | None = Field(
        default=None, ge=16, description="A session ends early rather than send a longer prompt (model limit)."
    )
    ignore_eos: bool = Field(default=True, description="Ask the engine to ignore EOS so answers have max_tokens.")
    api: Literal["chat", "completions"] = "chat"
    warmup_requests: int = Field(
        default=2, ge=0, le=MAX_COUNT, description="Unmeasured requests after each engine start."
    )
    request_timeout_s: RequestTimeout = 600.0
    stall_timeout_s: StallTimeout
    prompt_salt: PromptSalt


class TraceReplay(StrictModel):
    """Replay a timestamped trace file (``kvbench replay``): the same requests, in the same order, on every arm.

    ``mode: open`` sends request *i* at ``(timestamp_i − timestamp_first) × time_scale`` seconds after
    the start, never waiting for earlier answers (``concurrency``, if set, caps requests in flight;
    a request that waits for a slot is sent late). ``mode: closed`` ignores the timestamps and keeps
    ``concurrency`` requests in flight, in trace order. Prompts are built with the engine's tokenizer
    from the trace's hash ids (or its text); answers have ``output_length`` tokens.
    """

    kind: Literal["trace"]
    path: str = Field(description="The trace file (JSON Lines); relative paths are relative to the working directory.")
    format: Literal["mooncake", "kvbench", "bailian", "claude-code", "tokens", "text", "auto"] = Field(
        default="mooncake", description="The trace's format; auto tells it from the first line's fields."
    )
    time_scale: float = Field(
        default=1.0, gt=0, description="Multiplies the gaps between timestamps: 0.5 replays twice as fast."
    )
    block_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per hash id; default 512 (mooncake) or the kvbench header's."
    )
    allow_gaps: bool = Field(
        default=False,
        description="Accept consecutive requests more than an hour apart (a replay waits them out in real time, "
        "scaled by time_scale); without it such a trace is refused as corrupt or concatenated.",
    )
    start: int = Field(default=0, ge=0, description="Skip this many requests (0-based position in the file).")
    limit: int | None = Field(default=None, ge=1, description="Replay at most this many requests.")
    mode: Literal["open", "closed"] = "open"
    concurrency: int | None = Field(
        default=None, ge=1, description="closed: requests in flight (required); open: an optional cap."
    )
    api: Literal["chat", "completions"] = Field(
        default="completions", description="completions sends the blocks as they are (no chat template)."
    )
    ignore_eos: bool = Field(default=True, description="Ask the engine to ignore EOS so answers have output_length.")
    late_ms: float = Field(default=10.0, ge=0, description="A request sent more than this after its time is late.")
    behind_ms: float = Field(
        default=1000.0, gt=0, description="The run 'fell behind' when the p99 of send lag exceeds this."
    )
    metrics_interval_s: float = Field(
        default=5.0, gt=0, description="Scrape the engine's /metrics this often (hit tokens by source over time)."
    )
    drain_timeout_s: float = Field(default=600.0, ge=0, description="After the last send, wait this long for answers.")
    warmup_requests: int = Field(default=2, ge=0, description="Unmeasured short requests after each engine start.")
    request_timeout_s: float = Field(default=600.0, gt=0)
    stall_timeout_s: StallTimeout
    prompt_salt: PromptSalt

    @model_validator(mode="after")
    def _closed_needs_concurrency(self) -> TraceReplay:
        if self.mode == "closed" and self.concurrency is None:
            raise ValueError("mode 'closed' needs concurrency (requests in flight)")
        return self


class SloTier(StrictModel):
    """One SLO tier of an agentic sweep: a call meets it when its TTFT is at most ``ttft_s`` and its output speed
    ``(tokens − 1) / (e2e − ttft)`` is at least ``min_output_tokens_per_s``; a load meets it when at least
    ``percentile`` % of its measured calls do."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_.-]+$")
    ttft_s: float = Field(gt=0, le=MAX_TIMEOUT_S, description="Most seconds to the first token.")
    min_output_tokens_per_s: float = Field(default=0.0, ge=0, description="Least output tokens per second per call.")
    percentile: float = Field(default=90.0, gt=0, le=100, description="Share of calls (%) that must meet both.")


DEFAULT_TIERS: tuple[SloTier, ...] = (
    SloTier(name="interactive", ttft_s=2.0, min_output_tokens_per_s=30.0, percentile=90.0),
    SloTier(name="standard", ttft_s=10.0, min_output_tokens_per_s=15.0, percentile=90.0),
    SloTier(name="batch", ttft_s=60.0, min_output_tokens_per_s=5.0, percentile=90.0),
)
"""A coding agent a person watches (interactive), a background agent (standard), an offline batch job (batch)."""


class AgentCost(StrictModel):
    """The price of a GPU-hour, for $/Mtok."""

    usd_per_gpu_hour: float = Field(gt=0, description="Price of one GPU-hour in US dollars.")


class AgentTraceSource(StrictModel):
    """An agent trace whose sessions an ``agentic`` sweep replays (:mod:`workloads.agentic`)."""

    path: str = Field(
        description="The trace file (JSON Lines): relative to the working directory, or a bundled sample's name."
    )
    format: FormatChoice = Field(
        default="auto",
        description="The trace's format; a hash-block one (mooncake, kvbench, bailian, claude-code) or auto.",
    )


SYNTHESIS_FIELDS = (
    "system_prompt_tokens",
    "task_tokens",
    "calls",
    "tool_result_tokens",
    "output_tokens",
    "tool_time_s",
    "subagent_probability",
    "subagent_calls",
    "block_tokens",
)
"""The fields of :class:`AgenticSessions` that only synthesized sessions use."""


class AgenticSessions(StrictModel):
    """Concurrent agent sessions (``kvbench sweep``), synthesized from a trace's statistics (:mod:`workloads.agentic`).

    A session starts from a root prefix shared by every session (``system_prompt_tokens``: system prompt and tool
    definitions), adds its task, then runs a chain of ``calls``: each resends the whole growing context plus the
    previous answer and a new tool result (``tool_result_tokens``), after a pause (``tool_time_s``). After a call, with
    probability ``subagent_probability``, a subagent forks from the current context and runs its own chain of
    ``subagent_calls`` concurrently. Token counts are rounded up to whole ``block_tokens`` blocks; equal blocks are
    identical text, so the engine sees exactly the reuse the plan describes. ``agents`` is the load axis: that many
    sessions at once, a finished one replaced by a new one (closed loop). Per point: ``warmup_s`` unmeasured, then
    ``window_s`` measured (calls sent inside it). With ``trace``, the sessions are an agent trace's instead (its
    calls, tree, hash blocks, answers and pauses), replayed in turn.
    """

    kind: Literal["agentic"]
    agents: list[Annotated[int, Field(ge=1, le=MAX_COUNT)]] = Field(
        min_length=1, max_length=100, description="Concurrent agent sessions at each load point, e.g. [1, 2, 4, 8]."
    )
    system_prompt_tokens: int = Field(
        default=2000, ge=0, le=MAX_TOKENS, description="Root prefix shared by every session (system + tools)."
    )
    task_tokens: Distribution = Field(default=FixedDist(dist="fixed", value=500), description="The session's task.")
    calls: Distribution = Field(
        default=UniformDist(dist="uniform", low=5, high=20), description="Calls of the main chain (integer, >= 1)."
    )
    tool_result_tokens: Distribution = Field(
        default=LogNormalDist(dist="lognormal", mean=1500, std=1500), description="New tokens appended per call."
    )
    output_tokens: Distribution = Field(
        default=FixedDist(dist="fixed", value=200), description="max_tokens of each call (integer, >= 1)."
    )
    tool_time_s: Distribution = Field(
        default=FixedDist(dist="fixed", value=1.0), description="Pause between an answer and the branch's next call."
    )
    subagent_probability: float = Field(default=0.0, ge=0, le=1, description="Chance a subagent forks after a call.")
    subagent_calls: Distribution = Field(
        default=UniformDist(dist="uniform", low=2, high=5), description="Calls of a subagent's chain (integer, >= 1)."
    )
    max_context_tokens: int | None = Field(
        default=None, ge=16, le=MAX_TOKENS, description="A branch ends rather than send a longer prompt (model limit)."
    )
    trace: AgentTraceSource | None = Field(
        default=None,
        description="Draw the sessions from this agent trace instead of synthesizing them: the synthesis fields "
        "(system_prompt_tokens ... subagent_calls, block_tokens) are then not used and must keep their defaults.",
    )
    block_tokens: int = Field(
        default=64, ge=1, le=4096, description="Tokens per reuse block (the engine's block size should divide it)."
    )
    tiers: list[SloTier] = Field(default_factory=lambda: list(DEFAULT_TIERS), min_length=1, max_length=10)
    cost: AgentCost | None = Field(default=None, description="GPU price, for $/Mtok (none: no $/Mtok).")
    warmup_s: float = Field(default=10.0, ge=0, le=MAX_TIMEOUT_S, description="Per point: load applied, unmeasured.")
    window_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S, description="Per point: the measured window.")
    ramp_up_s: float = Field(default=0.0, ge=0, le=3600, description="Seconds over which the first sessions start.")
    drain_timeout_s: float = Field(default=120.0, ge=0, le=MAX_TIMEOUT_S, description="After the window, in flight.")
    reset_between_points: bool = Field(
        default=False,
        description="Reset the GPU prefix cache before each point (a point's sessions are new ones either way, and "
        "with workload.prompt_salt per_run each point's blocks, the shared root included, are salted with the point).",
    )
    api: Literal["completions"] = Field(default="completions", description="The blocks are sent as they are.")
    ignore_eos: bool = Field(default=True, description="Ask the engine to ignore EOS so answers have max_tokens.")
    warmup_requests: int = Field(default=2, ge=0, le=MAX_COUNT, description="Unmeasured requests after start-up.")
    request_timeout_s: RequestTimeout = 600.0
    stall_timeout_s: StallTimeout
    prompt_salt: PromptSalt

    @field_validator("agents")
    @classmethod
    def _agents_sorted_unique(cls, values: list[int]) -> list[int]:
        return sorted_unique(values, "agents counts")

    @field_validator("tiers")
    @classmethod
    def _tier_names_unique(cls, tiers: list[SloTier]) -> list[SloTier]:
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        return tiers

    @model_validator(mode="after")
    def _trace_or_synthesis(self) -> AgenticSessions:
        if self.trace is not None:
            changed = [
                name
                for name in SYNTHESIS_FIELDS
                if getattr(self, name) != AgenticSessions.model_fields[name].get_default(call_default_factory=True)
            ]
            if changed:
                raise ValueError(
                    f"trace draws the sessions from {self.trace.path}; the synthesis fields {', '.join(changed)} "
                    "would not be used (remove them)"
                )
        return self

    @model_validator(mode="after")
    def _root_fits(self) -> AgenticSessions:
        if (
            self.trace is None
            and self.max_context_tokens is not None
            and self.system_prompt_tokens + self.block_tokens > self.max_context_tokens
        ):
            raise ValueError(
                f"max_context_tokens ({self.max_context_tokens}) leaves no room after system_prompt_tokens "
                f"({self.system_prompt_tokens}) for a task block of {self.block_tokens} tokens"
            )
        return self


WorkloadConfig = Annotated[MultiRoundQAProbe | MultiUserQA | TraceReplay | AgenticSessions, Field(discriminator="kind")]
