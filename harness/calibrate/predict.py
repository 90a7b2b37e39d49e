"""The calibrated time model's TTFT per cell of a run, without the simulator's event loop.

Per request, the TTFT of that request alone on the engine under the calibration
(:func:`harness.sim.calibration.unloaded_ttft_s`: ``overhead(P) + load + prefill``), with the request's
measured HBM and tier hits. ``kvbench sim predict`` stores the medians per (arm, context, turn) in the run
directory (:class:`harness.results.calibrated.CalibratedTtft`) for reports; ``kvbench sim validate`` uses
the same numbers to tell the simulating machine's own lateness from the model's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.errors import CalibrationError, RunDirError
from harness.results.calibrated import CalibratedCell, CalibratedTtft
from harness.sim.calibration import Calibration

from .model import params_of, predict_ttft
from .samples import RunFacts, cells_of, collect, run_facts


def calibrated_cells(run: Path, calibration_file: Path) -> tuple[dict[tuple[str, int, int], float], str]:
    """Median TTFT (ms) the calibrated simulator predicts per (arm, context, turn) of a probe run.

    Returns ``({}, why)`` when the calibration cannot be used for the run (another deployment, an
    unreadable file); arms whose offload backend the calibration lacks are left out.
    """
    try:
        calibration = Calibration.load(calibration_file)
        facts = run_facts(run)
    except (CalibrationError, RunDirError) as error:
        return {}, str(error)
    if not calibration.deployment.agrees(facts.deployment):
        return {}, (
            f"calibration {calibration_file} is for {calibration.deployment.label}; the run is {facts.deployment.label}"
        )
    dep = calibration.deployment
    out = {key: float(np.median(predicted)) for key, (predicted, _) in _time_model(run, facts, calibration).items()}
    fitted = ", ".join(f"{n:,}" for n in calibration.fit_context_tokens)
    return out, f"calibration {calibration_file.name} ({dep.label}, fitted on {fitted} tokens)"


def _time_model(
    run: Path, facts: RunFacts, calibration: Calibration
) -> dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]:
    """Per (arm, context, turn): (the time model's unloaded TTFT, the run's TTFT), ms per request, for the
    arms whose backend the calibration has."""
    deployment = calibration.deployment.resolve()
    samples, _ = collect(run, facts, ())
    usable = [s for s in samples.ttft if s.backend is None or s.backend in calibration.backends]
    params = params_of(calibration)
    return {
        key: (
            predict_ttft(deployment, params, calibration.max_batch_tokens, cell) * 1e3,
            np.array([s.ttft_s for s in cell]) * 1e3,
        )
        for key, cell in cells_of(usable).items()
    }


def simulator_lateness(sim_run: Path, calibration: Calibration) -> dict[tuple[str, int, int], float]:
    """Per (arm, context, turn) of a calibrated simulator run: the median of (its TTFT - its own time model's
    TTFT for the same request), ms.

    The real-time simulator cannot be earlier than its time model, and is later by what the host that runs it
    adds: the client's and the HTTP server's Python, and event-loop wake-ups. The calibration's fitted overhead
    already holds the measured host's share of that, so this is the part of a simulated cell that belongs to
    the simulating machine, not to the model.
    """
    return {
        key: float(np.median(simulated - predicted))
        for key, (predicted, simulated) in _time_model(sim_run, run_facts(sim_run), calibration).items()
    }


def write_predictions(run: Path, calibration_file: Path) -> CalibratedTtft:
    """Store the calibrated TTFT per cell of a probe run in the run directory (``calibrated_ttft.json``).

    A calibration that cannot be used for the run is stored as a note saying why, with no cells.
    """
    cells, note = calibrated_cells(run, calibration_file)
    result = CalibratedTtft(
        calibration=calibration_file.name,
        note=note,
        cells=[
            CalibratedCell(arm=arm, context_tokens=context, turn=turn, predicted_ms=ms)
            for (arm, context, turn), ms in sorted(cells.items())
        ],
    )
    result.write_file(run)
    return result
