"""A sweep's stored load points (multi-user or agentic), ready for the metric formulas.

Per (arm, point) the attempt that finished it (its latest :class:`~harness.store.events.PointDone`) is kept;
records of other attempts of a finished point are ``discarded`` (a point re-run after an interrupted attempt).
Each kept point's records (every phase, that attempt) and the inter-token gaps of its successful measured
requests become the :class:`~.sweep_metrics.PointData` the formulas of :mod:`.sweep_metrics` read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.store.events import PointDone
from harness.store.records import RequestRecord

from .sweep_metrics import PointData, point_data
from .sweep_result import PointResult, SloLimits, SweepCounts


@dataclass(frozen=True)
class StoredPoint:
    arm: str
    index: int
    records: pd.DataFrame
    """The point's records of the kept attempt, every phase (RequestRecord columns, ``itl_ns`` left out)."""
    data: PointData


@dataclass(frozen=True)
class StoredGrid:
    points: list[StoredPoint]
    """In arm order, then point order; a point without a PointDone is left out."""
    complete: bool
    """Every (arm, point) of the grid has a PointDone."""
    sent: int
    warmup: int
    discarded: int

    def counts(self, results: Sequence[PointResult]) -> SweepCounts:
        measured = sum(p.measured for p in results)
        ok = sum(p.ok for p in results)
        return SweepCounts(
            sent=self.sent, measured=measured, ok=ok, errors=measured - ok, warmup=self.warmup, discarded=self.discarded
        )


def kept_attempts(events: Iterable[PointDone]) -> dict[tuple[str, int], PointDone]:
    """Per (arm, point), the PointDone of its latest attempt."""
    chosen: dict[tuple[str, int], PointDone] = {}
    for event in events:
        current = chosen.get(event.key)
        if current is None or event.attempt >= current.attempt:
            chosen[event.key] = event
    return chosen


def stored_grid(
    arms: Sequence[str],
    grid_size: int,
    records: Iterable[RequestRecord],
    events: Iterable[PointDone],
    gpus: int,
    slo: SloLimits,
) -> StoredGrid:
    """The kept points of an ``arms`` × ``grid_size`` sweep from its stored records and point events."""
    chosen = kept_attempts(events)
    records = list(records)
    df = pd.DataFrame([record.model_dump(exclude={"itl_ns"}) for record in records])
    itl_by_id = {r.request_id: r.itl_ns for r in records if r.phase == "measure" and r.ok and r.point is not None}
    discarded = 0
    if not df.empty:
        loaded = df[df["point"].notna()]
        keys = zip(loaded["arm"], loaded["point"].astype("int64"), loaded["attempt"], strict=True)
        keep = [chosen.get((str(a), int(p))) is not None and chosen[(str(a), int(p))].attempt == t for a, p, t in keys]
        discarded = int(len(loaded) - sum(keep))
    points = []
    for arm in arms:
        for index in range(grid_size):
            event = chosen.get((arm, index))
            if event is None:
                continue
            subset = (
                df if df.empty else df[(df["arm"] == arm) & (df["point"] == index) & (df["attempt"] == event.attempt)]
            )
            ids: list[str] = []
            if not subset.empty:
                good = subset[(subset["phase"] == "measure") & subset["ok"].astype(bool)]
                ids = [str(rid) for rid in good["request_id"]]
            gaps = np.asarray([gap for rid in ids for gap in itl_by_id.get(rid, [])], dtype="float64")
            points.append(StoredPoint(arm, index, subset, point_data(subset, gaps, event, gpus, slo)))
    planned = {(arm, i) for arm in arms for i in range(grid_size)}
    return StoredGrid(
        points=points,
        complete=planned <= set(chosen),
        sent=len(df),
        warmup=int((df["phase"] == "warmup").sum()) if not df.empty else 0,
        discarded=discarded,
    )


def errors_by_kind(points: Iterable[PointResult]) -> dict[str, int]:
    """Failed measured requests by error kind, summed over the points."""
    total: dict[str, int] = {}
    for point in points:
        for kind, count in point.errors_by_kind.items():
            total[kind] = total.get(kind, 0) + count
    return total
