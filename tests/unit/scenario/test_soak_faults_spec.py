"""``soak.faults`` validation, and how long a fault broke the SLO (a pure function of stored events and records)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.results.soak_result import fault_outcomes
from harness.scenario.spec import SLO, SoakSpec
from harness.store.events import FaultEvent
from harness.store.records import RequestRecord
from tests.resultfiles import request_record


def test_pause_needs_a_duration_and_only_pause_takes_one() -> None:
    with pytest.raises(ValidationError, match="pause_engine needs duration"):
        SoakSpec(window=60, interval=10, faults=[{"kind": "pause_engine", "at": 5}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="kill_engine takes no duration"):
        SoakSpec(window=60, interval=10, faults=[{"kind": "kill_engine", "at": 5, "duration": 3}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="Input should be 'kill_engine', 'pause_engine' or 'restart_tier'"):
        SoakSpec(window=60, interval=10, faults=[{"kind": "unplug", "at": 5}])  # type: ignore[list-item]


def test_a_fault_must_fall_inside_the_window() -> None:
    with pytest.raises(ValidationError, match=r"faults\[0\].at \(90 s\) is not inside the window \(60 s\)"):
        SoakSpec(window=60, interval=10, faults=[{"kind": "kill_engine", "at": "90s"}])  # type: ignore[list-item]
    spec = SoakSpec(window=60, interval=10, faults=[{"kind": "pause_engine", "at": "30s", "duration": "5s"}])  # type: ignore[list-item]
    assert spec.faults[0].duration == 5.0


def _record(start_s: float, ttft_ms: float | None) -> RequestRecord:
    ok = ttft_ms is not None
    return request_record(
        "ON",
        0,
        0,
        1,
        request_id=f"r{start_s}",
        started_ns=int(start_s * 1e9),
        ttft_ns=int(ttft_ms * 1e6) if ttft_ms is not None else None,
        e2e_ns=int((ttft_ms or 0) * 2e6) if ok else None,
        ok=ok,
        error_kind=None if ok else "connection",
    )


def test_slo_broken_is_from_the_fault_to_the_first_request_within_the_slo() -> None:
    event = FaultEvent(index=0, kind="kill_engine", attempt=0, at_s=10.0, start_unix_ns=0,
                       started_ns=int(10e9), ended_ns=int(12e9), recovery_s=2.0)  # fmt: skip
    # before the fault (ignored), two failures, one too slow, then the first within 100 ms at 13.5 s
    records = [_record(9.0, 50), _record(10.2, None), _record(11.0, None), _record(12.5, 900), _record(13.5, 60),
               _record(14.0, 55)]  # fmt: skip
    (outcome,) = fault_outcomes([event], lambda: iter(records), SLO(ttft_ms=100))
    assert outcome.slo_broken_s == pytest.approx(13.5 - 10.0)
    assert outcome.missed == 3
    assert outcome.held_s == pytest.approx(2.0)
    never = fault_outcomes([event], lambda: iter(records[:4]), SLO(ttft_ms=100))[0]
    assert never.slo_broken_s is None and "never recovered" in never.describe()
