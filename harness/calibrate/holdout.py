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

``--under-load`` prints the other table, under load (:mod:`harness.calibrate.underload`): every kept load run
re-run on the calibrated simulator, capacity at the SLO per arm and the ON/OFF ratio against the measurement.
It runs the simulator in real time (the kept runs' whole windows: tens of minutes; ``--window-scale 0.5`` halves
them), so ``--runs`` picks runs. ``--markdown FILE`` writes the table for docs/simulator.md, ``--json FILE`` the
cells, and ``--bands`` regenerates the shipped bands (:mod:`harness.sim.heldout`) from both tables:

    python -m harness.calibrate.holdout --under-load --json lab/heldout-under-load.json \
        --markdown lab/heldout-under-load.md --bands
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from common.errors import CalibrationError, KvbenchError
from harness.sim.calibration import SHIPPED_DIR, Calibration
from harness.sim.heldout import AGENTS, CAPACITY, Band, HeldOut, write_bands

from .fit import calibrate
from .underload import bands as underload_bands
from .underload import kept_load_runs, markdown, predict_run, tpot_lines

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: a calibration's source paths are relative to it."""
MIN_TOKENS = 1000
THRESHOLD = 0.15
MOVED = 0.02

Errors = dict[str, dict[str, float]]
"""Per calibration file name, per held-out cell ("ARM LENGTH tTURN"): predicted / measured - 1."""


def refit_from_sources(committed: Calibration) -> Calibration:
    """``committed`` fitted again with this checkout's code: from its own source runs, with its held-out lengths and
    loads, and the decode read as a term where it fitted one."""
    return calibrate(
        [ROOT / source.path for source in committed.sources],
        committed.holdout_context_tokens,
        holdout_loads=committed.holdout_loads,
        decode_read=committed.decode_s_per_ktoken.fitted,
    )


def held_out_errors(folder: Path = SHIPPED_DIR) -> Errors:
    """Refit every calibration in ``folder`` from its own sources and held-out lengths and loads."""
    out: Errors = {}
    for path in sorted(folder.glob("*.yaml")):
        refit = refit_from_sources(Calibration.load(path))
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


def unloaded_bands(errors: Errors) -> dict[str, HeldOut]:
    """Per calibration file, the median |error| of its held-out unloaded TTFT cells."""
    return {
        name: HeldOut(ttft_unloaded_median=statistics.median(abs(e) for e in cells.values()), ttft_cells=len(cells))
        for name, cells in errors.items()
        if cells
    }


def merged_bands(unloaded: dict[str, HeldOut], loaded: dict[str, dict[str, Band]]) -> dict[str, HeldOut]:
    """Both tables' bands per calibration file."""
    return {
        name: unloaded.get(name, HeldOut()).model_copy(
            update={"capacity": loaded.get(name, {}).get(CAPACITY), "agents": loaded.get(name, {}).get(AGENTS)}
        )
        for name in sorted(set(unloaded) | set(loaded))
    }


def under_load(args: argparse.Namespace) -> int:
    """The under-load table of ``--runs`` (default: every kept load run); 2 with a one-line error."""
    try:
        runs = [Path(r) for r in args.runs] if args.runs else kept_load_runs()
        if args.calibration is not None and not args.calibration.is_file():
            raise CalibrationError(f"--calibration {args.calibration}: no such file")
        if (args.calibration is not None or args.loads) and args.bands:
            raise CalibrationError(
                "--bands: only from every kept run's whole grid, held out (no --calibration, --loads)"
            )
        for run in runs:
            if not (run / "manifest.json").is_file():
                raise CalibrationError(f"--runs {run}: not a run directory (no manifest.json)")
        out = args.out or Path(tempfile.mkdtemp(prefix="kvbench-underload-"))
        load_start = os.getloadavg()[0]
        tables = []
        for run in runs:
            print(f"predicting {run} ...", flush=True)
            tables.append(predict_run(run, out, args.window_scale, args.calibration, args.loads or ()))
    except (KvbenchError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = markdown(tables)
    print(table)
    print("\n".join(tpot_lines(tables)))
    if args.markdown is not None:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    if args.json is not None:
        # the simulator runs in real time: a busy machine's lateness is in the predictions, so say how busy it was
        data = {
            "window_scale": args.window_scale,
            "cpus": os.cpu_count(),
            "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
            "runs": [asdict(t) for t in tables],
        }
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    if args.bands:
        bands = merged_bands(unloaded_bands(held_out_errors(args.calibrations)), underload_bands(tables))
        print(f"wrote {write_bands(bands)}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrations", type=Path, default=SHIPPED_DIR, help="where the calibrations are")
    parser.add_argument("--json", type=Path, help="write the per-cell errors here")
    parser.add_argument("--compare", type=Path, help="a --json file of another checkout: print what moved")
    parser.add_argument("--under-load", action="store_true", help="the under-load table of the kept load runs")
    parser.add_argument("--runs", nargs="+", help="--under-load: these run directories only")
    parser.add_argument("--window-scale", type=float, default=1.0, help="--under-load: warm-up and window times this")
    parser.add_argument("--out", type=Path, help="--under-load: where the simulator runs go (default: a temp dir)")
    parser.add_argument("--markdown", type=Path, help="--under-load: write the Markdown table here")
    parser.add_argument("--loads", type=float, nargs="+", help="--under-load: a sweep's capacity over these loads")
    parser.add_argument("--calibration", type=Path, help="--under-load: predict with this file (not held out)")
    parser.add_argument("--bands", action="store_true", help="--under-load: regenerate the shipped bands file")
    args = parser.parse_args()
    if args.under_load:
        if not 0 < args.window_scale <= 1:
            parser.exit(2, f"error: --window-scale {args.window_scale}: allowed 0 < scale <= 1\n")
        sys.exit(under_load(args))
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
