"""How this checkout's calibration fit does on held-out lengths, over every calibration committed under docs/results.

Each committed calibration names its source runs and the lengths it held out. This refits each one from the same
runs with the same held-out lengths, with the code of this checkout, and prints per calibration the held-out cells
at 1,000 tokens or more (:data:`MIN_TOKENS`, where ``validate`` judges): the median and the worst relative error
``predicted / measured - 1`` of the cells' median TTFT, and how many lie beyond 15 %. Then the totals over every
calibration but the comparison variants (:data:`VARIANTS`: refits of a run also committed on its own, or pooled
with another), and for LMCache's turn 1 and turn 2 cells apart.

The prediction is the time model's TTFT of one unloaded request (:func:`harness.calibrate.fit.residuals`), not
a simulation: ``kvbench sim validate`` runs the simulator in real time and agreed with it within ~3 points on the
committed runs. That makes a model change's effect on every committed run a 30-second question:

    python benchmarks/calibration_holdout.py --json /tmp/before.json
    git switch my-model-change
    python benchmarks/calibration_holdout.py --compare /tmp/before.json

(``--compare`` prints the cells that moved by 2 points or more, and both totals.) An analysis, not a test: it
asserts nothing and prints figures of committed GPU runs (measured: vLLM 0.26.0 + LMCache 0.5.3 on the GPUs their
manifests name) against the fit's predictions.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from harness.calibrate.fit import calibrate
from harness.sim.calibration import Calibration

ROOT = Path(__file__).resolve().parents[1]
MIN_TOKENS = 1000
THRESHOLD = 0.15
MOVED = 0.02
VARIANTS = ("no-prefill-floor", "prefill-floor", "with-short-grid", "holdout-loads")
"""Name parts of committed calibrations fitted only to compare with another fit of the same runs."""

Errors = dict[str, dict[str, float]]
"""Per calibration file name, per held-out cell ("ARM LENGTH tTURN"): predicted / measured - 1."""


def held_out_errors(results: Path) -> Errors:
    """Refit every ``calibration-*.yaml`` under ``results`` from its own sources and held-out lengths."""
    out: Errors = {}
    for path in sorted(results.glob("calibration-*.yaml")):
        committed = Calibration.load(path)
        refit = calibrate(
            [ROOT / source.path for source in committed.sources],
            committed.holdout_context_tokens,
            holdout_loads=committed.holdout_loads,
        )
        out[path.name] = {
            f"{r.arm} {r.context_tokens} t{r.turn}": r.error
            for r in refit.residuals
            if not r.used_in_fit and r.context_tokens >= MIN_TOKENS
        }
    return out


def _line(name: str, cells: dict[str, float]) -> str:
    if not cells:
        return f"{name:62s} no held-out cells of {MIN_TOKENS:,}+ tokens"
    worst = max(cells, key=lambda cell: abs(cells[cell]))
    median = statistics.median(abs(error) for error in cells.values())
    beyond = sum(abs(error) > THRESHOLD for error in cells.values())
    return f"{name:62s} median {median:6.1%}  worst {cells[worst]:+7.1%} ({worst})  beyond {beyond}"


def totals(errors: Errors) -> str:
    """Median and mean |error|, cells beyond the threshold, and LMCache's turns apart, over the non-variants."""
    kept = {name: cells for name, cells in errors.items() if not any(part in name for part in VARIANTS)}
    every = [abs(error) for cells in kept.values() for error in cells.values()]
    turn = {
        t: [abs(e) for cells in kept.values() for cell, e in cells.items() if "LMCache" in cell and cell.endswith(t)]
        for t in ("t1", "t2")
    }
    if not every:
        return "no held-out cells"
    return (
        f"{len(kept)} calibrations, {len(every)} held-out cells: median |error| {statistics.median(every):.2%}, "
        f"mean {statistics.fmean(every):.2%}, beyond {THRESHOLD:.0%}: {sum(e > THRESHOLD for e in every)}; "
        f"LMCache turn 1 mean {statistics.fmean(turn['t1'] or [0.0]):.2%}, "
        f"turn 2 mean {statistics.fmean(turn['t2'] or [0.0]):.2%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="where the calibrations are")
    parser.add_argument("--json", type=Path, help="write the per-cell errors here")
    parser.add_argument("--compare", type=Path, help="a --json file of another checkout: print what moved")
    args = parser.parse_args()
    errors = held_out_errors(args.results)
    for name, cells in errors.items():
        print(_line(name.removeprefix("calibration-").removesuffix(".yaml"), cells))
    print(f"this checkout: {totals(errors)}")
    if args.compare is not None:
        before: Errors = json.loads(args.compare.read_text(encoding="utf-8"))
        print(f"{args.compare}: {totals(before)}")
        for name, cells in errors.items():
            for cell, error in cells.items():
                old = before.get(name, {}).get(cell)
                if old is not None and abs(error - old) >= MOVED:
                    print(f"  {name}: {cell} {old:+.1%} -> {error:+.1%}")
    if args.json is not None:
        args.json.write_text(json.dumps(errors, indent=1, sort_keys=True), encoding="utf-8")


if __name__ == "__main__":
    main()
