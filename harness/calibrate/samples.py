"""What a run directory holds for the fit: its deployment (:func:`run_facts`) and its samples (:func:`collect`).

Per probe request a :class:`TtftSample` (its TTFT, prompt, HBM and tier hits: the group's ``/metrics`` deltas over its
requests, or ``cached_tokens``); per request with 2+ output tokens a :class:`DecodeSample` (its clean gaps, while no
other request of its window prefilled: :func:`decode_samples`); per sweep load point a :class:`StepsWindow` (every
request the engine served, whose steps :mod:`.engine_steps` rebuilds); per group or request a :class:`FrontSample`
(the time outside the engine's queue and prefill, by the engine's histograms or LMCache's log). ``holdout`` lengths
and ``holdout_loads`` go to the held-out set.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from common.errors import CalibrationError
from harness.engines.host_link import summarize_host_links
from harness.results.aggregate import chosen_measured
from harness.results.lmcache_log import split_requests
from harness.results.modelshape import hf_config
from harness.scenario.spec import Scenario
from harness.sim.calibration import (
    CalibratedDeployment,
    SourceRun,
)
from harness.store.manifest import attempt_host_links, read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.profiles import TierKind, resolve_profile
from offload.shapes import HARDWARE, MODELS, Dtype, ModelProfile, known_model, model_from_hf_config

from .engine_steps import EngineSteps, reconstruct

DEFAULT_MAX_BATCH_TOKENS = 8192
"""vLLM V1's default --max-num-batched-tokens for the API server (and the simulator's)."""

DTYPES: dict[str, Dtype] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
}
QUANTIZED_WEIGHTS: dict[str, Dtype] = {"fp8": "fp8"}
"""Engine ``quantization`` -> the simulator's weight dtype (the KV cache keeps the engine's dtype)."""
GPU_NAMES: tuple[tuple[str, str], ...] = (("H200", "h200-sxm"), ("H100", "h100-sxm"))
"""Substring of the GPU name in the manifest -> simulator hardware profile."""


@dataclass(frozen=True)
class ArmFacts:
    backend: str | None
    """Offload backend the arm used (None: no tier)."""
    version: str | None
    tier: TierKind | None
    chunk_tokens: int = 256


@dataclass(frozen=True)
class RunFacts:
    """What a run directory says about its deployment."""

    source: SourceRun
    deployment: CalibratedDeployment
    arms: dict[str, ArmFacts]
    max_batch_tokens: int
    kind: str


@dataclass(frozen=True)
class TtftSample:
    arm: str
    backend: str | None
    context_tokens: int
    turn: int
    prompt_tokens: int
    hbm_tokens: int
    loaded_tokens: int
    ttft_s: float


ENGINE_CLOCK = "engine clock"
LMCACHE_LOG = "LMCache log"


@dataclass(frozen=True)
class FrontSample:
    """The time a request spends outside the engine core's queue and prefill: HTTP, rendering, tokenizing, the
    engine's intake, the first token's way back. ``source`` says how it was timed:

    * :data:`ENGINE_CLOCK`: one group of requests (arm, repetition, length, turn): the client's mean TTFT minus the
      engine's mean queue and prefill time (vLLM's ``request_queue_time_seconds`` and
      ``request_prefill_time_seconds`` histograms over the group's ``/metrics`` delta);
    * :data:`LMCACHE_LOG`: one request, sent to the scheduler's LMCache lookup (:mod:`.lmcache_log`; relative to its
      arm's fastest request, and without the way back).
    """

    run: str
    context_tokens: int
    turn: int
    prompt_tokens: int
    front_s: float
    source: str = LMCACHE_LOG


@dataclass(frozen=True)
class DecodeSample:
    batch: float
    """Time-averaged number of requests decoding together (:func:`decode_samples`)."""
    context_tokens: int
    """Their time-averaged context per request (prompt + tokens generated so far)."""
    step_s: float
    """Mean step (seconds) over the request's clean gaps."""
    run: str = ""
    arm: str = ""
    load: float | None = None
    """The sweep point's load (None: a probe run)."""
    length: int = 0
    """A probe run's context length (0 in sweeps)."""
    span_s: float = 0.0
    """Seconds of clean gaps the step is the mean of."""
    requests: int = 1
    """Requests pooled into this sample (:func:`decode_groups`)."""
    backend: str | None = None
    """The offload backend of the sample's arm (None: no tier)."""


def decode_groups(samples: Sequence[DecodeSample]) -> list[DecodeSample]:
    """One sample per (run, arm, load point or probe length): the requests' clean time over their clean steps.

    Batch and context are time-weighted over the same clean gaps. A group's mean step weighs every
    step alike, as a load point's TPS/user does, whether its requests ran in a slow or a fast stretch.
    """
    groups: dict[tuple[str, str, float, int], list[DecodeSample]] = defaultdict(list)
    for s in samples:
        groups[(s.run, s.arm, -1.0 if s.load is None else s.load, s.length)].append(s)
    out: list[DecodeSample] = []
    for (run, arm, load, length), group in sorted(groups.items()):
        span = sum(s.span_s for s in group)
        steps = sum(s.span_s / s.step_s for s in group)
        batch_time = sum(s.batch * s.span_s for s in group)
        context = sum(s.context_tokens * s.batch * s.span_s for s in group) / batch_time
        out.append(
            DecodeSample(
                batch_time / span,
                round(context),
                span / steps,
                run,
                arm,
                None if load < 0 else load,
                length,
                span,
                len(group),
                group[0].backend,
            )
        )
    return out


@dataclass(frozen=True)
class StepsWindow:
    """One load point's records (every request its engine served), whose engine steps can be rebuilt."""

    run: str
    arm: str
    load: float | None
    backend: str | None
    records: tuple[RequestRecord, ...]
    sampled: frozenset[str]
    """Request ids of the measured requests whose decode windows are fitted."""
    max_batch_tokens: int
    _cache: dict[tuple[float, float], EngineSteps] = field(default_factory=dict, compare=False, repr=False)

    def steps(self, overhead_s: float, overhead_s_per_ktoken: float) -> EngineSteps:
        """The steps, with prefill chunks placed as the simulator would under this request overhead."""
        key = (overhead_s, overhead_s_per_ktoken)
        if key not in self._cache:
            steps = reconstruct(self.records, self.max_batch_tokens, *key)
            assert steps is not None  # collect() keeps only windows that can be rebuilt
            self._cache.clear()
            self._cache[key] = steps
        return self._cache[key]


@dataclass
class FitData:
    ttft: list[TtftSample] = field(default_factory=list)
    decode: list[DecodeSample] = field(default_factory=list)
    windows: list[StepsWindow] = field(default_factory=list)
    front: list[FrontSample] = field(default_factory=list)

    def add(self, other: FitData) -> None:
        self.ttft += other.ttft
        self.decode += other.decode
        self.windows += other.windows
        self.front += other.front


# -- what a run directory is ---------------------------------------------------------------------


def _engine_attr(scenario: Scenario, name: str) -> object:
    # engine configs differ per kind; these optional knobs are read where a kind has them
    return getattr(scenario.engine, name, None)


def _model_name(scenario: Scenario, where: str, override: str | None) -> str:
    if override is not None:
        if override not in MODELS:
            raise CalibrationError(f"--model {override!r}: unknown; known: {', '.join(sorted(MODELS))}")
        return override
    ref = scenario.engine.model
    if ref in MODELS:
        return ref
    profile = run_model_shape(scenario)
    name = known_model(profile) if profile is not None else None
    if name is None:
        raise CalibrationError(
            f"{where}: engine.model {ref!r} matches no simulator model profile "
            f"({', '.join(sorted(MODELS))}); pass --model"
        )
    return name


def run_model_shape(scenario: Scenario) -> ModelProfile | None:
    """The model shape a run used: a simulator profile, or its model directory's config.json."""
    ref = scenario.engine.model
    if ref in MODELS:
        return MODELS[ref]
    config, where = hf_config(ref)
    if config is None:
        return None
    try:
        return model_from_hf_config(config, ref, where)
    except ValueError:
        return None


def run_dtypes(scenario: Scenario, default: Dtype, where: str) -> tuple[Dtype, Dtype | None]:
    """(weight dtype, KV-cache dtype or None when the same) of a run's engine.

    ``engine.dtype`` is the activations' and the KV cache's dtype (``auto``/absent: the model's);
    ``engine.quantization`` quantizes the weights only (vLLM's ``--quantization fp8``: FP8 GEMMs,
    the KV cache stays in ``dtype``); a simulator engine's ``kv_dtype`` sets the KV cache's.
    """
    value = _engine_attr(scenario, "dtype")
    dtype = DTYPES.get(str(value), default) if value is not None else default
    kv_value = _engine_attr(scenario, "kv_dtype")
    kv = DTYPES.get(str(kv_value), dtype) if kv_value is not None else dtype
    quantization = _engine_attr(scenario, "quantization")
    if quantization is not None:
        weights = QUANTIZED_WEIGHTS.get(str(quantization))
        if weights is None:
            known = ", ".join(sorted(QUANTIZED_WEIGHTS))
            raise CalibrationError(f"{where}: engine.quantization {quantization!r}: no simulator dtype; known: {known}")
        dtype = weights
    return dtype, (None if kv == dtype else kv)


def _gpu_names(manifest: dict[str, object]) -> list[str]:
    host = manifest.get("host")
    gpus = host.get("gpus") if isinstance(host, dict) else None
    return [str(gpu.get("name", "")) for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus, list) else []


def _hardware_name(details: dict[str, str], manifest: dict[str, object], where: str, override: str | None) -> str:
    if override is not None:
        if override not in HARDWARE:
            raise CalibrationError(f"--hardware {override!r}: unknown; known: {', '.join(sorted(HARDWARE))}")
        return override
    if details.get("hardware") in HARDWARE:
        return details["hardware"]
    names = _gpu_names(manifest)
    for gpu in names:
        for needle, profile in GPU_NAMES:
            if needle in gpu:
                return profile
    raise CalibrationError(
        f"{where}: manifest.json host.gpus {names or 'is empty'}: no simulator hardware profile "
        f"({', '.join(sorted(HARDWARE))}) matches; pass --hardware"
    )


def run_facts(path: Path, model: str | None = None, hardware: str | None = None) -> RunFacts:
    """The deployment, per-arm offload backends and source identity of one run directory."""
    run_dir = RunDir.open(path)
    scenario = run_dir.scenario()
    if not run_dir.manifest_file.exists():
        raise CalibrationError(f"{run_dir.manifest_file}: missing; a calibration needs the run's manifest")
    raw = run_dir.manifest_file.read_bytes()
    manifest: dict[str, object] = read_manifest(run_dir.manifest_file)
    engines = manifest.get("engines")
    if not isinstance(engines, dict) or not engines:
        raise CalibrationError(f"{run_dir.manifest_file}: field 'engines' is empty (the run never started an engine)")
    where = str(run_dir.manifest_file)
    versions = {(str(e.get("kind")), str(e.get("version"))) for e in engines.values() if isinstance(e, dict)}
    if len(versions) != 1:
        raise CalibrationError(f"{where}: arms ran different engines {sorted(versions)}; calibrate one at a time")
    engine, version = versions.pop()
    first = next(iter(engines.values()))
    first_details = {str(k): str(v) for k, v in first.get("details", {}).items()}
    name = _model_name(scenario, where, model)
    tp_value = getattr(_engine_attr(scenario, "parallelism"), "tp", 1)
    tp = tp_value if isinstance(tp_value, int) else 1
    dtype, kv_dtype = run_dtypes(scenario, MODELS[name].dtype, where)
    chunk = _engine_attr(scenario, "max_batch_tokens") or _engine_attr(scenario, "max_num_batched_tokens")
    arms: dict[str, ArmFacts] = {}
    for arm in scenario.arms:
        profile = resolve_profile(arm.offload)
        entry = engines.get(arm.name)
        details = {str(k): str(v) for k, v in entry.get("details", {}).items()} if isinstance(entry, dict) else {}
        if not profile.offload_enabled:
            arms[arm.name] = ArmFacts(None, None, None)
            continue
        backend = details.get("offload_backend", profile.backend)
        arms[arm.name] = ArmFacts(
            backend, details.get(f"{backend}_version"), profile.tiers[0].kind, profile.chunk_tokens
        )
    gpu = next(iter(_gpu_names(manifest)), "")
    eager = _engine_attr(scenario, "enforce_eager")  # kinds kvbench does not configure (attach): unknown
    return RunFacts(
        source=SourceRun(
            path=str(path),
            run_id=str(manifest.get("run_id", path.name)),
            manifest_sha256=hashlib.sha256(raw).hexdigest(),
            gpu=gpu or first_details.get("hardware", "unknown"),
            host_link=summarize_host_links(attempt_host_links(manifest, where)),
        ),
        deployment=CalibratedDeployment(
            model=name,
            hardware=_hardware_name(first_details, manifest, where, hardware),
            tp=tp,
            dtype=dtype,
            kv_dtype=kv_dtype,
            engine=engine,
            engine_version=version,
            cuda_graphs=not eager if isinstance(eager, bool) else None,
        ),
        arms=arms,
        max_batch_tokens=chunk if isinstance(chunk, int) else DEFAULT_MAX_BATCH_TOKENS,
        kind=run_dir.kind,
    )


# -- samples -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """When one request was prefilling (sent .. first token) and decoding (first token .. last byte), in ns."""

    start: float
    first: float
    end: float
    prompt: float
    tokens: float

    def context_at(self, t: float) -> float:
        """Tokens of context at time ``t`` of its decode (prompt + tokens generated by then)."""
        share = (t - self.first) / (self.end - self.first) if self.end > self.first else 1.0
        return self.prompt + self.tokens * min(max(share, 0.0), 1.0)


def _window(record: RequestRecord) -> _Window:
    first = record.started_ns + (record.ttft_ns or 0)
    return _Window(
        float(record.started_ns),
        float(first),
        float(record.started_ns + (record.e2e_ns or 0)),
        float(record.prompt_tokens or 0),
        float(record.completion_tokens or 0),
    )


def _gaps(record: RequestRecord, first: float) -> list[tuple[float, float, int]]:
    """(start ns, end ns, decode steps) of each gap between the request's chunks.

    When the stream carried fewer content chunks than tokens (outputs that decode to no text), the
    gaps do not mark steps: the whole decode window is one span of ``tokens - 1`` steps (a lower
    bound of the step, as some steps happened before the first content chunk).
    """
    tokens = record.completion_tokens or 0
    if record.output_chunks < tokens:
        return [(first, first + float(sum(record.itl_ns)), tokens - 1)]
    edges = first + np.concatenate(([0.0], np.cumsum(np.asarray(record.itl_ns, dtype=float))))
    return [(float(a), float(b), 1) for a, b in pairwise(edges) if b > a]


def decode_samples(group: Sequence[RequestRecord], sampled: Sequence[RequestRecord]) -> list[DecodeSample]:
    """One decode sample per request of ``sampled``, from the gaps during which no request of ``group`` prefilled.

    ``group``: every successful request one engine served in one window (an arm's probe attempt, or
    one load point of a sweep, warm-up included), ``sampled`` those of them to sample. A gap between
    two chunks is *clean* when no other request of the group was between its send and its first
    token (then the engine's steps were decode steps; a step that also computes another request's
    prefill chunk is the prefill's cost, not decode's). Per request: step = mean clean gap
    (clean time / clean steps), batch = the time-averaged number of requests decoding during its clean gaps, context
    = the time-averaged context of those requests (prompt + tokens generated so far). A request
    without clean gaps gives no sample.
    """
    windows = [_window(r) for r in group]
    start = np.array([w.start for w in windows])
    first = np.array([w.first for w in windows])
    end = np.array([w.end for w in windows])
    index = {id(r): i for i, r in enumerate(group)}
    out: list[DecodeSample] = []
    for record in sampled:
        tokens = record.completion_tokens or 0
        i = index.get(id(record))
        if i is None or not record.ok or tokens < 2 or not record.itl_ns:
            continue
        steps = 0
        batch_time = context_time = span = 0.0
        for a, b, n in _gaps(record, first[i]):
            prefilling = (start < b) & (first > a)
            prefilling[i] = False
            if prefilling.any():
                continue
            overlap = np.clip(np.minimum(end, b) - np.maximum(first, a), 0.0, None)
            overlap[i] = b - a
            mid = (a + b) / 2
            contexts = sum(overlap[j] * windows[j].context_at(mid) for j in np.nonzero(overlap)[0])
            steps += n
            batch_time += float(overlap.sum())
            context_time += contexts
            span += b - a
        if steps and span > 0:
            out.append(
                DecodeSample(batch_time / span, round(context_time / batch_time), span / steps / 1e9, span_s=span / 1e9)
            )
    return out


def collect(
    path: Path, facts: RunFacts, holdout: Sequence[int], holdout_loads: Sequence[float] = ()
) -> tuple[FitData, FitData]:
    """(fit samples, held-out samples) of one run: probe lengths in ``holdout`` and sweep loads in
    ``holdout_loads`` are held out."""
    run_dir = RunDir.open(path)
    records = [r for r in chosen_measured(run_dir) if r.ok and r.ttft_ns is not None and r.prompt_tokens]
    per_group: dict[tuple[str, int, int, int, int], list[RequestRecord]] = defaultdict(list)
    for r in records:
        per_group[(r.arm, r.attempt, r.repetition, r.context_tokens, r.turn)].append(r)
    hits: dict[tuple[str, int, int, int, int], tuple[float, float]] = {}
    engine_clock: list[FrontSample] = []
    for delta in run_dir.metrics():
        key = (delta.arm, delta.attempt, delta.repetition, delta.context_tokens, delta.turn)
        group = per_group.get(key, [])
        if group:
            values = delta.values
            count = len(group)
            hits[key] = (values.get("gpu_prefix_hits", 0.0) / count, values.get("external_prefix_hits", 0.0) / count)
            front = _engine_clock_front(facts.source.run_id, group, values)
            if front is not None:
                engine_clock.append(front)
    fit, held = FitData(), FitData()
    # every request the engine served in a window counts towards the batch, warm-up included
    served: dict[tuple[str, int, int | None], list[RequestRecord]] = defaultdict(list)
    everything = run_dir.records()
    for r in everything:
        if r.ok and r.ttft_ns is not None and r.e2e_ns is not None:
            served[(r.arm, r.attempt, r.point)].append(r)
    sampled: dict[tuple[str, int, int | None], list[RequestRecord]] = defaultdict(list)
    for r in records:
        sampled[(r.arm, r.attempt, r.point)].append(r)
    for (name, attempt, point), mine in sampled.items():
        group = served[(name, attempt, point)]
        by_id = {r.request_id: r for r in group}
        load = mine[0].load
        held_point = point is not None and load in holdout_loads
        arm_facts = facts.arms.get(name)
        for length in sorted({r.context_tokens for r in mine}):
            chosen = [by_id[r.request_id] for r in mine if r.context_tokens == length and r.request_id in by_id]
            target = held if held_point or (point is None and length in holdout) else fit
            target.decode += [
                replace(
                    s,
                    run=facts.source.run_id,
                    arm=name,
                    load=load,
                    length=length if point is None else 0,
                    backend=arm_facts.backend if arm_facts else None,
                )
                for s in decode_samples(group, chosen)
            ]
        steps = reconstruct(group, facts.max_batch_tokens) if point is not None and arm_facts else None
        if steps is not None and arm_facts is not None:
            window = StepsWindow(
                facts.source.run_id,
                name,
                load,
                arm_facts.backend,
                steps.records,
                frozenset(r.request_id for r in mine),
                facts.max_batch_tokens,
            )
            (held if held_point else fit).windows.append(window)
    if facts.kind != "probe":
        return fit, held  # queueing under load: TTFT is not an unloaded request's
    for front in engine_clock:
        (held if front.context_tokens in holdout else fit).front.append(front)
    for name, arm_facts in facts.arms.items():
        lines = run_dir.engine_log(name) if arm_facts.backend == "lmcache" else None
        if lines is None:
            continue
        for split in split_requests([r for r in everything if r.arm == name], lines):
            front = FrontSample(
                facts.source.run_id,
                split.context_tokens,
                split.turn,
                split.prompt_tokens,
                split.before_lookup_ms / 1000,
                LMCACHE_LOG,
            )
            (held if split.context_tokens in holdout else fit).front.append(front)
    for r in records:
        arm = facts.arms.get(r.arm)
        if arm is None or r.ttft_ns is None or r.prompt_tokens is None:
            continue
        key = (r.arm, r.attempt, r.repetition, r.context_tokens, r.turn)
        hbm, loaded = hits.get(key, (0.0, float(r.cached_tokens or 0)))
        # the simulator loads whole chunks: a group's few stray hit tokens (a shared system
        # prompt, spread over its requests) are no load at all
        loaded = loaded if loaded >= arm.chunk_tokens else 0.0
        sample = TtftSample(
            arm=r.arm,
            backend=arm.backend,
            context_tokens=r.context_tokens,
            turn=r.turn,
            prompt_tokens=r.prompt_tokens,
            hbm_tokens=round(hbm),
            loaded_tokens=round(loaded) if arm.backend is not None else 0,
            ttft_s=r.ttft_ns / 1e9,
        )
        (held if r.context_tokens in holdout else fit).ttft.append(sample)
    return fit, held


def cells_of(samples: Sequence[TtftSample]) -> dict[tuple[str, int, int], list[TtftSample]]:
    cells: dict[tuple[str, int, int], list[TtftSample]] = defaultdict(list)
    for s in samples:
        cells[(s.arm, s.context_tokens, s.turn)].append(s)
    return cells


def _engine_clock_front(run: str, group: Sequence[RequestRecord], values: Mapping[str, float]) -> FrontSample | None:
    """A group's :data:`ENGINE_CLOCK` front time, or None when the engine did not time every one of its requests
    (no such histograms, or a count that differs from the group's)."""
    count = len(group)
    if values.get("queued_requests") != count or values.get("prefilled_requests") != count:
        return None
    client_s = statistics.fmean(r.ttft_ns or 0 for r in group) / 1e9
    engine_s = (values.get("queue_seconds", 0.0) + values.get("prefill_seconds", 0.0)) / count
    first = group[0]
    prompt = round(statistics.median(r.prompt_tokens or 0 for r in group))
    return FrontSample(run, first.context_tokens, first.turn, prompt, client_s - engine_s, ENGINE_CLOCK)


def front_samples(samples: Sequence[FrontSample]) -> list[FrontSample]:
    """The samples step 0 fits: the engine clock's where any run has it (it times every arm, and the first token's
    way back too), else LMCache's log."""
    timed = [s for s in samples if s.source == ENGINE_CLOCK]
    return timed or [s for s in samples if s.source == LMCACHE_LOG]
