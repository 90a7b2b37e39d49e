"""The analytical model's load/compute overlap modes (``ttft_overlap``): formulas and expected shape."""

from __future__ import annotations

import math

import pytest

from offload.analytical import (
    bidirectional_gain,
    bidirectional_split,
    ttft_kv,
    ttft_no_kv,
    ttft_overlap,
)

N = 32768
T = 4e-5  # s/token of compute
W = 1e-6  # s/token of store (never the bottleneck here)
REUSE = [0.0, 0.25, 0.5, 0.9, 0.99, 1.0]
LOAD = [T / 20, T / 5, T / 2, T, 2 * T, 5 * T]  # R from a fast to a slow tier


@pytest.mark.parametrize("a", REUSE)
@pytest.mark.parametrize("r", LOAD)
def test_bidirectional_never_slower_than_compute_only_or_load_only(a: float, r: float) -> None:
    both = ttft_overlap(N, a, T, r, W, "bidirectional")
    assert both <= ttft_no_kv(N, T) * (1 + 1e-12)
    assert both <= ttft_overlap(N, a, T, r, W, "none") * (1 + 1e-12)
    assert ttft_overlap(N, a, T, r, W, "layerwise") <= ttft_overlap(N, a, T, r, W, "none") * (1 + 1e-12)


def test_none_is_the_sum_and_layerwise_tends_to_the_decks_overlap() -> None:
    a, r = 0.9, T / 2
    assert math.isclose(ttft_overlap(N, a, T, r, W, "none"), a * N * r + (1 - a) * N * T)
    deep = ttft_overlap(N, a, T, r, W, "layerwise", layers=10**9)
    assert math.isclose(deep, ttft_kv(N, a, T, r, W), rel_tol=1e-6)
    shallow = ttft_overlap(N, a, T, r, W, "layerwise", layers=1)  # one stage: nothing overlaps
    assert math.isclose(shallow, ttft_overlap(N, a, T, r, W, "none"))


def test_bidirectional_splits_where_both_halves_take_equally_long() -> None:
    a, r = 0.75, T / 3
    h = bidirectional_split(N, a, T, r)
    assert math.isclose(h * T, (a * N - h) * r)
    assert math.isclose(ttft_overlap(N, a, T, r, W, "bidirectional"), h * T + (1 - a) * N * T)


def test_the_gain_peaks_at_two_where_compute_equals_load() -> None:
    ratios = [2 ** (k / 4) for k in range(-16, 17)]  # e = T/R from 1/16 to 16
    gains = []
    for e in ratios:
        r = T / e
        better = min(ttft_no_kv(N, T), ttft_overlap(N, 1.0, T, r, W, "none"))
        gains.append(better / ttft_overlap(N, 1.0, T, r, W, "bidirectional"))
        assert math.isclose(gains[-1], bidirectional_gain(T, r))
    assert ratios[gains.index(max(gains))] == 1.0
    assert math.isclose(max(gains), 2.0)
    assert gains[0] < 1.1 and gains[-1] < 1.1


def test_bad_mode_and_reuse_are_errors() -> None:
    with pytest.raises(ValueError, match="overlap must be one of"):
        ttft_overlap(N, 0.5, T, T, W, "both")  # type: ignore[arg-type]  # not a mode on purpose: the runtime check
    with pytest.raises(ValueError, match="reuse ratio"):
        ttft_overlap(N, 1.5, T, T, W, "none")
