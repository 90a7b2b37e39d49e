"""The simulator's fault injection (what soak tests break the 'staging cluster' with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sim.faults import FaultInjector, load_faults, parse_faults
from harness.sim.kvcache import TierState
from offload.profiles import OffloadTier


def tier() -> TierState:
    return TierState(
        tier=OffloadTier(kind="cpu", capacity_gb=1),
        capacity_chunks=100,
        read_bytes_per_s=1e9,
        write_bytes_per_s=1e9,
        latency_s=0.0,
    )


def test_request_windows_and_kinds() -> None:
    faults = parse_faults(
        [
            {"kind": "http_error", "status": 503, "from_request": 2, "requests": 2},
            {"kind": "latency_spike", "extra_ms": 250, "from_request": 1, "requests": 1},
            {"kind": "drop_stream", "after_tokens": 3, "from_request": 5},
        ],
        "test",
    )
    injector = FaultInjector(faults)
    seen = [injector.on_request() for _ in range(7)]
    assert [r.http_status for r in seen] == [None, None, 503, 503, None, None, None]
    assert [r.delay_s for r in seen] == [0.0, 0.25, 0, 0, 0, 0, 0]
    assert [r.drop_after_tokens for r in seen] == [None] * 5 + [3, 3]
    assert injector.injected == {"http_error": 2, "latency_spike": 1, "drop_stream": 2}


def test_time_windows_use_the_first_request_as_zero() -> None:
    now = [100.0]
    faults = parse_faults([{"kind": "http_error", "start_s": 1.0, "duration_s": 2.0}], "test")
    injector = FaultInjector(faults, clock=lambda: now[0])
    assert injector.on_request().http_status is None  # t = 0
    now[0] = 101.5
    assert injector.on_request().http_status == 500
    now[0] = 103.5
    assert injector.on_request().http_status is None


def test_probability_is_seeded() -> None:
    faults = parse_faults([{"kind": "http_error", "probability": 0.3}], "test")
    runs = []
    for _ in range(2):
        injector = FaultInjector(faults, seed=7)
        runs.append([injector.on_request().http_status for _ in range(200)])
    assert runs[0] == runs[1]
    hits = sum(status == 500 for status in runs[0])
    assert 35 < hits < 85


def test_slow_and_full_tier() -> None:
    cpu = tier()
    assert cpu.store(1, 1e6, now=0.0)
    written_fast = cpu.write_busy_until
    faults = parse_faults(
        [
            {"kind": "slow_tier", "factor": 10, "from_request": 1, "requests": 1},
            {"kind": "full_tier", "tier": "cpu", "from_request": 2, "requests": 1},
        ],
        "test",
    )
    injector = FaultInjector(faults)
    injector.on_request([cpu])
    assert cpu.slow_factor == 1.0
    injector.on_request([cpu])  # request 1: slow
    assert cpu.slow_factor == 10.0
    assert cpu.store(2, 1e6, now=10.0)
    assert cpu.write_busy_until - 10.0 == pytest.approx(10 * written_fast)
    injector.on_request([cpu])  # request 2: full -- contents gone, writes refused
    assert cpu.slow_factor == 1.0 and cpu.refuse_writes and not cpu.chunks
    assert not cpu.store(3, 1e6, now=20.0) and cpu.refused_writes == 1
    injector.on_request([cpu])  # window closed: writes accepted again
    assert not cpu.refuse_writes and cpu.store(3, 1e6, now=30.0)


def test_fault_files_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("faults:\n  - {kind: latency_spike, extra_ms: 100, probability: 0.5}\n")
    assert load_faults(path)[0].kind == "latency_spike"
    with pytest.raises(ValueError, match="fault kinds: latency_spike, http_error"):
        parse_faults([{"kind": "meteor"}], "f.yaml")
    with pytest.raises(ValueError, match=r"in seconds .* or in requests"):
        parse_faults([{"kind": "http_error", "start_s": 1, "from_request": 3}], "f.yaml")
