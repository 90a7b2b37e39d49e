"""Analytical prefill model against hand-computed cases."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from offload import analytical as am
from offload.profiles import OffloadTier

approx = pytest.approx


# ---- per-token quantities ---------------------------------------------------------------------


def test_flops_per_token_by_hand() -> None:
    # 2·P + 2·L·d·N = 2e9 + 2·2·4·10
    assert am.flops_per_token(1e9, layers=2, attention_dim=4, context_tokens=10) == 2e9 + 160
    assert am.flops_per_token(1e9, layers=2, attention_dim=4, context_tokens=0) == 2e9


def test_compute_time_per_token_by_hand() -> None:
    # 1e12 FLOP / (2 GPUs · 1e15 FLOP/s · 0.5) = 1 ms
    assert am.compute_time_per_token(1e12, peak_flops=1e15, mfu=0.5, tp=2) == approx(1e-3)


def test_llama_8b_on_h100_at_128k() -> None:
    n = 131072
    flops = 2 * 6.98e9 + 2 * 32 * 4096 * n  # 4.832e10 FLOP/token
    t = am.model_time_per_token(am.LLAMA_3_1_8B, am.H100_SXM, n)
    assert t == approx(flops / (989e12 * 0.5))
    assert t == approx(9.7714e-5, rel=1e-4)


def test_time_per_token_from_ttft() -> None:
    assert am.time_per_token_from_ttft(12.8, 128_000) == approx(1e-4)


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        (1, 2 * 32 * 8 * 128 * 2),  # 131072 B = 128 KiB per token
        (2, 2 * 32 * 4 * 128 * 2),
        (8, 2 * 32 * 1 * 128 * 2),
        (16, 2 * 32 * 1 * 128 * 2),  # KV heads replicated once TP > kv_heads
    ],
)
def test_kv_bytes_per_token(tp: int, expected: int) -> None:
    assert am.kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2, tp=tp) == expected
    assert am.model_kv_bytes_per_token(am.LLAMA_3_1_8B, tp) == expected


def test_kv_bytes_rejects_tp_that_does_not_divide() -> None:
    with pytest.raises(ValueError, match="divide"):
        am.kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2, tp=3)


def test_read_and_write_time_per_token() -> None:
    # 131072 B at 25 GB/s and 20 GB/s
    assert am.read_time_per_token(131072, 25) == approx(5.24288e-6)
    assert am.write_time_per_token(131072, 20) == approx(6.5536e-6)


# ---- the deck's example: e = 9 ----------------------------------------------------------------

T, R, W = 9e-6, 1e-6, 1e-6  # s/token; e = T/R = 9, W ≤ T
N = 1000


def test_deck_example_crossover() -> None:
    e = am.compute_io_ratio(T, R)
    assert e == approx(9)
    assert am.crossover_reuse(e) == approx(0.9)
    assert am.crossover_reuse(0) == 0


def test_full_reuse_speedup_is_e() -> None:
    # IO-bound, full reuse: TTFT_KV = N·R, so speedup = T/R = e.
    assert am.ttft_kv(N, 1.0, T, R, W) == approx(N * R)
    assert am.speedup(1.0, T, R, W) == approx(9)
    assert am.regime(1.0, T, R, W) == "io-bound"


def test_peak_speedup_at_crossover_is_one_plus_e() -> None:
    assert am.ttft_kv(N, 0.9, T, R, W) == approx(0.9 * N * R)
    assert am.speedup(0.9, T, R, W) == approx(10)


def test_no_reuse_is_max_of_write_and_compute() -> None:
    # a = 0: TTFT_KV = max(N·W, N·T)
    assert am.ttft_kv(N, 0.0, T, R, W) == approx(N * T)
    assert am.speedup(0.0, T, R, W) == approx(1)
    assert am.regime(0.0, T, R, W) == "compute-bound"
    slow_write = 2 * T
    assert am.ttft_kv(N, 0.0, T, R, slow_write) == approx(N * slow_write)
    assert am.speedup(0.0, T, R, slow_write) == approx(0.5)
    assert am.regime(0.0, T, R, slow_write) == "write-bound"


def test_ttft_by_hand() -> None:
    assert am.ttft_no_kv(N, T) == approx(9e-3)
    # a = 0.5: max(0.5·1000·1e-6, 0.5·1000·1e-6, 0.5·1000·9e-6) = 4.5 ms
    assert am.ttft_kv(N, 0.5, T, R, W) == approx(4.5e-3)
    assert am.speedup(0.5, T, R, W) == approx(2)
    # a = 0.95: max(0.95 ms, 0.05 ms, 0.45 ms) = 0.95 ms -> speedup 9/0.95 = e/a
    assert am.ttft_kv(N, 0.95, T, R, W) == approx(0.95e-3)
    assert am.speedup(0.95, T, R, W) == approx(9 / 0.95)


@pytest.mark.parametrize("eps", [1e-3, 1e-6])
def test_regime_switches_at_crossover(eps: float) -> None:
    a_star = am.crossover_reuse(am.compute_io_ratio(T, R))
    assert am.regime(a_star - eps, T, R, W) == "compute-bound"
    assert am.regime(a_star, T, R, W) == "io-bound"
    assert am.regime(a_star + eps, T, R, W) == "io-bound"


def test_write_bound_above_crossover_when_writes_are_slow() -> None:
    # W = 20·T: at a = 0.95, (1−a)·W = 0.05·180e-6 = 9e-6 > a·R = 0.95e-6.
    assert am.regime(0.95, T, R, 20 * T) == "write-bound"
    assert am.regime(1.0, T, R, 20 * T) == "io-bound"


@pytest.mark.parametrize(("a", "t", "r", "w"), [(-0.1, T, R, W), (1.1, T, R, W), (0.5, 0, R, W)])
def test_invalid_inputs(a: float, t: float, r: float, w: float) -> None:
    with pytest.raises(ValueError):
        am.ttft_kv(N, a, t, r, w)


def test_infinite_and_nan_rejected() -> None:
    with pytest.raises(ValueError):
        am.speedup(0.5, math.inf, R, W)
    with pytest.raises(ValueError):
        am.speedup(0.5, math.nan, R, W)


# ---- property: monotone below a* (plain parametrized cases) --------------------------------------

CASES = [
    # (T, R, W) with W ≤ T
    (9e-6, 1e-6, 1e-6),
    (9e-6, 1e-6, 9e-6),
    (1e-4, 5e-6, 6e-6),
    (1e-5, 1e-5, 1e-6),  # e = 1, a* = 0.5
    (3e-5, 1e-4, 2e-5),  # e = 0.3, slow tier
    (1e-3, 1e-7, 1e-3),  # e = 1e4
]


@pytest.mark.parametrize(("t", "r", "w"), CASES)
def test_speedup_non_decreasing_below_crossover(t: float, r: float, w: float) -> None:
    a_star = am.crossover_reuse(am.compute_io_ratio(t, r))
    grid = [a_star * i / 50 for i in range(50)]  # 0 ≤ a < a*
    values = [am.speedup(a, t, r, w) for a in grid]
    assert all(later >= earlier for earlier, later in itertools.pairwise(values))
    assert values[0] == approx(1)
    for a, s in zip(grid, values, strict=True):
        assert s == approx(1 / (1 - a))  # compute-bound: (1−a)·N·T


@pytest.mark.parametrize(("t", "r", "w"), CASES)
def test_speedup_peaks_at_crossover_and_ends_at_e(t: float, r: float, w: float) -> None:
    e = am.compute_io_ratio(t, r)
    a_star = am.crossover_reuse(e)
    assert am.speedup(a_star, t, r, w) == approx(1 + e)
    assert am.speedup(1.0, t, r, w) == approx(e)
    above = [a_star + (1 - a_star) * i / 20 for i in range(1, 21)]
    values = [am.speedup(a, t, r, w) for a in above]
    assert all(later <= earlier for earlier, later in itertools.pairwise(values))


# ---- end-to-end throughput bound ----------------------------------------------------------------


def test_decode_kv_bytes() -> None:
    assert am.decode_kv_bytes(100, n_in=1000) == 100_000
    assert am.decode_kv_bytes(100, n_in=1000, n_out=200) == 110_000


def test_e2e_gain_bound_by_hand() -> None:
    # AP = 10 s / 100 = 0.1 s/token; AH = 1e9 B / (1000 GB/s) = 1e-3 s/token -> 1 + 100
    assert am.e2e_tps_gain_bound(10.0, 100, 1e9, 1000) == approx(101)


def test_e2e_gain_tends_to_bound_and_is_one_without_change() -> None:
    bound = am.e2e_tps_gain_bound(10.0, 100, 1e9, 1000)
    assert am.e2e_tps_gain(10.0, 0.0, 100, 1e9, 1000) == approx(bound)
    assert am.e2e_tps_gain(10.0, 10.0, 100, 1e9, 1000) == approx(1)
    # TTFT_KV = 1 s: (0.1 + 0.001) / (0.01 + 0.001)
    assert am.e2e_tps_gain(10.0, 1.0, 100, 1e9, 1000) == approx(0.101 / 0.011)


def test_e2e_gain_equals_e_hbm_over_n_out_for_short_outputs() -> None:
    # With |KV(1)| = N·|KV_tok| and TTFT(1) = N·T: AP/AH = T·BW_HBM / (N_out·|KV_tok|).
    t, kv, n, n_out, hbm = 1e-4, 131072.0, 131072, 512, 3350.0
    gain = am.e2e_tps_gain_bound(n * t, n_out, am.decode_kv_bytes(kv, n), hbm)
    assert gain == approx(1 + t * hbm * 1e9 / (n_out * kv))


# ---- Prediction -------------------------------------------------------------------------------


def test_predict_bundles_inputs_and_outputs() -> None:
    p = am.predict(N, 0.5, t_s=T, r_s=R, w_s=W)
    assert (p.n_tokens, p.a, p.t_s, p.r_s, p.w_s) == (N, 0.5, T, R, W)
    assert p.e == approx(9)
    assert p.a_star == approx(0.9)
    assert p.regime == "compute-bound"
    assert p.ttft_no_kv_s == approx(9e-3)
    assert p.ttft_kv_s == approx(4.5e-3)
    assert p.speedup == approx(2)


def test_prediction_round_trips_and_is_frozen() -> None:
    p = am.predict(N, 1.0, t_s=T, r_s=R, w_s=W)
    assert am.Prediction.model_validate_json(p.model_dump_json()) == p
    with pytest.raises(ValidationError):
        p.speedup = 100.0  # type: ignore[misc]  # frozen on purpose: the runtime refusal


def test_prediction_rejects_outputs_that_do_not_follow() -> None:
    data = am.predict(N, 1.0, t_s=T, r_s=R, w_s=W).model_dump()
    with pytest.raises(ValidationError, match="speedup"):
        am.Prediction.model_validate(data | {"speedup": 100.0})
    with pytest.raises(ValidationError, match="regime"):
        am.Prediction.model_validate(data | {"regime": "compute-bound"})


def test_predict_for_worked_example() -> None:
    """docs/analytical-model.md: Llama-3.1-8B, H100, CPU tier 25/20 GB/s, 128k tokens."""
    tier = OffloadTier(kind="cpu", capacity_gb=64, read_gbps=25, write_gbps=20)
    n = 131072
    p = am.predict_for(am.LLAMA_3_1_8B, am.H100_SXM, tier, n, 1.0)
    assert p.t_s == approx(9.7714e-5, rel=1e-4)
    assert p.r_s == approx(5.24288e-6)
    assert p.w_s == approx(6.5536e-6)
    assert p.e == approx(18.64, rel=1e-3)
    assert p.a_star == approx(0.9491, rel=1e-4)
    assert p.ttft_no_kv_s == approx(12.81, rel=1e-3)
    assert p.ttft_kv_s == approx(0.687, rel=1e-3)
    assert p.speedup == approx(p.e)
    half = am.predict_for(am.LLAMA_3_1_8B, am.H100_SXM, tier, n, 0.5)
    assert half.regime == "compute-bound"
    assert half.speedup == approx(2)


def test_predict_for_accepts_measured_t_and_default_bandwidths() -> None:
    tier = OffloadTier(kind="cpu", capacity_gb=64)  # defaults: 25 GB/s read, 20 GB/s write
    p = am.predict_for(am.LLAMA_3_1_8B, am.H100_SXM, tier, 100_000, 1.0, t_s=1e-4)
    assert p.t_s == 1e-4
    assert p.r_s == approx(131072 / 25e9)
    assert p.w_s == approx(131072 / 20e9)
