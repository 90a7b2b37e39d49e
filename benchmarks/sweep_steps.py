"""Where a sweep's decode time goes: the engine's steps, rebuilt from the records, per arm and load point.

For each arm and load point of a sweep run directory it rebuilds the engine's steps from the token
arrival times (:func:`harness.calibrate.engine_steps.reconstruct`) and prints, in milliseconds:

* ``batch``: mean number of requests decoding per step;
* ``clean med`` / ``clean mean``: steps with decodes only, while no request was between its send and
  its first token (no prefill chunk, no arrival being taken in): the decode step itself;
* ``pending``: mean of decode-only steps while some request was between send and admission (its
  API-server and engine intake work) -- beside ``clean mean`` at a similar batch it shows what an
  arrival costs the running requests;
* ``all (tok)``: the mean step a decoding request saw, every step weighted by its decodes (what
  TPS/user measures, ~1000 / TPS/user);
* ``pre-adm``: median of the bracketed pre-admission delay of requests admitted while the engine
  ran: they became schedulable between the start of the step before their admission step and the
  start of their admission step (only at points whose ``/metrics`` deltas show no admission retries
  (prefix-cache queries = prompt tokens) and no tier hits: there the admission step is the prefill step);
* with ``--calibration``: ``prefill`` = median of measured / modelled duration of steps that computed one
  prefill chunk of 2,000+ tokens beside decodes (arms without a tier: a connector can move the first token).

Then per arm, over the points up to ``--max-load``: ordinary least squares of each clean step's
duration minus its modelled GPU time (the calibration's, with no step overhead) on ``1, batch`` -- the
mean host time per step and per running request -- and the correlation of consecutive clean steps per
load point (slow stretches: a step is slow when the one before it was).

    python benchmarks/sweep_steps.py docs/results/gpu-sweep-llama8b-h100 \\
        --calibration harness/sim/calibrations/llama8b-h100-eager.yaml

An analysis, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from harness.calibrate.engine_steps import EngineSteps, reconstruct
from harness.calibrate.samples import run_facts
from harness.sim.calibration import Calibration
from harness.sim.timemodel import TimeModel
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir

PREFILL_STEP_TOKENS = 2000


def _pending(steps: EngineSteps) -> np.ndarray:
    """Per step: some request was sent before it ended and had its first token in a later step."""
    out = np.zeros(len(steps), dtype=bool)
    for i, record in enumerate(steps.records):
        k0 = int(np.searchsorted(steps.ends_ns, record.started_ns, side="right"))
        out[k0 : int(steps.first[i])] = True
    return out


def _brackets(steps: EngineSteps, max_batch_tokens: int) -> list[float]:
    """Pre-admission delays (ms, bracket midpoints) of requests admitted while the engine decoded."""
    out: list[float] = []
    for i, r in enumerate(steps.records):
        new = (r.prompt_tokens or 0) - min(r.cached_tokens or 0, (r.prompt_tokens or 1) - 1)
        admitted = int(steps.first[i]) - (-(-new // max_batch_tokens)) + 1
        if admitted < 2 or not steps.busy[admitted - 1]:
            continue
        low = max(0.0, (steps.ends_ns[admitted - 2] - r.started_ns) / 1e6)
        high = (steps.ends_ns[admitted - 1] - r.started_ns) / 1e6
        if high > 0:
            out.append((low + high) / 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--calibration", type=Path, default=None)
    parser.add_argument("--max-load", type=float, default=16.0, help="Loads in the per-arm regression.")
    args = parser.parse_args()
    run_dir = RunDir.open(args.run)
    facts = run_facts(args.run)
    calibration = Calibration.load(args.calibration) if args.calibration else None
    deployment = facts.deployment.resolve()
    clean_metrics: dict[tuple[str, int], bool] = {}
    for p in run_dir.points():
        m = p.metrics or {}
        # no admission retries (each prompt looked up once) and no tier hits: admission = the prefill step
        clean_metrics[(p.arm, p.point)] = (
            bool(m)
            and m.get("gpu_prefix_queries", 0.0) <= m.get("prompt_tokens", 0.0)
            and not m.get("external_prefix_hits", 0.0)
        )
    groups: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in run_dir.records():
        if r.ok and r.point is not None:
            groups[(r.arm, r.point)].append(r)
    regression: dict[str, list[tuple[float, float]]] = defaultdict(list)
    runs: dict[str, list[float]] = defaultdict(list)  # lag-1 products of consecutive clean steps, per arm
    print(
        f"{'arm':<16} {'load':>5} {'steps':>6} {'batch':>6} {'clean med':>10} {'clean mean':>11} "
        f"{'pending':>8} {'all (tok)':>10} {'pre-adm':>8} {'prefill':>8}"
    )
    for (arm, point), records in sorted(groups.items()):
        steps = reconstruct(records, facts.max_batch_tokens)
        if steps is None:
            continue
        load = records[0].load or 0.0
        durations = steps.durations_s * 1e3
        batch = np.array([len(d) for d in steps.decodes])
        decode_only = np.array(
            [bool(steps.decodes[k]) and not steps.prefills[k] and steps.busy[k] for k in range(len(steps))]
        )
        pending = _pending(steps)
        clean = decode_only & ~pending
        waiting = decode_only & pending
        weighted = float(np.nansum(durations * batch) / batch[1:].sum())
        if load <= args.max_load:
            consecutive = clean[1:] & clean[:-1]
            runs[arm] += [float(np.corrcoef(durations[1:][consecutive], durations[:-1][consecutive])[0, 1])]
        brackets = _brackets(steps, facts.max_batch_tokens) if clean_metrics.get((arm, point)) else []
        ratio = "-"
        backend = facts.arms[arm].backend
        if calibration is not None:
            eff = calibration.efficiencies(deployment, calibration.backends.get(backend) if backend else None)
            gpu = TimeModel(deployment, replace(eff, step_overhead_s=0.0, step_s_per_seq=0.0))
            if load <= args.max_load:
                for k in np.nonzero(clean)[0].tolist():
                    host = float(durations[k]) - gpu.step_seconds(steps.work(k)) * 1e3
                    regression[arm].append((float(len(steps.decodes[k])), host))
            if backend is None:
                model = TimeModel(deployment, eff)
                ratios = [
                    durations[k] / (model.step_seconds(steps.work(k)) * 1e3)
                    for k in range(1, len(steps))
                    if len(steps.prefills[k]) == 1
                    and steps.prefills[k][0][0] >= PREFILL_STEP_TOKENS
                    and steps.busy[k]
                    and not steps.intake[k]
                ]
                ratio = f"{np.median(ratios):.2f}" if ratios else "-"
        print(
            f"{arm:<16} {load:>5g} {len(steps):>6} {batch[1:].mean():>6.2f} {np.median(durations[clean]):>10.1f} "
            f"{durations[clean].mean():>11.1f} {durations[waiting].mean() if waiting.any() else float('nan'):>8.1f} "
            f"{weighted:>10.1f} {np.median(brackets) if brackets else float('nan'):>8.1f} {ratio:>8}"
        )
    for arm, rows in regression.items():
        x = np.array(rows)
        design = np.column_stack((np.ones(len(x)), x[:, 0]))
        coef, *_ = np.linalg.lstsq(design, x[:, 1], rcond=None)
        print(
            f"{arm}: host time per decode step (loads <= {args.max_load:g}, {len(x)} clean steps) = "
            f"{coef[0]:.2f} ms + {coef[1]:.3f} ms x batch; consecutive clean steps correlate at "
            f"{min(runs[arm]):.2f}-{max(runs[arm]):.2f} (per load point)"
        )


if __name__ == "__main__":
    main()
