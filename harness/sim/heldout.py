"""The held-out error band of each shipped calibration, as every simulated report states it.

``calibrations/heldout.json`` is generated (``python -m harness.calibrate.holdout --under-load --bands``) from the two
held-out tables of docs/simulator.md:

* ``capacity`` / ``agents``: the lowest and highest ``predicted / measured - 1`` of capacity within the SLO (RPS/GPU)
  and of agents at SLO, per arm, over the kept load runs the calibration, or its refit without the run, never saw
  (:mod:`harness.calibrate.underload`), with the number of runs;
* ``ttft_unloaded_median``: the median |error| of the time model's unloaded TTFT over the calibration's held-out
  lengths (:mod:`harness.calibrate.holdout`), with the number of cells.

A calibration the file does not name (a user's file, or none) has no band, and reports say so. Each band names the
SHA-256 of the calibration file it was computed for (``calibration_sha256``), and a simulated run records the digest
of the file it ran with: a run made with another version of the file has no band on record, and a run that did not
record its version (made before kvbench recorded it) is given the current file's band, saying so.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from common.errors import CalibrationError
from common.schema import StrictModel, first_problem

from .calibration import AUTO, SHIPPED_DIR

CAPACITY = "capacity RPS/GPU"
AGENTS = "agents at SLO"
BANDS_FILE = SHIPPED_DIR / "heldout.json"
NO_BAND = "no held-out error band"


class Band(StrictModel):
    low: float = Field(description="Lowest predicted / measured - 1.")
    high: float = Field(description="Highest predicted / measured - 1.")
    runs: int = Field(ge=1, description="Kept load runs the errors come from.")

    def text(self) -> str:
        low, high = f"{self.low * 100:+.0f}", f"{self.high * 100:+.0f}"
        return f"{low if low == high else f'{low}..{high}'} % ({self.runs} run{'s' * (self.runs != 1)})"


class HeldOut(StrictModel):
    """One calibration's held-out errors."""

    capacity: Band | None = None
    agents: Band | None = None
    ttft_unloaded_median: float | None = Field(default=None, ge=0)
    ttft_cells: int = Field(default=0, ge=0)
    calibration_sha256: str | None = Field(
        default=None, description="SHA-256 of the calibration file these errors are of (None: not recorded)."
    )

    def text(self) -> str:
        capacity = self.capacity
        parts = [f"capacity held-out error {capacity.text()}" if capacity else "capacity: no held-out load run"]
        if self.agents is not None:
            parts.append(f"agents at SLO {self.agents.text()}")
        if self.ttft_unloaded_median is not None:
            parts.append(f"TTFT unloaded median {self.ttft_unloaded_median * 100:.1f} % ({self.ttft_cells} cells)")
        return ", ".join(parts)


class HeldOutFile(StrictModel):
    schema_version: Literal[2] = 2  # 2: each band names the SHA-256 of its calibration file
    calibrations: dict[str, HeldOut]


def read_bands(path: Path = BANDS_FILE) -> dict[str, HeldOut]:
    """Per shipped calibration file name, its held-out errors; a missing file is none."""
    if not path.is_file():
        return {}
    try:
        return HeldOutFile.model_validate_json(path.read_bytes()).calibrations
    except ValidationError as error:
        raise CalibrationError(f"{path}: {first_problem(error)}") from error


def write_bands(bands: dict[str, HeldOut], path: Path = BANDS_FILE) -> Path:
    path.write_text(HeldOutFile(calibrations=with_digests(bands)).model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def with_digests(bands: dict[str, HeldOut], folder: Path = SHIPPED_DIR) -> dict[str, HeldOut]:
    """``bands`` with each shipped calibration file's digest, as they are written."""
    return {
        name: held.model_copy(update={"calibration_sha256": file_sha256(folder / name)})
        if (folder / name).is_file()
        else held
        for name, held in bands.items()
    }


def shipped_name(calibration: str) -> str | None:
    """The shipped file a run's recorded calibration is: ``auto: NAME``, or a path into the shipped folder."""
    if calibration.startswith(f"{AUTO}:"):
        return calibration.split(":", 1)[1].strip()
    path = Path(calibration)
    return path.name if path.parent.resolve() == SHIPPED_DIR.resolve() else None


def band_words(calibration: str | None, sha256: str | None = None, path: Path = BANDS_FILE) -> str:
    """``calibration X: capacity held-out error +26..+70 % (1 run), ...``, or why there is none; ``sha256``: the
    digest of the calibration file the run used, as it recorded it (None: not recorded)."""
    if calibration is None:
        return f"uncalibrated: {NO_BAND}"
    name = shipped_name(calibration)
    held = read_bands(path).get(name) if name is not None else None
    if name is None or held is None:
        return f"calibration {name or Path(calibration).name}: {NO_BAND}"
    if sha256 is None:
        return f"calibration {name} (its version not recorded; the file as shipped now): {held.text()}"
    if held.calibration_sha256 is not None and sha256 != held.calibration_sha256:
        return f"calibration {name} (a version since changed): {NO_BAND} for it"
    return f"calibration {name}: {held.text()}"
