"""Fit a simulator calibration from real runs: a pure function of stored run directories.

``calibrate([RUN_DIR, ...])`` reads each run's scenario, manifest, ``records.jsonl`` and
``engine_metrics.jsonl`` and fits the parameters of :class:`harness.sim.calibration.Calibration`
for the one deployment they share (model, hardware, TP, weight dtype -- FP8 with
``engine.quantization: fp8`` --, KV-cache dtype, engine and version; runs of two deployments are an
error naming both).

What is fitted, from what (all by least squares on *relative* residuals ``predicted/measured - 1``,
so a 50 ms and a 10 s request weigh the same; ``soft_l1`` loss, so a request whose TTFT includes a
few decode steps does not drag the fit):

1. Decode (every run kind, every request with two or more output tokens): one step per token is
   ``max(step_overhead + per_seq x batch, max(compute, (weights + batch x context x KV bytes) /
   (HBM bw x hbm_eff)))``: the host's part overlaps the GPU's (``host_overlaps_gpu``; a parameter
   of the side that does not bind has no gradient, so the fit starts host-bound and, where the HBM
   rate is free, also memory-bound at the heaviest group, and keeps the better). Per request, its
   *clean* gaps (no other request of its window between send
   and first token, :func:`decode_samples`); per (run, arm, load point or probe length) the *mean*
   step over them (:func:`decode_groups`: clean time / clean steps), fitted with squared residuals:
   TPS/user and RPS are means, and a real engine's steps have a long tail (on the measured 1x H100
   sweep, vLLM 0.26.0, the clean steps' median is 15-18 ms and their mean 17-21 ms, slow stretches
   lasting seconds). When the stream carried fewer content chunks than tokens (outputs that decode
   to no text), the whole decode window over ``completion_tokens - 1`` is used (a lower bound).
   ``batch`` is the time-averaged number of requests of the same window decoding at once (1 in a
   probe run). The HBM efficiency and a first step overhead come from probe runs (batch 1, contexts
   that differ; the efficiency only when the KV read per step varies by half the weights' bytes);
   with a sweep, the step overhead and ``per_seq`` (``step_s_per_seq``, when batches differ 2x) are
   then fitted on its load points alone: a probe's steps ran on an otherwise idle engine, a sweep's
   beside arrivals and other streams, which is where capacity is decided. An arm with an offload
   backend adds the backend's ``step_extra_s`` to every step, fitted jointly from a probe run's
   steps of that arm and of an arm without a tier (both are needed to tell it from the overhead).
2. TTFT (probe runs only: an unloaded request's TTFT, no queueing): each measured request is
   ``overhead(P) + [latency_b + loaded x KV bytes / load_bw_b] + prefill(P | cached)``, the
   simulator's own unloaded formula (:func:`harness.sim.calibration.unloaded_ttft_s`), where the
   prefill uses the time model with the fitted GEMM and attention efficiencies plus the backend's
   blocking store per computed token. Per request, HBM hits and tier hits (``loaded``) are the
   group's ``/metrics`` deltas (``gpu_prefix_hits``, ``external_prefix_hits``) divided by its
   requests, or ``cached_tokens`` when no deltas exist. Under ``host_overlaps_gpu`` the fit runs twice, the
   second time with a prefill step's own host time (``prefill_host_s``, eager mode's short-prompt floor: vLLM
   0.26.0 --enforce-eager took 42-43 ms per 8B prefill from 250 to 1,500 tokens on one H200), and keeps it
   where it binds and fits better (:func:`_fit_ttft`).
3. Engine-blocking share (sweeps): the engine's steps are rebuilt from the records
   (:mod:`.engine_steps`), and with the other parameters fixed, the share ``beta`` of the per-request
   overhead that stalls the running requests is fitted from the measured requests' whole decode
   windows: each window is predicted as the sum of its steps' modelled times (decodes, prefill
   chunks, stores, per-sequence cost) plus ``beta x overhead(P)`` of every request whose intake is
   charged to one of its steps (the first step that starts after it was sent, as the simulator
   charges it); jointly, per offload backend, ``busy_intake_s``: seconds of engine-loop work per
   request that arrives while the engine is busy, fitted from that backend's arm's windows alone
   (each arrival charged to a step of the window adds it). On the 1x H100 sweep native's decode
   steps slow with the load beyond what the shared share (0 there) predicts, LMCache's do not.

0. Front end (probe runs): the time a request spends outside the engine core's queue and prefill -- HTTP,
   rendering, tokenizing, the engine's intake, the first token's way back -- grows with the prompt. Timed by the
   engine's own histograms where every request of a group was (the client's mean TTFT minus vLLM's mean queue and
   prefill time: every arm; 2.6 and 3.1 ms per 1000 tokens on the two committed runs that scraped them), else by
   LMCache's log lines (sent to the scheduler's lookup, :mod:`.lmcache_log`: 1.7-2.7 ms per 1000 tokens, without
   the way back); :func:`front_samples` picks. Its slope over the cells' medians (:func:`front_slope`) is the request
   overhead's growth, fixed before step 2 for every arm (one vLLM front end), so the load rates and the GEMM rate
   no longer absorb it.

Steps 1-2 alternate (decode, TTFT, decode: the prefill efficiencies enter large-batch decode
steps and the step overhead enters prefill steps), then 3. ``holdout_loads`` leaves sweep load
points out of every step (``decode_residuals`` and ``tpot_residuals`` mark them held out).

Some parameters are not determined by some runs; they keep their default and say why:

* the per-token growth of the request overhead needs the engine's queue and prefill histograms or LMCache's log
  lines (step 0) at context lengths 4x apart (the workload's lengths: 32k and 128k are, though the question and
  chat template make their prompts just under 4x), or requests served from the HBM prefix cache (otherwise it is
  indistinguishable from the GEMM rate and the load rate);
* the store cost needs an arm without a tier (otherwise it is indistinguishable from prefill), and
  its fixed part per request (``store_latency_s``) also computed prompts whose sizes differ 4x;
* a backend's load latency needs loads of sizes that differ by 4x or more, its rate any load;
* the attention efficiency needs prompts of 16k tokens or more;
* the per-sequence step cost needs decode batches that differ 2x (a sweep), the engine-blocking
  share a sweep whose schedule can be reconstructed (every token streamed as its own chunk).
"""

from __future__ import annotations

import copy
import hashlib
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from common.errors import CalibrationError
from harness.engines.host_link import summarize_host_links
from harness.results.aggregate import chosen_measured
from harness.results.lmcache_log import split_requests
from harness.results.modelshape import hf_config
from harness.scenario.spec import Scenario
from harness.sim.calibration import (
    BackendCalibration,
    CalibratedDeployment,
    Calibration,
    DecodeResidual,
    FitParam,
    Residual,
    SourceRun,
    unloaded_ttft_s,
)
from harness.sim.timemodel import STEP_OVERHEAD_S, Efficiencies, StepWork, TimeModel
from harness.store.manifest import attempt_host_links, read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.profiles import TierKind, resolve_profile
from offload.shapes import HARDWARE, MODELS, Deployment, Dtype, ModelProfile, known_model, model_from_hf_config

from .engine_steps import EngineSteps, reconstruct

DEFAULT_MAX_BATCH_TOKENS = 8192
"""vLLM V1's default --max-num-batched-tokens for the API server (and the simulator's)."""

ATTENTION_MIN_TOKENS = 16_000
MEMORY_BOUND_MARGIN = 0.001
"""The decode fit's memory-bound start replaces the host-bound one only when its RMS relative step error
is lower by this much (0.1 % of a step)."""
PREFILL_FLOOR_MARGIN = 0.002
"""The TTFT fit with a prefill step's own host time replaces the one without only when its RMS relative error
is lower by this much (0.2 % of a TTFT): one more free parameter always fits a little better."""
SPREAD = 4.0
"""Sizes (loads) must differ by this factor for a slope to be determined."""
BATCH_SPREAD = 2.0
"""Decode batches must differ by this factor for the per-sequence step cost to be determined."""
KV_SPREAD = 0.5
"""The KV bytes the decode steps read must differ by this share of the weights' bytes for the HBM
efficiency to be determined: the step then grows visibly with batch x context. Below it (a sweep
of short contexts), the weights dominate every step, which fixes only their sum with the step
overhead; the efficiency keeps its datasheet value and the overhead takes the rest."""

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

    def steps(self, params: Params) -> EngineSteps:
        """The steps, with prefill chunks placed as the simulator would under ``params``' request overhead."""
        key = (params.overhead_s, params.overhead_s_per_ktoken)
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


# -- the model and the fit ------------------------------------------------------------------------


@dataclass
class Params:
    """The fitted quantities, in the units the simulator uses."""

    overhead_s: float = 0.0
    overhead_s_per_ktoken: float = 0.0
    linear: float = 0.65
    attention: float = 0.65
    hbm: float = 0.85
    step_overhead_s: float = STEP_OVERHEAD_S
    step_s_per_seq: float = 0.0
    blocking_share: float = 0.0
    load_s_per_gb: dict[str, float] = field(default_factory=dict)
    load_latency_s: dict[str, float] = field(default_factory=dict)
    store_s_per_gb: dict[str, float] = field(default_factory=dict)
    store_latency_s: dict[str, float] = field(default_factory=dict)
    busy_intake_s: dict[str, float] = field(default_factory=dict)
    step_extra_s: dict[str, float] = field(default_factory=dict)
    prefill_host_s: float | None = None
    """None: a prefill step's host part is the step overhead."""


def timing_of(deployment: Deployment, params: Params, backend: str | None) -> TimeModel:
    """The simulator's time model with these parameters, for an arm with ``backend`` (None: no tier)."""
    store = params.store_s_per_gb.get(backend, 0.0) * deployment.kv_bytes_per_token / 1e9 if backend else 0.0
    fixed = params.store_latency_s.get(backend, 0.0) if backend else 0.0
    eff = Efficiencies(
        linear=params.linear,
        attention=params.attention,
        hbm=params.hbm,
        step_overhead_s=params.step_overhead_s,
        store_s_per_token=store,
        store_latency_s=fixed,
        step_s_per_seq=params.step_s_per_seq,
        prefill_host_s=params.prefill_host_s,
        step_extra_s=params.step_extra_s.get(backend, 0.0) if backend else 0.0,
    )
    return TimeModel(deployment, eff)


def predict_ttft(deployment: Deployment, params: Params, chunk: int, samples: Sequence[TtftSample]) -> np.ndarray:
    """Seconds, per sample, of the simulator's unloaded TTFT with these parameters."""
    kv_gb = deployment.kv_bytes_per_token / 1e9
    timings: dict[str | None, TimeModel] = {}
    out = np.empty(len(samples))
    for i, s in enumerate(samples):
        timing = timings.get(s.backend)
        if timing is None:
            timing = timings[s.backend] = timing_of(deployment, params, s.backend)
        load = 0.0
        if s.backend is not None and s.loaded_tokens > 0:
            rate = params.load_s_per_gb.get(s.backend, 1 / 25.0)
            load = params.load_latency_s.get(s.backend, 0.0) + s.loaded_tokens * kv_gb * rate
        overhead = params.overhead_s + params.overhead_s_per_ktoken * s.prompt_tokens / 1000
        out[i] = unloaded_ttft_s(timing, overhead, s.prompt_tokens, s.hbm_tokens, s.loaded_tokens, load, chunk)
    return out


def predict_decode(deployment: Deployment, params: Params, samples: Sequence[DecodeSample]) -> np.ndarray:
    """Seconds, per sample, of a decode step of the sample's (time-averaged) batch at its context.

    A fractional batch b is the time-weighted mix of steps of floor(b) and ceil(b) sequences.
    """
    timings: dict[str | None, TimeModel] = {}
    out = np.empty(len(samples))
    for i, s in enumerate(samples):
        timing = timings.get(s.backend)
        if timing is None:
            timing = timings[s.backend] = timing_of(deployment, params, s.backend)
        low = max(1, int(s.batch))
        share = max(0.0, s.batch - low)
        step = timing.decode_step_seconds(low, s.context_tokens)
        if share > 0:
            step += share * (timing.decode_step_seconds(low + 1, s.context_tokens) - step)
        out[i] = step
    return out


@dataclass(frozen=True)
class DecodeWindows:
    """Per measured request of some windows: its decode window, measured and as the model's two parts."""

    requests: list[tuple[StepsWindow, int]]
    measured_s: np.ndarray
    modelled_s: np.ndarray
    """Sum of the window's steps' modelled times, intake left out."""
    intake_s: np.ndarray
    """Sum of the per-request overheads whose intake is charged to the window's steps."""
    steps: np.ndarray
    arrivals: np.ndarray
    """Requests whose intake is charged to the window's steps (each adds its backend's ``busy_intake_s``)."""
    backends: tuple[str | None, ...]
    """The offload backend of each request's arm (None: no tier)."""

    def predicted_s(self, params: Params) -> np.ndarray:
        """Each window: its steps' modelled times, the blocking share of the charged overheads, and the
        backend's ``busy_intake_s`` per charged arrival."""
        busy = np.array([params.busy_intake_s.get(b, 0.0) if b else 0.0 for b in self.backends])
        return np.asarray(self.modelled_s + params.blocking_share * self.intake_s + busy * self.arrivals, dtype=float)


def decode_windows(deployment: Deployment, params: Params, windows: Sequence[StepsWindow]) -> DecodeWindows:
    """The decode windows (first token's step + 1 .. last token's step) of the windows' sampled requests
    with 2+ steps, each predicted as ``modelled + blocking_share x intake``."""
    requests: list[tuple[StepsWindow, int]] = []
    measured: list[float] = []
    modelled: list[float] = []
    intake: list[float] = []
    count: list[int] = []
    arrivals: list[float] = []
    for w in windows:
        steps = w.steps(params)
        base = steps.modelled_s(timing_of(deployment, params, w.backend))
        charge = steps.intake_overhead_s(params.overhead_s, params.overhead_s_per_ktoken)
        arrived = steps.intake_arrivals()
        for i, record in enumerate(steps.records):
            if record.request_id not in w.sampled:
                continue
            first, last = int(steps.first[i]), int(steps.last[i])
            if last - first < 2:
                continue
            requests.append((w, i))
            measured.append(float(steps.ends_ns[last] - steps.ends_ns[first]) / 1e9)
            modelled.append(float(base[first + 1 : last + 1].sum()))
            intake.append(float(charge[first + 1 : last + 1].sum()))
            arrivals.append(float(arrived[first + 1 : last + 1].sum()))
            count.append(last - first)
    return DecodeWindows(
        requests,
        np.array(measured),
        np.array(modelled),
        np.array(intake),
        np.array(count),
        np.array(arrivals),
        tuple(w.backend for w, _ in requests),
    )


@dataclass(frozen=True)
class Free:
    """One free parameter: how to read it from and write it into :class:`Params`, and its bounds."""

    name: str
    get: Callable[[Params], float]
    set: Callable[[Params, float], None]
    low: float
    high: float


def _solve(
    frees: Sequence[Free], params: Params, residuals: Callable[[Params], np.ndarray], robust: bool = True
) -> float:
    """Least squares on ``residuals`` over ``frees``; ``robust``: a ``soft_l1`` loss (outliers pull less).
    Returns the final cost (half the sum of the loss over the residuals)."""
    if not frees:
        return 0.0
    # a start on a bound can stay stuck there (the trust region's scaling); start just inside
    inset = [1e-3 * (f.high - f.low) for f in frees]
    start = np.array([min(max(f.get(params), f.low + d), f.high - d) for f, d in zip(frees, inset, strict=True)])

    def apply(vector: np.ndarray) -> Params:
        for f, value in zip(frees, vector, strict=True):
            f.set(params, float(value))
        return params

    def objective(vector: np.ndarray) -> np.ndarray:
        return residuals(apply(vector))

    result = least_squares(
        objective,
        start,
        bounds=([f.low for f in frees], [f.high for f in frees]),
        loss="soft_l1" if robust else "linear",
        f_scale=0.05,
        x_scale="jac",
        diff_step=[1e-4] * len(frees),
    )
    apply(result.x)
    return float(result.cost)


def _prefill_host(p: Params) -> float:
    return p.step_overhead_s if p.prefill_host_s is None else p.prefill_host_s


PREFILL_HOST_NAME = "prefill_host_s"


def _fit_ttft(
    deployment: Deployment,
    params: Params,
    chunk: int,
    samples: Sequence[TtftSample],
    frees: Sequence[Free],
    residuals: Callable[[Params], np.ndarray],
) -> str:
    """Step 2's least squares, without and with a prefill step's own host time; keeps the better.

    Under ``max(GPU, host)`` the floor has no gradient where no prompt is host-bound, so the second fit
    starts it at the shortest prompts' median TTFT, host-bound. It is bounded below by the decode step's
    overhead: a prefill step launches the same layers and samples too, so its host work is not less (left
    free, it would take a share of the short tier hits' time that the load latency explains). It stands
    only when it changes some prediction and lowers the RMS error by :data:`PREFILL_FLOOR_MARGIN`.
    Returns what determined it (the requests its floor holds up), or "" when it was not kept
    (``params.prefill_host_s`` None).
    """
    params.prefill_host_s = None
    if not samples:
        _solve(frees, params, residuals)
        return ""
    shortest = min(s.prompt_tokens for s in samples)
    floored = copy.deepcopy(params)
    floored.prefill_host_s = max(
        float(np.median([s.ttft_s for s in samples if s.prompt_tokens == shortest])), params.step_overhead_s
    )
    floor = Free(PREFILL_HOST_NAME, _prefill_host, _setter(PREFILL_HOST_NAME), params.step_overhead_s, 1.0)
    plain_rms = _rms(_solve(frees, params, residuals), len(samples))
    floored_rms = _rms(_solve([*frees, floor], floored, residuals), len(samples))
    without = replace(floored, prefill_host_s=None)
    moved = (
        np.abs(predict_ttft(deployment, floored, chunk, samples) - predict_ttft(deployment, without, chunk, samples))
        > 1e-6
    )
    if not moved.any() or floored_rms > plain_rms - PREFILL_FLOOR_MARGIN:
        return ""
    for name, value in vars(floored).items():
        setattr(params, name, value)
    return _span([s for s, m in zip(samples, moved, strict=True) if m])


def _kv_spread(deployment: Deployment, groups: Sequence[DecodeSample]) -> bool:
    """Whether the KV the groups' steps read varies by ``KV_SPREAD`` of the weights' bytes (HBM rate determined)."""
    kv_read = [g.context_tokens * g.batch * deployment.kv_bytes_per_token_per_gpu for g in groups]
    return max(kv_read) - min(kv_read) >= KV_SPREAD * deployment.streamed_weight_bytes_per_gpu


def _rms(cost: float, residuals: int) -> float:
    """Root mean square relative error from a least-squares cost (half the sum of squared residuals)."""
    return float(np.sqrt(2.0 * cost / max(1, residuals)))


def _spread(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) >= SPREAD * min(positive)


def _free(attribute: str, low: float, high: float) -> Free:
    """A free parameter that is an attribute of :class:`Params`."""
    return Free(attribute, _getter(attribute), _setter(attribute), low, high)


def _setter(attribute: str) -> Callable[[Params, float], None]:
    return lambda p, v: setattr(p, attribute, v)


def _getter(attribute: str) -> Callable[[Params], float]:
    return lambda p: float(getattr(p, attribute))


def _keyed(table: str, key: str) -> tuple[Callable[[Params], float], Callable[[Params, float], None]]:
    def get(p: Params) -> float:
        return getattr(p, table)[key]  # type: ignore[no-any-return]

    def put(p: Params, v: float) -> None:
        getattr(p, table)[key] = v

    return get, put


def cells_of(samples: Sequence[TtftSample]) -> dict[tuple[str, int, int], list[TtftSample]]:
    cells: dict[tuple[str, int, int], list[TtftSample]] = defaultdict(list)
    for s in samples:
        cells[(s.arm, s.context_tokens, s.turn)].append(s)
    return cells


def _memory_binds(deployment: Deployment, params: Params, groups: Sequence[DecodeSample]) -> bool:
    """Whether any group's decode step is as long as its GPU part (weights and KV reads), so that the HBM
    rate shows in it; an eager-mode step's host work often outlasts it."""
    for g in groups:
        work = StepWork()
        for _ in range(max(1, round(g.batch))):
            work.add_decode(g.context_tokens)
        cost = timing_of(deployment, params, g.backend).cost(work)
        if cost.gpu_s >= cost.overhead_s + cost.host_s:
            return True
    return False


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


def front_slope(samples: Sequence[FrontSample]) -> float:
    """Seconds per 1000 prompt tokens: the least-squares slope of the median front time per (run, context length,
    turn) against the median prompt length (the intercept is not the overhead's: LMCache's log times relative to
    the arm's fastest request). Never below 0."""
    cells: dict[tuple[str, int, int], list[FrontSample]] = defaultdict(list)
    for s in samples:
        cells[(s.run, s.context_tokens, s.turn)].append(s)
    x = np.array([np.median([s.prompt_tokens for s in cell]) / 1000 for cell in cells.values()])
    y = np.array([np.median([s.front_s for s in cell]) for cell in cells.values()])
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return 0.0
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    return max(slope, 0.0)


def _front_source(samples: Sequence[FrontSample]) -> str:
    lengths = sorted({s.context_tokens for s in samples})
    runs = ", ".join(sorted({s.run for s in samples}))
    span = f"{lengths[0]:,}-{lengths[-1]:,} tokens ({runs})"
    if samples[0].source == ENGINE_CLOCK:
        return (
            f"slope of the client's TTFT minus the engine's queue and prefill time (the engine's histograms) vs "
            f"prompt length, {len(samples)} groups of requests, {span}"
        )
    return (
        f"slope of the time before the scheduler's LMCache lookup (LMCache's log) vs prompt length, "
        f"{len(samples)} requests, {span}"
    )


def _span(samples: Sequence[TtftSample]) -> str:
    if not samples:
        return "no requests"
    lengths = sorted({s.context_tokens for s in samples})
    return f"{len(samples)} requests, {lengths[0]:,}-{lengths[-1]:,} tokens"


# -- the fit, step by step ----------------------------------------------------------------------


@dataclass(frozen=True)
class Gathered:
    """The runs' samples, split into fitted and held out, and what the runs say about their deployment."""

    facts: list[RunFacts]
    fit: FitData
    held: FitData
    backend_facts: dict[str, ArmFacts]
    backends: list[str]
    warnings: list[str]


def read_deployment(paths: Sequence[Path], model: str | None, hardware: str | None) -> list[RunFacts]:
    """Each run's facts; an error naming both when two runs are of different deployments."""
    if not paths:
        raise CalibrationError("give at least one run directory")
    facts = [run_facts(path, model, hardware) for path in paths]
    first = facts[0]
    for other in facts[1:]:
        if not other.deployment.agrees(first.deployment):
            raise CalibrationError(
                f"{other.source.path} is {other.deployment.label} but {first.source.path} is "
                f"{first.deployment.label}: calibrate one deployment at a time"
            )
    return facts


def gather(
    paths: Sequence[Path], facts: Sequence[RunFacts], holdout: Sequence[int], holdout_loads: Sequence[float]
) -> Gathered:
    """Every run's samples (:func:`collect`), outliers left out and named (:func:`drop_outliers`)."""
    fit, held = FitData(), FitData()
    backend_facts: dict[str, ArmFacts] = {}
    for path, fact in zip(paths, facts, strict=True):
        part_fit, part_held = collect(path, fact, holdout, holdout_loads)
        fit.add(part_fit)
        held.add(part_held)
        backend_facts.update({a.backend: a for a in fact.arms.values() if a.backend is not None})
    fit.ttft, warnings = drop_outliers(fit.ttft)
    if not fit.ttft and not fit.decode:
        raise CalibrationError(
            f"{', '.join(map(str, paths))}: no measured requests to fit outside the held-out lengths {list(holdout)}"
            + (f" and loads {list(holdout_loads)}" if holdout_loads else "")
        )
    backends = sorted({s.backend for s in fit.ttft if s.backend is not None} | set(backend_facts))
    return Gathered(list(facts), fit, held, backend_facts, backends, warnings)


OUTLIER_FACTOR = 3.0
"""A request whose TTFT is more than this factor off its cell's median (or not positive) is left out of the fit."""


def drop_outliers(samples: Sequence[TtftSample]) -> tuple[list[TtftSample], list[str]]:
    """The samples without outliers, and one warning per cell that had any.

    An outlier is a TTFT that is not positive or lies more than :data:`OUTLIER_FACTOR` from its cell's median
    (arm, context, turn): a clock step or a stalled request, which a least-squares fit would follow far enough
    to move every efficiency to a bound.
    """
    kept: list[TtftSample] = []
    warnings: list[str] = []
    for (arm, context, turn), cell in sorted(cells_of(samples).items()):
        positive = [s.ttft_s for s in cell if s.ttft_s > 0]
        median = float(np.median(positive)) if positive else 0.0
        good = [s for s in cell if s.ttft_s > 0 and median / OUTLIER_FACTOR <= s.ttft_s <= median * OUTLIER_FACTOR]
        dropped = [s.ttft_s for s in cell if s not in good]
        if dropped:
            shown = ", ".join(f"{t * 1e3:.0f} ms" for t in dropped)
            warnings.append(
                f"outlier: {len(dropped)} of {len(cell)} requests of {arm} {context:,} tokens turn {turn} left out "
                f"of the fit (TTFT {shown}; the cell's median is {median * 1e3:.0f} ms)"
            )
        kept += good
    return kept, warnings


def starting_params(deployment: Deployment, backends: Sequence[str]) -> Params:
    """The datasheet's efficiencies and a backend at 25 GB/s without fixed costs: where every fit starts."""
    hw = deployment.hardware
    params = Params(linear=hw.mfu, attention=hw.mfu, hbm=hw.hbm_efficiency)
    for b in backends:
        params.load_s_per_gb[b] = 1 / 25.0
        params.load_latency_s[b] = 0.0
        params.store_s_per_gb[b] = 0.0
        params.store_latency_s[b] = 0.0
        params.busy_intake_s[b] = 0.0
        params.step_extra_s[b] = 0.0
    return params


def fit_front_growth(samples: Sequence[FrontSample], params: Params) -> list[FrontSample]:
    """Step 0: the request overhead's growth with the prompt, where the engine's clock or LMCache's log times the
    requests' way in; fixed here, so the TTFT fit leaves it out of the GEMM rate and the load rates. Returns the
    samples it was fitted from (none: not determined)."""
    fronts = front_samples(samples)
    if not _spread([float(s.context_tokens) for s in fronts]):
        return []
    params.overhead_s_per_ktoken = front_slope(fronts)
    return fronts


@dataclass
class DecodeFit:
    """Step 1: the decode step's parameters, in stages.

    The GPU's HBM rate from the probe runs' batch-1 steps (their contexts span 1k-128k), then the host's
    step overhead and per-sequence cost from the sweeps' load points, where capacity is decided (a probe's
    steps ran on an otherwise idle engine: on the 1x H100, 14.6 ms mean at batch 1 against 17-23 ms at
    batch 2.5-9 in the sweep). A backend's ``step_extra_s`` is fitted against the arm without a tier.
    """

    deployment: Deployment
    probe_groups: list[DecodeSample]
    sweep_groups: list[DecodeSample]
    stages: list[tuple[list[DecodeSample], list[Free]]]

    @classmethod
    def plan(cls, deployment: Deployment, samples: Sequence[DecodeSample], backends: Sequence[str]) -> DecodeFit:
        probe = decode_groups([s for s in samples if s.load is None])
        sweep = decode_groups([s for s in samples if s.load is not None])
        overhead = _free("step_overhead_s", 0.0, 0.5)
        hbm = _free("hbm", 0.05, 1.0)
        per_seq = _free("step_s_per_seq", 0.0, 0.05)
        extras = [
            Free(f"step_extra_s[{b}]", *_keyed("step_extra_s", b), 0.0, 0.5)
            for b in backends
            if any(g.backend is None for g in probe) and any(g.backend == b for g in probe)
        ]
        stages: list[tuple[list[DecodeSample], list[Free]]] = []
        if probe:
            stages.append((probe, [overhead, *([hbm] if _kv_spread(deployment, probe) else []), *extras]))
        if sweep:
            batches = [g.batch for g in sweep]
            frees = [overhead]
            if max(batches) >= BATCH_SPREAD * min(batches):
                frees.append(per_seq)
            if not probe and _kv_spread(deployment, sweep):
                frees.append(hbm)
            stages.append((sweep, frees))
        return cls(deployment, probe, sweep, stages)

    @property
    def free_names(self) -> set[str]:
        return {f.name for _, stage in self.stages for f in stage}

    def run(self, params: Params, first: bool) -> None:
        """Fit every stage with squared residuals (a group's mean step already pools its requests, and slow
        stretches are real steps). ``first``: choose between the host-bound and memory-bound starts."""
        for groups, stage in self.stages:
            measured = np.array([g.step_s for g in groups])

            def residuals(
                p: Params, groups: list[DecodeSample] = groups, measured: np.ndarray = measured
            ) -> np.ndarray:
                return np.asarray(predict_decode(self.deployment, p, groups) / measured - 1.0, dtype=float)

            if first and any(f.name == "step_overhead_s" for f in stage):
                self._best_start(params, groups, stage, residuals)
            else:
                _solve(stage, params, residuals, robust=False)

    def _best_start(
        self, params: Params, groups: list[DecodeSample], stage: list[Free], residuals: Callable[[Params], np.ndarray]
    ) -> None:
        """A step is max(GPU, host): a parameter of the side that does not bind has no gradient, so start
        host-bound (from the datasheet's 1 ms the memory time binds every step and the fit would explain
        eager-mode steps by a slow HBM) and, where the HBM rate is free, also with the group that reads the most
        memory-bound; keep the memory-bound reading only when it fits clearly better (by
        :data:`MEMORY_BOUND_MARGIN`: where both fit to rounding the HBM rate is not identified)."""
        params.step_overhead_s = float(min(g.step_s for g in groups))
        starts = [copy.deepcopy(params)]
        hbm = next((f for f in stage if f.name == "hbm"), None)
        if hbm is not None:
            heaviest = max(groups, key=lambda g: g.batch * g.context_tokens)
            dep = self.deployment
            reads = dep.streamed_weight_bytes_per_gpu + (
                heaviest.batch * heaviest.context_tokens * dep.kv_bytes_per_token_per_gpu
            )
            bound = copy.deepcopy(params)
            bound.hbm = min(max(reads / (dep.hardware.hbm_bytes_per_s * heaviest.step_s), hbm.low), hbm.high)
            starts.append(bound)
        fits = [(_rms(_solve(stage, start, residuals, robust=False), len(groups)), start) for start in starts]
        best = fits[0][1]
        for rms, start in fits[1:]:
            if rms < fits[0][0] - MEMORY_BOUND_MARGIN:
                best = start
        for name, value in vars(best).items():
            setattr(params, name, value)


@dataclass(frozen=True)
class TtftFit:
    """Step 2's outcome: the free parameters' names, and the requests a prefill step's own host time holds up
    ("" when it was not kept)."""

    free_names: set[str]
    prefill_floor: str


def ttft_frees(samples: Sequence[TtftSample], backends: Sequence[str], front_fitted: bool) -> list[Free]:
    """The TTFT parameters these requests determine; each needs its own spread of the data (module docstring)."""
    frees: list[Free] = []
    if not samples:
        return frees
    frees.append(_free("overhead_s", 0.0, 2.0))
    # intercept and slope need whole prompts computed at lengths SPREAD apart: over one length they are one number
    computed = [float(s.prompt_tokens) for s in samples if s.loaded_tokens == 0 and 2 * s.hbm_tokens < s.prompt_tokens]
    if _spread(computed):
        frees.append(_free("linear", 0.02, 1.0))
    if any(s.hbm_tokens >= s.prompt_tokens // 2 for s in samples) and not front_fitted:
        frees.append(_free("overhead_s_per_ktoken", 0.0, 1.0))
    if any(s.prompt_tokens >= ATTENTION_MIN_TOKENS for s in samples) and _spread(computed):
        frees.append(_free("attention", 0.02, 1.0))
    no_tier = any(s.backend is None for s in samples)
    for b in backends:
        loads = [float(s.loaded_tokens) for s in samples if s.backend == b and s.loaded_tokens > 0]
        if loads:
            frees.append(Free(f"load_s_per_gb[{b}]", *_keyed("load_s_per_gb", b), 1e-3, 10.0))
        if _spread(loads):
            frees.append(Free(f"load_latency_s[{b}]", *_keyed("load_latency_s", b), 0.0, 2.0))
        if no_tier and any(s.backend == b for s in samples):
            frees.append(Free(f"store_s_per_gb[{b}]", *_keyed("store_s_per_gb", b), 0.0, 10.0))
            if _spread([float(s.prompt_tokens) for s in samples if s.backend == b and s.loaded_tokens == 0]):
                frees.append(Free(f"store_latency_s[{b}]", *_keyed("store_latency_s", b), 0.0, 2.0))
    return frees


def fit_ttft(
    deployment: Deployment,
    params: Params,
    chunk: int,
    samples: Sequence[TtftSample],
    backends: Sequence[str],
    front_fitted: bool,
) -> TtftFit:
    """Step 2: unloaded TTFT of the probe runs' requests (relative residuals, ``soft_l1``)."""
    frees = ttft_frees(samples, backends, front_fitted)
    measured = np.array([s.ttft_s for s in samples])

    def residuals(p: Params) -> np.ndarray:
        return np.asarray(predict_ttft(deployment, p, chunk, samples) / measured - 1.0, dtype=float)

    floor = _fit_ttft(deployment, params, chunk, samples, frees, residuals)
    return TtftFit({f.name for f in frees} | ({PREFILL_HOST_NAME} if floor else set()), floor)


def fit_blocking(
    deployment: Deployment, params: Params, windows: Sequence[StepsWindow], backends: Sequence[str]
) -> tuple[DecodeWindows, set[str]]:
    """Step 3: the engine-blocking share of the request overhead and each backend's ``busy_intake_s``, from
    sweep requests' whole decode windows, the other parameters fixed."""
    fitted = decode_windows(deployment, params, windows)
    frees: list[Free] = []
    if fitted.requests and float(fitted.intake_s.sum()) > 0:
        frees.append(_free("blocking_share", 0.0, 1.0))
    for b in backends:
        if float(fitted.arrivals[[x == b for x in fitted.backends]].sum()) > 0:
            frees.append(Free(f"busy_intake_s[{b}]", *_keyed("busy_intake_s", b), 0.0, 0.5))

    def residuals(p: Params) -> np.ndarray:
        return np.asarray(fitted.predicted_s(p) / fitted.measured_s - 1.0, dtype=float)

    _solve(frees, params, residuals)
    return fitted, {f.name for f in frees}


def settle_hbm(deployment: Deployment, params: Params, decode: DecodeFit, free_names: set[str]) -> str:
    """Where no decode step is memory-bound the HBM rate changed no prediction: back to the datasheet's, and
    the reason it was not fitted."""
    if "hbm" in free_names and not _memory_binds(deployment, params, [*decode.probe_groups, *decode.sweep_groups]):
        params.hbm = deployment.hardware.hbm_efficiency
        free_names.discard("hbm")
        return "every decode step is host-bound (its host work outlasts its weight and KV reads): datasheet"
    return f"KV read per step varies by less than {KV_SPREAD:g}x the weights: datasheet"


BOUND_SHARE = 1e-4
"""A fitted value within this share of a (non-zero) bound is reported as stuck there; 0 is a physical value
(no cost), not a bound the data pushed the fit against."""


def bound_warnings(params: Params, free_names: set[str], frees: Sequence[Free]) -> list[str]:
    """A fitted parameter that ended on its bound is not determined by the runs: one warning each."""
    out: list[str] = []
    for f in frees:
        if f.name not in free_names:
            continue
        value = f.get(params)
        for bound in (f.low, f.high):
            if bound != 0.0 and abs(value - bound) <= BOUND_SHARE * abs(bound):
                out.append(
                    f"not identified: {f.name} = {value:.6g} ended on its bound {bound:g}; the runs do not "
                    "determine it (too few lengths, or outliers)"
                )
    return out


def calibrate(
    paths: Sequence[Path],
    holdout: Sequence[int] = (),
    model: str | None = None,
    hardware: str | None = None,
    holdout_loads: Sequence[float] = (),
) -> Calibration:
    """Fit a calibration from run directories (all of one deployment); ``holdout`` lengths (probe runs) and
    ``holdout_loads`` (sweep load points) are not fitted. Steps 1 and 2 alternate (the prefill efficiencies
    enter large-batch decode steps, the step overhead enters prefill steps), then 3."""
    facts = read_deployment(paths, model, hardware)
    deployment = facts[0].deployment.resolve()
    chunk = facts[0].max_batch_tokens
    data = gather(paths, facts, holdout, holdout_loads)
    params = starting_params(deployment, data.backends)

    fronts = fit_front_growth(data.fit.front, params)
    decode = DecodeFit.plan(deployment, data.fit.decode, data.backends)
    decode.run(params, first=True)
    ttft = fit_ttft(deployment, params, chunk, data.fit.ttft, data.backends, bool(fronts))
    decode.run(params, first=False)
    windows, blocking_names = fit_blocking(deployment, params, data.fit.windows, data.backends)

    free_names = ttft.free_names | decode.free_names | blocking_names | ({"overhead_s_per_ktoken"} if fronts else set())
    hbm_why = settle_hbm(deployment, params, decode, free_names)
    all_frees = [
        *ttft_frees(data.fit.ttft, data.backends, bool(fronts)),
        *(f for _, stage in decode.stages for f in stage),
    ]
    warnings = [*data.warnings, *bound_warnings(params, free_names, all_frees)]
    why = Why(data, ttft.prefill_floor, fronts, windows, hbm_why)
    calibration = assemble(data, params, free_names, why, chunk, holdout, holdout_loads, warnings)
    return calibration.model_copy(
        update={
            "residuals": residuals(calibration, deployment, data.fit.ttft, data.held.ttft),
            "decode_residuals": decode_fit_residuals(calibration, deployment, data.fit.decode, data.held.decode),
            "tpot_residuals": window_fit_residuals(calibration, deployment, data.fit.windows, data.held.windows),
        }
    )


# -- writing the calibration: each parameter with what determined it, or why it kept its default ----------------


@dataclass(frozen=True)
class Why:
    """What the steps used, for the parameters' ``source`` texts."""

    data: Gathered
    prefill_floor: str
    fronts: list[FrontSample]
    windows: DecodeWindows
    hbm_why: str

    @property
    def runs(self) -> str:
        return ", ".join(f.source.run_id for f in self.data.facts)

    @property
    def probe_runs(self) -> str:
        return ", ".join(f.source.run_id for f in self.data.facts if f.kind == "probe") or "no probe run"


def _param_maker(free_names: set[str]) -> Callable[[str, float, str, str, str], FitParam]:
    def param(name: str, value: float, unit: str, source: str, default_why: str) -> FitParam:
        fitted = name in free_names
        return FitParam(value=value, unit=unit, fitted=fitted, source=source if fitted else default_why)

    return param


def backend_params(b: str, params: Params, free_names: set[str], why: Why) -> BackendCalibration:
    """One offload backend's entry."""
    param = _param_maker(free_names)
    samples = why.data.fit.ttft
    mine = [s for s in samples if s.backend == b]
    hits = [s for s in mine if s.loaded_tokens > 0]
    no_tier = _span([s for s in samples if s.backend is None])
    arm = why.data.backend_facts.get(b)
    sweep_requests = sum(x == b for x in why.windows.backends)
    return BackendCalibration(
        version=arm.version if arm else None,
        tier=arm.tier if arm and arm.tier else "cpu",
        load_gbps=param(
            f"load_s_per_gb[{b}]",
            1.0 / params.load_s_per_gb[b],
            "GB/s",
            f"tier hits of {_span(hits)} ({why.probe_runs})",
            "no tier hits in the fitted requests: default",
        ),
        load_latency_s=param(
            f"load_latency_s[{b}]",
            params.load_latency_s[b],
            "s",
            f"intercept of load time vs loaded bytes, {_span(hits)}",
            "loads of one size only: the latency is folded into the load rate",
        ),
        store_s_per_gb=param(
            f"store_s_per_gb[{b}]",
            params.store_s_per_gb[b],
            "s/GB",
            f"turn-1 TTFT of {_span(mine)} against {no_tier} without a tier",
            "no arm without a tier: the store cost is folded into the prefill efficiencies",
        ),
        store_latency_s=param(
            f"store_latency_s[{b}]",
            params.store_latency_s[b],
            "s",
            f"intercept of the arm's extra TTFT vs prompt length, {_span(mine)} against {no_tier} without a tier",
            f"no arm without a tier, or computed prompts differ by less than {SPREAD:g}x: in the request overhead",
        ),
        step_extra_s=param(
            f"step_extra_s[{b}]",
            params.step_extra_s[b],
            "s per engine step",
            f"decode steps of the arm with this backend against the arm without a tier ({why.probe_runs})",
            "no probe run with this backend's arm and an arm without a tier: 0",
        ),
        busy_intake_s=param(
            f"busy_intake_s[{b}]",
            params.busy_intake_s[b],
            "s per request arriving at a busy engine",
            f"decode windows of {sweep_requests} sweep requests of the arm with this backend ({why.runs})",
            "no sweep of an arm with this backend whose engine steps can be reconstructed: 0",
        ),
    )


def assemble(
    data: Gathered,
    params: Params,
    free_names: set[str],
    why: Why,
    chunk: int,
    holdout: Sequence[int],
    holdout_loads: Sequence[float],
    warnings: list[str],
) -> Calibration:
    """The calibration file's content; its residuals are empty until the caller adds them."""
    param = _param_maker(free_names)
    samples = data.fit.ttft
    decode_span = f"{_decode_span(data.fit.decode)} ({why.runs})"
    growth = _front_source(why.fronts) if why.fronts else "requests served from the HBM prefix cache"
    return Calibration(
        deployment=data.facts[0].deployment,
        sources=[f.source for f in data.facts],
        fit_context_tokens=sorted({s.context_tokens for s in samples}),
        holdout_context_tokens=sorted(set(holdout)),
        holdout_loads=sorted({float(x) for x in holdout_loads}),
        max_batch_tokens=chunk,
        request_overhead_s=param(
            "overhead_s",
            params.overhead_s,
            "s",
            f"intercept of TTFT vs prompt length, {_span(samples)} ({why.probe_runs})",
            "no probe requests",
        ),
        request_overhead_s_per_ktoken=param(
            "overhead_s_per_ktoken",
            params.overhead_s_per_ktoken,
            "s per 1000 prompt tokens",
            growth,
            "no requests served from the HBM prefix cache: the growth is in the linear efficiency and load rates",
        ),
        linear_efficiency=param(
            "linear",
            params.linear,
            "fraction of dense peak",
            f"slope of TTFT vs prompt length, {_span(samples)}",
            f"computed prompts differ by less than {SPREAD:g}x (or no probe requests): datasheet",
        ),
        attention_efficiency=param(
            "attention",
            params.attention,
            "fraction of BF16 dense peak",
            f"curvature of TTFT vs prompt length, {_span(samples)}",
            f"no prompts of {ATTENTION_MIN_TOKENS:,}+ tokens among lengths {SPREAD:g}x apart: datasheet",
        ),
        step_overhead_s=param(
            "step_overhead_s", params.step_overhead_s, "s", decode_span, "no output of 2+ tokens: default"
        ),
        step_s_per_seq=param(
            "step_s_per_seq",
            params.step_s_per_seq,
            "s per sequence in the step",
            decode_span,
            f"decode batches differ by less than {BATCH_SPREAD:g}x (no sweep): in the step overhead",
        ),
        hbm_efficiency=param("hbm", params.hbm, "fraction of HBM bandwidth", decode_span, why.hbm_why),
        prefill_host_s=param(
            PREFILL_HOST_NAME,
            _prefill_host(params),
            "s per prefill step",
            f"the floor of TTFT vs prompt length, {why.prefill_floor}",
            "no fitted request's prefill step is host-bound, or one more parameter fits them no better than "
            f"{PREFILL_FLOOR_MARGIN:.1%}: the step overhead",
        ),
        engine_blocking_share=param(
            "blocking_share",
            params.blocking_share,
            "fraction of the request overhead",
            f"decode windows of {len(why.windows.requests)} sweep requests (every step, arrivals' overheads "
            f"charged) ({why.runs})",
            "no sweep whose engine steps can be reconstructed: the overhead blocks nobody",
        ),
        backends={b: backend_params(b, params, free_names, why) for b in data.backends},
        warnings=warnings,
        residuals=[],
        decode_residuals=[],
        tpot_residuals=[],
    )


def window_fit_residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[StepsWindow], held: Sequence[StepsWindow]
) -> list[DecodeResidual]:
    """Per (run, arm, load point): median over its requests of the mean step of their whole decode windows,
    measured vs predicted (every step's modelled time plus the intake charged to it), fitted and held out."""
    params = params_of(calibration)
    out: list[DecodeResidual] = []
    for used, windows in ((True, fitted), (False, held)):
        for w in sorted(windows, key=lambda w: (w.run, w.arm, w.load or 0.0)):
            got = decode_windows(deployment, params, [w])
            if not got.requests:
                continue
            predicted = got.predicted_s(params)
            steps = w.steps(params)
            batch = [
                float(np.mean([len(steps.decodes[k]) for k in range(steps.first[i] + 1, steps.last[i] + 1)]))
                for _, i in got.requests
            ]
            contexts = [steps.records[i].prompt_tokens or 0 for _, i in got.requests]
            out.append(
                DecodeResidual(
                    run=w.run,
                    arm=w.arm,
                    load=w.load,
                    requests=len(got.requests),
                    batch=float(np.mean(batch)),
                    context_tokens=round(float(np.mean(contexts))),
                    measured_ms=float(np.median(got.measured_s / got.steps)) * 1e3,
                    predicted_ms=float(np.median(predicted / got.steps)) * 1e3,
                    used_in_fit=used,
                )
            )
    return out


def _decode_span(samples: Sequence[DecodeSample]) -> str:
    if not samples:
        return "no decode samples"
    batches = [s.batch for s in samples]
    contexts = [s.context_tokens for s in samples]
    return (
        f"decode steps of {len(samples)} requests (inter-token gaps while no other request prefilled), "
        f"batch {min(batches):.1f}-{max(batches):.1f}, context {min(contexts):,}-{max(contexts):,} tokens"
    )


def decode_fit_residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[DecodeSample], held: Sequence[DecodeSample]
) -> list[DecodeResidual]:
    """Mean decode step per (run, arm, load point or probe length), measured vs predicted, fitted and held out."""
    params = params_of(calibration)
    out: list[DecodeResidual] = []
    for used, samples in ((True, fitted), (False, held)):
        groups = decode_groups(samples)
        for group, predicted in zip(groups, predict_decode(deployment, params, groups), strict=True):
            out.append(
                DecodeResidual(
                    run=group.run,
                    arm=group.arm,
                    load=group.load,
                    requests=group.requests,
                    batch=group.batch,
                    context_tokens=group.context_tokens,
                    measured_ms=group.step_s * 1e3,
                    predicted_ms=float(predicted) * 1e3,
                    used_in_fit=used,
                )
            )
    return out


def residuals(
    calibration: Calibration, deployment: Deployment, fitted: Sequence[TtftSample], held: Sequence[TtftSample]
) -> list[Residual]:
    """Median predicted vs measured TTFT per (arm, context, turn), for fitted and held-out requests."""
    params = params_of(calibration)
    out: list[Residual] = []
    for used, samples in ((True, fitted), (False, held)):
        for (arm, context, turn), cell in sorted(cells_of(samples).items()):
            predicted = predict_ttft(deployment, params, calibration.max_batch_tokens, cell)
            out.append(
                Residual(
                    arm=arm,
                    backend=cell[0].backend or "none",
                    context_tokens=context,
                    turn=turn,
                    requests=len(cell),
                    measured_ms=float(np.median([s.ttft_s for s in cell])) * 1e3,
                    predicted_ms=float(np.median(predicted)) * 1e3,
                    used_in_fit=used,
                )
            )
    return out


def params_of(calibration: Calibration) -> Params:
    """The fit's working parameters back from a calibration file."""
    return Params(
        overhead_s=calibration.request_overhead_s.value,
        overhead_s_per_ktoken=calibration.request_overhead_s_per_ktoken.value,
        linear=calibration.linear_efficiency.value,
        attention=calibration.attention_efficiency.value,
        hbm=calibration.hbm_efficiency.value,
        step_overhead_s=calibration.step_overhead_s.value,
        step_s_per_seq=calibration.step_s_per_seq.value,
        blocking_share=calibration.engine_blocking_share.value,
        load_s_per_gb={b: 1.0 / c.load_gbps.value for b, c in calibration.backends.items()},
        load_latency_s={b: c.load_latency_s.value for b, c in calibration.backends.items()},
        store_s_per_gb={b: c.store_s_per_gb.value for b, c in calibration.backends.items()},
        store_latency_s={b: c.store_latency_s.value for b, c in calibration.backends.items()},
        busy_intake_s={b: c.busy_intake_s.value for b, c in calibration.backends.items()},
        step_extra_s={b: c.step_extra_s.value for b, c in calibration.backends.items()},
        prefill_host_s=calibration.fitted_prefill_host_s,
    )
