"""The rule's table: how this checkout's fit does on held-out lengths, over every shipped calibration.

A new model term enters only when it lowers the error on held-out runs it was not fitted on. Each shipped
calibration (:data:`harness.sim.calibration.SHIPPED_DIR`) names its source runs and the lengths and sweep loads it
held out; this refits each one from the same runs with the code of this checkout and prints per calibration the
held-out cells at 1,000 tokens or more (:data:`MIN_TOKENS`, where ``validate`` judges): the median and the worst
relative error ``predicted / measured - 1`` of the cells' median TTFT, and how many lie beyond 15 %; then the
totals, with LMCache's turn 1 and turn 2 cells apart.

The prediction is the time model's TTFT of one unloaded request (:func:`harness.calibrate.fit.residuals`), not a
simulation, so a model change's effect on every kept run is a short question:

    python -m harness.calibrate.holdout --json before.json
    git switch my-model-change
    python -m harness.calibrate.holdout --compare before.json

(``--compare`` prints the cells that moved by 2 points or more, and both totals.)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from harness.sim.calibration import SHIPPED_DIR, Calibration

from .fit import calibrate

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: a calibration's source paths are relative to it."""
MIN_TOKENS = 1000
THRESHOLD = 0.15
MOVED = 0.02

Errors = dict[str, dict[str, float]]
"""Per calibration file name, per held-out cell ("ARM LENGTH tTURN"): predicted / measured - 1."""


def held_out_errors(folder: Path = SHIPPED_DIR) -> Errors:
    """Refit every calibration in ``folder`` from its own sources and held-out lengths and loads."""
    out: Errors = {}
    for path in sorted(folder.glob("*.yaml")):
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
    """Median and mean |error|, cells beyond the threshold, and LMCache's turns apart."""
    kept = errors
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
    parser.add_argument("--calibrations", type=Path, default=SHIPPED_DIR, help="where the calibrations are")
    parser.add_argument("--json", type=Path, help="write the per-cell errors here")
    parser.add_argument("--compare", type=Path, help="a --json file of another checkout: print what moved")
    args = parser.parse_args()
    errors = held_out_errors(args.calibrations)
    for name, cells in errors.items():
        print(_line(name.removesuffix(".yaml"), cells))
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
