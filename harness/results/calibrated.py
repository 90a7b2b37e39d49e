"""``calibrated_ttft.json``: the calibrated simulator's TTFT per cell of a probe run, for reports.

``kvbench sim predict RUN --calibration FILE`` writes it (:mod:`harness.calibrate.predict`): per (arm,
context length, turn), the median over the cell's requests of the calibrated time model's unloaded TTFT
(ms). Reports show it beside the measured TTFT; they never fit or simulate anything themselves.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from common.schema import StrictModel, VersionedFile


class CalibratedCell(StrictModel):
    arm: str
    context_tokens: int
    turn: int
    predicted_ms: float


class CalibratedTtft(VersionedFile):
    """Predicted TTFT per cell; ``cells`` is empty when the calibration could not be used, and ``note`` says why."""

    FILE_NAME: ClassVar[str] = "calibrated_ttft.json"
    REBUILD_HINT: ClassVar[str] = "write it with `kvbench sim predict RUN_DIR --calibration FILE`"

    schema_version: Literal[1] = 1
    calibration: str
    note: str
    cells: list[CalibratedCell]

    def by_cell(self) -> dict[tuple[str, int, int], float]:
        return {(c.arm, c.context_tokens, c.turn): c.predicted_ms for c in self.cells}
