"""Compute, load, or both: turn-2 TTFT against tier read bandwidth (``kvbench sim whatif``).

For each context length ``N`` (tokens) and tier read bandwidth ``B`` (GB/s) the simulator's engine
core -- the same code as ``kvbench sim serve``, driven on a virtual clock, so nothing sleeps --
runs a returning user:

1. turn 1: the first ``N - Q`` tokens of the prompt, one output token; at completion its KV is
   written to a CPU tier (read and write bandwidth ``B``, 10 us latency, 64 GB);
2. the tier writes finish, the HBM prefix cache is reset (the GPU forgot the KV);
3. turn 2: the whole ``N``-token prompt (the cached ``N - Q`` plus ``Q`` new tokens, e.g. a
   follow-up question); its TTFT is what is reported.

``N`` is capped at ``max_model_len - 1`` (one output token must fit). Turn 2 runs in four modes:

* ``compute-only``: no tier, all ``N`` tokens are recomputed (independent of ``B``);
* ``load-only``: ``load_overlap: none`` -- load the cached prefix, then prefill the new tokens;
* ``layerwise``: ``load_overlap: layerwise`` -- the new tokens' prefill pipelines behind the load;
* ``bidirectional``: ``load_overlap: bidirectional`` (Cake) -- recompute the prefix's head while
  loading its tail, then prefill the new tokens.

Gains are ratios of TTFTs (dimensionless): ``gain vs X = TTFT_X / TTFT_bidirectional``. All times
are modelled (the simulator's profiles), not measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.csvfile import write_csv_rows
from common.png import save_titled_png
from harness.sim.scheduler import EngineCore, SimRequest, ignore_event
from harness.sim.settings import SimSettings
from offload.profiles import LoadOverlap, OffloadProfile, OffloadTier

Mode = Literal["compute-only", "load-only", "layerwise", "bidirectional"]
MODES: tuple[Mode, ...] = ("compute-only", "load-only", "layerwise", "bidirectional")
OVERLAP: dict[Mode, LoadOverlap] = {"load-only": "none", "layerwise": "layerwise", "bidirectional": "bidirectional"}

DEFAULT_TOKENS: tuple[int, ...] = (32768, 131072)
DEFAULT_READ_GBPS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0, 25.0, 50.0)
DEFAULT_NEW_TOKENS = 128


@dataclass(frozen=True)
class WhatIfPoint:
    """Turn-2 TTFT of one mode at one context length and tier read bandwidth."""

    tokens: int
    """Turn-2 prompt length (tokens)."""
    read_gbps: float
    mode: Mode
    ttft_s: float
    cached_tokens: int
    """Tokens whose KV was not computed in turn 2 (loaded from the tier)."""
    new_tokens: int
    """Turn-2 prompt tokens beyond the turn-1 KV stored in the tier (computed in every mode)."""


def _run(core: EngineCore, request: SimRequest, now: float) -> float:
    """Run ``request`` to completion on a virtual clock starting at ``now``; returns the end time."""
    core.add_request(request, now)
    while core.has_work:
        plan = core.plan(now)
        if plan is None:
            wakeup = core.next_wakeup()
            if wakeup is None:
                raise RuntimeError("the engine has work but nothing can run and nothing is loading")
            now = max(now, wakeup)
            continue
        now += plan.seconds
        core.complete(plan, now)
    return now


def turn2_prompt(tokens: int, new_tokens: int, max_model_len: int) -> list[int]:
    """Turn 2's prompt: ``tokens`` distinct token ids (at most ``max_model_len - 1``, room for one answer token),
    whose last ``new_tokens`` turn 1 did not send; ValueError unless both turns have at least one token."""
    prompt_tokens = min(tokens, max_model_len - 1)
    if not 0 < new_tokens < prompt_tokens:
        raise ValueError(f"new_tokens must be between 1 and {prompt_tokens - 1}, got {new_tokens}")
    return list(range(1000, 1000 + prompt_tokens))


def turn2(settings: SimSettings, tokens: int, new_tokens: int) -> tuple[float, int, int]:
    """(TTFT s, cached tokens, prompt tokens) of turn 2 in one fresh engine (see the module docstring)."""
    core = EngineCore(settings)
    prompt = turn2_prompt(tokens, new_tokens, core.max_model_len)
    now = _run(core, SimRequest("turn-1", prompt[:-new_tokens], 1, ignore_event), 0.0)
    now = max([now, *(tier.write_busy_until for tier in core.tiers.tiers)])
    core.reset_prefix_cache()
    second = SimRequest("turn-2", prompt, 1, ignore_event)
    _run(core, second, now)
    assert second.first_token_at is not None
    return second.first_token_at - second.arrival, second.cached_tokens or 0, len(prompt)


def settings_for(model: str, hardware: str, mode: Mode, read_gbps: float, capacity_gb: float = 64) -> SimSettings:
    """The simulator settings of one mode: a CPU tier of ``capacity_gb`` at ``read_gbps`` (none for compute-only)."""
    if mode == "compute-only":
        profile = OffloadProfile(name="compute-only", prefix_caching=True)
    else:
        tier = OffloadTier(
            kind="cpu", capacity_gb=capacity_gb, read_gbps=read_gbps, write_gbps=read_gbps, latency_us=10
        )
        profile = OffloadProfile(name=f"cpu-{read_gbps:g}GBps-{mode}", tiers=(tier,), load_overlap=OVERLAP[mode])
    return SimSettings(model=model, hardware=hardware, offload=profile)


def run_whatif(
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    tokens: Sequence[int] = DEFAULT_TOKENS,
    read_gbps: Sequence[float] = DEFAULT_READ_GBPS,
    new_tokens: int = DEFAULT_NEW_TOKENS,
) -> list[WhatIfPoint]:
    """Every (tokens, bandwidth, mode) point, in that order."""
    points: list[WhatIfPoint] = []
    for length in tokens:
        cold: tuple[float, int, int] | None = None
        for bandwidth in read_gbps:
            for mode in MODES:
                if mode == "compute-only" and cold is not None:
                    ttft, cached, prompt = cold  # no tier: the same for every bandwidth
                else:
                    ttft, cached, prompt = turn2(settings_for(model, hardware, mode, bandwidth), length, new_tokens)
                    if mode == "compute-only":
                        cold = (ttft, cached, prompt)
                points.append(WhatIfPoint(prompt, bandwidth, mode, ttft, cached, prompt - _stored(prompt, new_tokens)))
    return points


def _stored(prompt_tokens: int, new_tokens: int, chunk_tokens: int = 256) -> int:
    """Turn-1 tokens whose KV the tier holds: the full chunks of the turn-1 prompt and its output token."""
    return (prompt_tokens - new_tokens + 1) // chunk_tokens * chunk_tokens


@dataclass(frozen=True)
class Row:
    """One (tokens, bandwidth) row of the table: TTFT per mode and bidirectional's gains."""

    tokens: int
    read_gbps: float
    ttft_s: dict[Mode, float]
    loaded_tokens: int
    """Tokens bidirectional loads (the rest of the cached prefix is recomputed)."""
    new_tokens: int

    @property
    def gain_vs_compute(self) -> float:
        return self.ttft_s["compute-only"] / self.ttft_s["bidirectional"]

    @property
    def gain_vs_load(self) -> float:
        return self.ttft_s["load-only"] / self.ttft_s["bidirectional"]

    @property
    def gain_vs_better(self) -> float:
        return min(self.ttft_s["compute-only"], self.ttft_s["load-only"]) / self.ttft_s["bidirectional"]


def rows(points: Sequence[WhatIfPoint]) -> list[Row]:
    grouped: dict[tuple[int, float], dict[Mode, WhatIfPoint]] = {}
    for point in points:
        grouped.setdefault((point.tokens, point.read_gbps), {})[point.mode] = point
    out: list[Row] = []
    for (length, bandwidth), by_mode in grouped.items():
        out.append(
            Row(
                length,
                bandwidth,
                {mode: by_mode[mode].ttft_s for mode in MODES},
                by_mode["bidirectional"].cached_tokens,
                by_mode["bidirectional"].new_tokens,
            )
        )
    return out


@dataclass(frozen=True)
class Gains:
    """Arithmetic means over the grid of bidirectional's TTFT gains (dimensionless)."""

    vs_compute: float
    vs_load: float
    vs_mean_of_both: float
    """Mean of the two gains above, point by point (the comparison Cake reports)."""
    vs_better: float
    max_vs_better: float


def gains(table: Sequence[Row]) -> Gains:
    return Gains(
        vs_compute=statistics.fmean(r.gain_vs_compute for r in table),
        vs_load=statistics.fmean(r.gain_vs_load for r in table),
        vs_mean_of_both=statistics.fmean((r.gain_vs_compute + r.gain_vs_load) / 2 for r in table),
        vs_better=statistics.fmean(r.gain_vs_better for r in table),
        max_vs_better=max(r.gain_vs_better for r in table),
    )


def markdown_table(table: Sequence[Row]) -> str:
    """The table as Markdown: TTFT in ms per mode, bidirectional's gains and its loaded share."""
    head = (
        "| tokens | read GB/s | compute-only ms | load-only ms | layerwise ms | bidirectional ms "
        "| gain vs compute | gain vs load | gain vs better | loaded by bidirectional |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = [
        f"| {r.tokens:,} | {r.read_gbps:g} | {r.ttft_s['compute-only'] * 1e3:.1f} | {r.ttft_s['load-only'] * 1e3:.1f} "
        f"| {r.ttft_s['layerwise'] * 1e3:.1f} | {r.ttft_s['bidirectional'] * 1e3:.1f} | {r.gain_vs_compute:.2f}x "
        f"| {r.gain_vs_load:.2f}x | {r.gain_vs_better:.2f}x | {r.loaded_tokens:,} of {r.tokens - r.new_tokens:,} |"
        for r in table
    ]
    return head + "\n".join(lines) + "\n"


def write_csv(points: Sequence[WhatIfPoint], path: Path) -> None:
    write_csv_rows(
        path,
        ["tokens", "read_gbps", "mode", "ttft_ms", "cached_tokens", "new_tokens"],
        (
            [p.tokens, f"{p.read_gbps:g}", p.mode, f"{p.ttft_s * 1e3:.3f}", p.cached_tokens, p.new_tokens]
            for p in points
        ),
    )


def plot(points: Sequence[WhatIfPoint], path: Path, title: str) -> None:
    """TTFT against read bandwidth, one panel per context length, one line per mode (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({p.tokens for p in points})
    figure, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.2), squeeze=False)
    styles = {"compute-only": "k--", "load-only": "C0-o", "layerwise": "C2-s", "bidirectional": "C3-^"}
    for axis, length in zip(axes[0], lengths, strict=True):
        for mode in MODES:
            series = sorted((p.read_gbps, p.ttft_s) for p in points if p.tokens == length and p.mode == mode)
            axis.plot([x for x, _ in series], [y for _, y in series], styles[mode], label=mode, markersize=4)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("tier read bandwidth (GB/s)")
        axis.set_ylabel("turn-2 TTFT (s)")
        axis.set_title(f"{length:,} tokens")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    save_titled_png(figure, path, title, dpi=110)
