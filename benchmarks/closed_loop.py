"""A closed-loop sweep's capacity two ways: completions counted in the window, and what its latencies imply.

A capacity at the SLO is one load point's RPS/GPU: successful requests that *ended* inside the measurement window /
window seconds. With ``N`` users each cycling request (``R`` s) then think time (``Z`` s), Little's law gives the same
throughput from the latencies, ``X = N / (R + Z)``, without counting a window's edges. Per arm and load point of
each sweep run directory given (a GPU run and its simulated re-run, say), in requests/s:

* ``window``: completions inside the window / window seconds (what the capacity cells use);
* ``implied``: ``load / (mean e2e + mean think)``: ``e2e`` over the requests that overlap the window, ``think``
  the mean gap between a request's end and its user's next request (within one conversation; a new user's first
  request has no gap in the records, so this over-states Z a little and under-states ``implied`` on every run
  alike);
* ``window/implied``: how far the window's count sits from its own latencies;
* with ``--calibration``: ``stall ms/s``: the LMCache tier's loaded KV (vLLM's ``external_prefix_hits`` over the
  window x the KV bytes per token, at the calibration's LMCache load rate) per second of window -- the most a
  synchronous load inside the engine step (LMCache without ``enable_async_loading``) can stall the running
  decodes, as milliseconds per second.

    python benchmarks/closed_loop.py docs/results/gpu-decode-tax-llama8b-h200 SIMULATED_RUN_DIR \\
        --calibration harness/sim/calibrations/llama8b-h200-eager.yaml

An analysis, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

from harness.calibrate.samples import run_facts
from harness.sim.calibration import Calibration
from harness.store.events import PointDone
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.profiles import resolve_profile

LMCACHE = "lmcache"


def _think_gaps_s(records: list[RequestRecord]) -> list[float]:
    """Seconds from each request's end to its user's next request of the same conversation."""
    by_user: dict[int | None, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_user[r.user].append(r)
    gaps: list[float] = []
    for mine in by_user.values():
        mine.sort(key=lambda r: r.started_ns)
        for a, b in pairwise(mine):
            if a.conversation == b.conversation and a.e2e_ns is not None:
                gaps.append((b.started_ns - a.started_ns - a.e2e_ns) / 1e9)
    return gaps


def _stall_ms_per_s(point: PointDone, kv_bytes_per_token: float, load_gbps: float | None) -> str:
    if load_gbps is None or not point.metrics:
        return ""
    window_s = (point.window_end_ns - point.window_start_ns) / 1e9
    loaded_gb = point.metrics.get("external_prefix_hits", 0.0) * kv_bytes_per_token / 1e9
    return f"{loaded_gb / load_gbps / window_s * 1e3:10.1f}"


def report(path: Path, calibration: Calibration | None) -> None:
    run = RunDir.open(path)
    kv_bytes = run_facts(path).deployment.resolve().kv_bytes_per_token
    profiles = {arm.name: resolve_profile(arm.offload) for arm in run.scenario().arms}
    per_point: dict[tuple[str, float], list[RequestRecord]] = defaultdict(list)
    for r in run.records():
        if r.ok and r.load is not None and r.e2e_ns is not None:
            per_point[(r.arm, r.load)].append(r)
    print(path)
    print(f"  {'arm':24} {'load':>5} {'window':>7} {'implied':>8} {'window/implied':>15} {'stall ms/s':>10}")
    for point in sorted(run.points(), key=lambda p: (p.arm, p.load)):
        records = per_point.get((point.arm, point.load), [])
        gaps = _think_gaps_s(records)
        inside = [r for r in records if r.e2e_ns is not None and point.window_start_ns <= r.started_ns + r.e2e_ns]
        overlapping = [r for r in inside if r.started_ns <= point.window_end_ns]
        ended = [r for r in inside if r.started_ns + (r.e2e_ns or 0) <= point.window_end_ns]
        if not overlapping or not gaps:
            continue
        window_s = (point.window_end_ns - point.window_start_ns) / 1e9
        window = len(ended) / window_s
        e2e_s = statistics.fmean((r.e2e_ns or 0) / 1e9 for r in overlapping)
        implied = point.load / (e2e_s + statistics.fmean(gaps))
        offload = profiles.get(point.arm)
        lmcache = offload is not None and offload.backend == LMCACHE and not offload.async_loading
        rate = calibration.backends[LMCACHE].load_gbps.value if calibration and lmcache else None
        stall = _stall_ms_per_s(point, kv_bytes, rate)
        print(f"  {point.arm:24} {point.load:5.0f} {window:7.3f} {implied:8.3f} {window / implied - 1:+15.1%} {stall}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--calibration", type=Path, default=None, help="Its LMCache load rate prices the stall.")
    args = parser.parse_args()
    calibration = Calibration.load(args.calibration) if args.calibration else None
    for path in args.runs:
        report(path, calibration)


if __name__ == "__main__":
    main()
