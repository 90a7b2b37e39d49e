"""Where a figure came from: measured on a named engine and hardware, or simulated from a profile.

A pure function of a run directory's manifest (the scenario as run, the engines' own facts and the
host's GPUs) and, for a simulated run, the shipped calibrations' held-out bands. Every report prints it
beside its figures, so a simulated capacity curve can never pass for a measurement:

* measured: ``measured: vLLM 0.26.0 + LMCache 0.5.3, 1× NVIDIA H200`` (GPU model from the host's
  ``nvidia-smi``, count = replicas × (gpus_per_replica, else TP × PP × DP) of the engine; ``CPU`` for
  CPU engines; for an attached endpoint, the hardware the scenario declares);
* simulated: ``simulated: kvbench simulator, llama-3.1-8b on 1× h100-sxm (bf16); uncalibrated: no held-out error
  band; not a measurement``, with a calibration its held-out error band from the shipped tables
  (:mod:`harness.sim.heldout`: ``calibration llama8b-h100-eager.yaml: capacity held-out error +26..+70 % (1 run),
  TTFT unloaded median 2.3 % (18 cells)``); an
  attached endpoint (engine kind ``openai``) that is kvbench's simulator (its ``GET /v1/models`` says
  ``owned_by: kvbench-sim``, kept as ``engines.ARM.details.served_by``) is simulated too:
  ``simulated: kvbench simulator attached at http://127.0.0.1:8000, llama-3.1-8b; no held-out error band (...);
  not a measurement``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from harness.engines.common import SERVED_BY, SIMULATOR_OWNER
from harness.engines.kinds import find_engine_kind
from harness.scenario.spec import EngineConfig  # noqa: F401  (importing it registers every engine kind)
from harness.sim.heldout import NO_BAND, band_words

Origin = Literal["measured", "simulated", "unknown"]


@dataclass(frozen=True)
class Provenance:
    origin: Origin
    label: str
    """One line for captions and table footers."""
    setup: str
    """What must match for two results to be compared: model, dtype, hardware, engine."""

    def __str__(self) -> str:
        return self.label


def _gpu_count(engine: Mapping[str, Any]) -> int:
    """GPUs of the deployment: replicas × (gpus_per_replica, else TP × PP × DP) (harness.engines.replicas); a
    prefill/decode deployment's (``vllm-pd``): both sides' ``gpus``."""
    parallelism = engine.get("parallelism") or {}
    sides = [engine.get(role) for role in ("prefill", "decode")]
    if all(isinstance(side, dict) and isinstance(side.get("gpus"), list) for side in sides):
        return sum(len(side["gpus"]) for side in sides if isinstance(side, dict))  # prefill/decode: both sides

    def number(value: object) -> int | None:
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    per_replica = number(engine.get("gpus_per_replica"))
    if per_replica is None:
        per_replica = 1
        for key in ("tp", "pp", "dp"):
            per_replica *= number(parallelism.get(key, 1)) or 1
    replicas = number(engine.get("replicas")) or number(parallelism.get("replicas", 1)) or 1
    return per_replica * replicas


def _versions(engines: Mapping[str, Any]) -> str:
    """``0.26.0`` or ``0.26.0 + LMCache 0.5.3`` (the versions the engines reported at start-up)."""
    versions = sorted({str(facts.get("version")) for facts in engines.values() if facts.get("version")})
    lmcache = sorted({str(facts.get("details", {}).get("lmcache_version")) for facts in engines.values()} - {"None"})
    text = "/".join(versions) or "version unknown"
    if lmcache:
        text += " + LMCache " + "/".join(lmcache)
    return text


def provenance(manifest: Mapping[str, Any]) -> Provenance:
    """The provenance of every figure of the run whose manifest this is."""
    engine: Mapping[str, Any] = (manifest.get("scenario") or {}).get("engine") or {}
    kind = str(engine.get("kind", ""))
    row = find_engine_kind(kind)
    if row is None:
        return Provenance("unknown", "provenance unknown (no engine in the manifest)", "unknown")
    count = _gpu_count(engine)
    model = str(engine.get("model", "?"))
    dtype = engine.get("dtype")
    if engine.get("quantization"):  # FP8 weights and BF16 weights are different setups to compare
        dtype = f"{dtype or 'auto'}, {engine['quantization']} weights"
    if row.simulated:
        hardware = str(engine.get("hardware", "?"))
        calibration = engine.get("calibration")
        source = f", calibrated from {calibration}" if calibration else ""
        label = (
            f"simulated: kvbench simulator, {model} on {count}× {hardware}"
            f"{f' ({dtype})' if dtype else ''}{source}; "
            f"{band_words(_recorded_calibration(manifest, calibration), _recorded_digest(manifest))}; not a measurement"
        )
        return Provenance("simulated", label, f"sim {model} {dtype or ''} {count}x {hardware}".strip())
    attached_simulators = _attached_simulators(manifest.get("engines") or {})
    if attached_simulators:
        at = ", ".join(attached_simulators)
        label = (
            f"simulated: kvbench simulator attached at {at}, {model}{f' ({dtype})' if dtype else ''}; "
            f"{NO_BAND} (the attached simulator's calibration is not recorded); not a measurement"
        )
        return Provenance("simulated", label, f"sim {model} {dtype or ''} attached".replace("  ", " "))
    gpus = (manifest.get("host") or {}).get("gpus") or []
    if not row.starts_process:
        hardware = f"hardware declared as {engine.get('hardware') or 'unknown'}"
    elif engine.get("device") == "cpu":
        hardware = f"CPU ({(manifest.get('host') or {}).get('cpu_count', '?')} cores)"
    elif gpus:
        hardware = f"{count}× {gpus[0].get('name', 'GPU')}"
    else:
        hardware = f"{count}× GPU (model not recorded)"
    versions = _versions(manifest.get("engines") or {})
    label = f"measured: {row.label} {versions}, {hardware}"
    return Provenance("measured", label, f"{kind} {model} {dtype or ''} {hardware}".replace("  ", " "))


def _recorded_calibration(manifest: Mapping[str, Any], configured: object) -> str | None:
    """The calibration the simulator said it used (``auto: NAME`` or a path), else the scenario's; None: none."""
    engines: Mapping[str, Any] = manifest.get("engines") or {}
    recorded = sorted(
        {str(f["details"]["calibration"]) for f in engines.values() if (f.get("details") or {}).get("calibration")}
    )
    if recorded:
        return ", ".join(recorded)
    return str(configured) if configured else None


def _recorded_digest(manifest: Mapping[str, Any]) -> str | None:
    """The SHA-256 of the calibration file the simulator said it used; None when no arm recorded one (or arms
    used different files)."""
    engines: Mapping[str, Any] = manifest.get("engines") or {}
    recorded = {str((f.get("details") or {}).get("calibration_sha256")) for f in engines.values()} - {"None"}
    return recorded.pop() if len(recorded) == 1 else None


def _attached_simulators(engines: Mapping[str, Any]) -> list[str]:
    """The URLs of the arms' endpoints that said they are kvbench's simulator (``details.served_by``)."""
    return sorted(
        {
            str(facts.get("details", {}).get("base_url", "?"))
            for facts in engines.values()
            if isinstance(facts, Mapping) and facts.get("details", {}).get(SERVED_BY) == SIMULATOR_OWNER
        }
    )


def measured_on_attached_endpoint(manifest: Mapping[str, Any]) -> bool:
    """Whether the run measured an endpoint kvbench attached to (a service it did not start), not an engine it
    started or the simulator (started by kvbench or attached): the evidence a production stage needs."""
    engine: Mapping[str, Any] = (manifest.get("scenario") or {}).get("engine") or {}
    row = find_engine_kind(str(engine.get("kind", "")))
    attached = row is not None and not row.starts_process and not row.simulated
    return attached and provenance(manifest).origin == "measured"
