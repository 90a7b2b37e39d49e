"""Colocated vs prefill/decode disaggregation, with and without a CPU tier (``kvbench sim pd-whatif``).

For each context length ``N`` (tokens) a returning user runs on a fresh deployment, on a virtual clock
(:class:`harness.sim.disagg.Cluster`: the simulator's engine cores, unchanged, joined by a KV link for P/D):

1. turn 1: the first ``N - Q`` tokens, one output token; with a tier its KV is written there (P/D: by the
   prefill instance, the tier is on the prefill side);
2. the tier writes finish and every HBM prefix cache is reset (the GPUs forgot the KV);
3. turn 2: the whole ``N``-token prompt (``Q`` new tokens); its TTFT is reported, taken apart
   (:class:`harness.sim.disagg.TtftParts`: queue, load, prefill, transfer, admission, first step).

Deployments (:func:`deployments`): colocated on 1 GPU without and with a CPU tier (read ``B`` GB/s, load
overlap ``none``: load, then prefill the new tokens), and ``xPyD`` at each link bandwidth, without and with
the same tier on the prefill side. With P/D the whole prompt's KV crosses the link even when the prefix came
from the tier: ``transfer = per_transfer_s + N x KV bytes per token / link bandwidth``.

The loaded comparison (:func:`run_loaded`) reuses the fleet what-if's multi-round QA traffic and event loop
(:func:`harness.calibrate.fleet_whatif.simulate`): the same users on ``G`` GPUs as ``G`` colocated replicas
(session affinity) and as the P/D layout, at each offered rate; capacity is the highest offered rate whose
returning users' TTFT p90 stays within the SLO.

All times are modelled (the datasheet profiles, or a calibration's fitted terms with its held-out band where
one exists; the link terms are reported and assumed figures, not fitted on a measured P/D run), never measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from common.csvfile import write_csv_rows
from common.errors import CalibrationError
from common.png import save_titled_png
from harness.sim.calibration import AUTO, Calibration, pick_shipped
from harness.sim.disagg import NIXL_PULL_TCP_GBPS, NIXL_PUSH_GBPS, Cluster, Disaggregation, TtftParts
from harness.sim.heldout import band_words, file_sha256
from harness.sim.scheduler import ignore_event
from harness.sim.settings import SimSettings
from offload.profiles import TIER_DEFAULTS
from offload.shapes import Deployment

from .fleet_whatif import Setup, Traffic, simulate
from .whatif import settings_for, turn2_prompt

DEFAULT_TOKENS: tuple[int, ...] = (8192, 32768, 131072)
DEFAULT_LINK_GBPS: tuple[float, ...] = (NIXL_PUSH_GBPS, NIXL_PULL_TCP_GBPS)
DEFAULT_READ_GBPS = TIER_DEFAULTS["cpu"][0]
DEFAULT_NEW_TOKENS = 128
DEFAULT_TIER_GB = 128.0
"""CPU tier per instance (P/D: per prefill instance), GB: holds the loaded comparison's 64 users' documents
(512,000 tokens of the 8B's KV, 67 GB), which one H100's HBM does not."""


@dataclass(frozen=True)
class Calibrated:
    """A calibration the comparison runs with, and where it came from."""

    calibration: Calibration
    file: str
    """Its path, or ``auto: NAME`` for a shipped one."""
    sha256: str
    backend: str
    """The offload backend whose fitted terms the CPU tier takes (one of the calibration's)."""

    @property
    def band(self) -> str:
        """``calibration NAME: capacity held-out error ...``, or why there is no band."""
        return band_words(self.file, self.sha256)

    @property
    def tier(self) -> str:
        """The backend whose fitted load rate and latency the CPU tier takes, with its version."""
        return f"{self.backend} {self.calibration.backends[self.backend].version or ''}".strip()


def load_calibration(choice: str, model: str, hardware: str, backend: str | None = None) -> Calibrated:
    """``auto``: the shipped calibration of the deployment (CUDA graphs where both modes were measured); else a
    calibration file, which must be of this deployment (:class:`~common.errors.CalibrationError` otherwise).
    ``backend``: the tier's offload backend; None: the calibration's only one."""
    deployment = Deployment.resolve(model, hardware)
    if choice == AUTO:
        path, calibration = pick_shipped(deployment)
        file = f"{AUTO}: {path.name}"
    else:
        path, file = Path(choice), choice
        calibration = Calibration.load(path)
        calibration.check_deployment(deployment, f"calibration {path}")
    known = sorted(calibration.backends)
    if backend is None and len(known) == 1:
        backend = known[0]
    if backend is None or backend not in known:
        given = "not given" if backend is None else repr(backend)
        raise CalibrationError(f"--backend {given}: calibration {file} has fitted {', '.join(known) or 'none'}")
    return Calibrated(calibration, file, file_sha256(path), backend)


def _calibrate(settings: SimSettings, calibrated: Calibrated | None) -> SimSettings:
    """``settings`` under the calibration (its fitted terms, its prefill chunk), validated as a run's would be."""
    if calibrated is None:
        return settings
    update = {
        "offload": settings.offload.model_copy(update={"backend": calibrated.backend}),
        "calibration": calibrated.calibration,
        "calibration_file": calibrated.file,
        "calibration_sha256": calibrated.sha256,
        "max_batch_tokens": calibrated.calibration.max_batch_tokens,
    }
    return SimSettings.model_validate({**dict(settings), **update})


@dataclass(frozen=True)
class PdDeployment:
    """One deployment of the comparison: colocated (``disaggregation`` None) or P/D, with or without a tier."""

    name: str
    settings: SimSettings
    disaggregation: Disaggregation | None
    tier: bool


def deployments(
    model: str,
    hardware: str,
    read_gbps: float = DEFAULT_READ_GBPS,
    link_gbps: Sequence[float] = DEFAULT_LINK_GBPS,
    layout: Disaggregation | None = None,
    tier_gb: float = DEFAULT_TIER_GB,
    calibrated: Calibrated | None = None,
) -> list[PdDeployment]:
    """Colocated 1 GPU without and with a CPU tier, then the P/D layout per link bandwidth without and with it.

    With a calibration the tier's load rate and latency are its backend's fitted ones (``read_gbps`` unused).
    """
    bare = _calibrate(settings_for(model, hardware, "compute-only", read_gbps), calibrated)
    tiered = _calibrate(settings_for(model, hardware, "load-only", read_gbps, tier_gb), calibrated)
    out = [
        PdDeployment("colocated", bare, None, False),
        PdDeployment("colocated + CPU tier", tiered, None, True),
    ]
    base = layout or Disaggregation()
    for gbps in link_gbps:
        pd = base.model_copy(update={"link_gbps": gbps})
        name = f"{pd.label} {gbps:g} GB/s"
        out.append(PdDeployment(name, bare, pd, False))
        out.append(PdDeployment(f"{name} + CPU tier", tiered, pd, True))
    return out


def turn2(deployment: PdDeployment, tokens: int, new_tokens: int) -> TtftParts:
    """Turn 2's TTFT taken apart on a fresh deployment (see the module docstring)."""
    cluster = Cluster(deployment.settings, deployment.disaggregation)
    limit = min(core.max_model_len for core in [*cluster.prefill, *cluster.decode])
    prompt = turn2_prompt(tokens, new_tokens, limit)
    cluster.submit("turn-1", prompt[:-new_tokens], 1, ignore_event, key="user")  # both turns on one instance
    cluster.run()
    cluster.advance_to(cluster.tier_writes_done_at())
    cluster.reset_prefix_caches()
    second = cluster.submit("turn-2", prompt, 1, ignore_event, key="user")
    cluster.run()
    return second.parts(cluster.load_overlap_none)


@dataclass(frozen=True)
class PdPoint:
    tokens: int
    deployment: str
    parts: TtftParts


def run_pd_whatif(
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    tokens: Sequence[int] = DEFAULT_TOKENS,
    read_gbps: float = DEFAULT_READ_GBPS,
    link_gbps: Sequence[float] = DEFAULT_LINK_GBPS,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    layout: Disaggregation | None = None,
    tier_gb: float = DEFAULT_TIER_GB,
    calibrated: Calibrated | None = None,
) -> list[PdPoint]:
    """Every (context length, deployment) point, in that order."""
    points: list[PdPoint] = []
    for length in tokens:
        for deployment in deployments(model, hardware, read_gbps, link_gbps, layout, tier_gb, calibrated):
            parts = turn2(deployment, length, new_tokens)
            points.append(PdPoint(parts.prompt_tokens, deployment.name, parts))
    return points


PART_COLUMNS: tuple[tuple[str, str], ...] = (
    ("queue_ms", "queue_s"),
    ("load_ms", "load_s"),
    ("prefill_ms", "prefill_s"),
    ("transfer_ms", "transfer_s"),
    ("admission_ms", "admission_s"),
    ("first_step_ms", "first_step_s"),
)


def _ms(parts: TtftParts, attribute: str) -> float:
    value = getattr(parts, attribute)
    assert isinstance(value, float)
    return value * 1e3


def markdown_table(points: Sequence[PdPoint]) -> str:
    """TTFT and its parts in ms per (context length, deployment), with the ratio to colocated without a tier."""
    head = (
        "| tokens | deployment | TTFT ms | vs colocated | queue | load | prefill | transfer | admission | first step "
        "| loaded tokens | transfer MB |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    reference = {p.tokens: p.parts.ttft_s for p in points if p.deployment == "colocated"}
    lines = []
    for p in points:
        t = p.parts
        ratio = f"{t.ttft_s / reference[p.tokens]:.2f}x" if p.tokens in reference else "-"
        cells = " | ".join(f"{_ms(t, attribute):.1f}" for _, attribute in PART_COLUMNS)
        lines.append(
            f"| {p.tokens:,} | {p.deployment} | {t.ttft_s * 1e3:.1f} | {ratio} | {cells} | {t.loaded_tokens:,} "
            f"| {t.transfer_bytes / 1e6:,.0f} |"
        )
    return head + "\n".join(lines) + "\n"


def write_csv(points: Sequence[PdPoint], path: Path) -> None:
    header = [
        "tokens",
        "deployment",
        "ttft_ms",
        *(name for name, _ in PART_COLUMNS),
        "loaded_tokens",
        "hbm_hit_tokens",
        "transfer_bytes",
    ]
    write_csv_rows(path, header, (_csv_row(p) for p in points))


def _csv_row(point: PdPoint) -> list[object]:
    t = point.parts
    return [
        point.tokens,
        point.deployment,
        f"{t.ttft_s * 1e3:.3f}",
        *(f"{_ms(t, attribute):.3f}" for _, attribute in PART_COLUMNS),
        t.loaded_tokens,
        t.hbm_hit_tokens,
        f"{t.transfer_bytes:.0f}",
    ]


def plot(points: Sequence[PdPoint], path: Path, title: str) -> None:
    """Stacked bars of turn-2 TTFT's parts per deployment, one panel per context length (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({p.tokens for p in points})
    figure, axes = plt.subplots(1, len(lengths), figsize=(max(5.5 * len(lengths), 10), 4.8), squeeze=False)
    for axis, length in zip(axes[0], lengths, strict=True):
        row = [p for p in points if p.tokens == length]
        bottoms = [0.0] * len(row)
        for colour, (name, attribute) in enumerate(PART_COLUMNS):
            heights = [_ms(p.parts, attribute) / 1e3 for p in row]
            axis.bar(range(len(row)), heights, bottom=bottoms, color=f"C{colour}", label=name.removesuffix("_ms"))
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        axis.set_xticks(range(len(row)), [p.deployment.replace(" + ", "\n+ ") for p in row], fontsize=7, rotation=30)
        axis.set_ylabel("turn-2 TTFT (s)")
        axis.set_title(f"{length:,} tokens")
        axis.grid(True, axis="y", alpha=0.3)
        axis.legend(fontsize=7)
    save_titled_png(figure, path, title, dpi=110)


DEFAULT_RATES: tuple[float, ...] = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0)
DEFAULT_SLO_S = 0.5
LOADED_TRAFFIC = Traffic(users=64, skew=0.0, context_tokens=8000, answer_tokens=128, duration_s=60.0, warmup_s=30.0)
"""Multi-round QA: 64 users, each with its own 8,000-token document, 4 turns of a 64-token question and a
128-token answer (the fleet what-if's traffic, :class:`harness.calibrate.fleet_whatif.Traffic`)."""


@dataclass(frozen=True)
class LoadedPoint:
    """Returning users' TTFT of one deployment at one offered rate (requests per second, all users)."""

    deployment: str
    gpus: int
    rate: float
    requests: int
    ttft_p50_s: float
    ttft_p90_s: float


def run_loaded(
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    rates: Sequence[float] = DEFAULT_RATES,
    traffic: Traffic = LOADED_TRAFFIC,
    read_gbps: float = DEFAULT_READ_GBPS,
    layout: Disaggregation | None = None,
    tier_gb: float = DEFAULT_TIER_GB,
    calibrated: Calibrated | None = None,
) -> list[LoadedPoint]:
    """Every (deployment, rate) point: colocated replicas on the layout's GPU count (session affinity) and the
    layout, each without and with a CPU tier (P/D: on the prefill side), on the fleet what-if's event loop."""
    pd = layout or Disaggregation()
    gpus = pd.prefill_gpus + pd.decode_gpus
    points: list[LoadedPoint] = []
    for deployment in deployments(model, hardware, read_gbps, [pd.link_gbps], pd, tier_gb, calibrated):
        setup = Setup(deployment.name, "session_affinity", deployment.settings.offload, deployment.disaggregation)
        if deployment.disaggregation is None:
            setup = replace(setup, name=f"{gpus}x {deployment.name}")
        for rate in rates:
            served, _ = simulate(setup, gpus, replace(traffic, rate=rate), settings=deployment.settings)
            returning = sorted(s.ttft for s in served if s.moved is not None)
            if not returning:
                raise ValueError(f"{setup.name} at {rate:g} req/s: no returning user inside the window; lengthen it")
            p50, p90 = returning[len(returning) // 2], returning[min(len(returning) - 1, int(0.9 * len(returning)))]
            points.append(LoadedPoint(setup.name, gpus, rate, len(returning), p50, p90))
    return points


def capacity(points: Sequence[LoadedPoint], slo_s: float) -> dict[str, float | None]:
    """Per deployment, the highest offered rate up to which every rate's returning-user TTFT p90 is within
    ``slo_s`` (None: not even the lowest)."""
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(p.deployment for p in points):
        best: float | None = None
        for point in sorted((p for p in points if p.deployment == name), key=lambda p: p.rate):
            if point.ttft_p90_s > slo_s:
                break
            best = point.rate
        out[name] = best
    return out


def loaded_table(points: Sequence[LoadedPoint], slo_s: float) -> str:
    """Returning users' TTFT p50/p90 in ms per deployment (rows) and rate (columns), and the capacity."""
    rates = sorted({p.rate for p in points})
    names = list(dict.fromkeys(p.deployment for p in points))
    by = {(p.deployment, p.rate): p for p in points}
    caps = capacity(points, slo_s)
    head = (
        "| deployment | "
        + " | ".join(f"{r:g} req/s p50/p90 ms" for r in rates)
        + f" | capacity at p90 ≤ {slo_s * 1e3:g} ms |"
    )
    lines = [head, "|---|" + "---:|" * (len(rates) + 1)]
    for name in names:
        cells = []
        for rate in rates:
            point = by.get((name, rate))
            cells.append("-" if point is None else f"{point.ttft_p50_s * 1e3:.0f} / {point.ttft_p90_s * 1e3:.0f}")
        cap = caps[name]
        shown = "none" if cap is None else f"{cap:g} req/s" + (" (the highest tried)" if cap == rates[-1] else "")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {shown} |")
    return "\n".join(lines) + "\n"


def write_loaded_csv(points: Sequence[LoadedPoint], path: Path) -> None:
    write_csv_rows(
        path,
        ["deployment", "gpus", "rate", "requests", "ttft_p50_ms", "ttft_p90_ms"],
        (
            [p.deployment, p.gpus, f"{p.rate:g}", p.requests, f"{p.ttft_p50_s * 1e3:.3f}", f"{p.ttft_p90_s * 1e3:.3f}"]
            for p in points
        ),
    )
