"""A tier that cannot fit in host DRAM is refused before the engine starts (the OOM killer gives no reason)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from common.errors import EngineStartError
from harness.engines.configs import Parallelism, VllmEngineConfig
from harness.engines.hostmem import NATIVE_PIN_FACTOR, available_host_bytes, check_host_memory
from harness.engines.vllm_offload import render_vllm_launch
from offload.profiles import OffloadProfile, OffloadTier

Backend = Literal["lmcache", "lmcache-mp", "native"]


def cpu_tier(backend: Backend, gb: float) -> OffloadProfile:
    return OffloadProfile(name=f"{backend}-{gb:g}", backend=backend, tiers=(OffloadTier(kind="cpu", capacity_gb=gb),))


def test_mem_available_is_read_in_bytes(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   130023424 kB\n")
    assert available_host_bytes(meminfo) == 130023424 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")
    assert available_host_bytes(meminfo) is None
    assert available_host_bytes(tmp_path / "missing") is None
    assert available_host_bytes() is not None  # this Linux host


def test_each_backend_says_what_it_pins(tmp_path: Path) -> None:
    cuda = VllmEngineConfig(kind="vllm", model="m", device="cuda")
    native = render_vllm_launch(cpu_tier("native", 100), cuda, True, tmp_path)
    assert native.pinned_host_bytes == int(100e9 * NATIVE_PIN_FACTOR)
    split = VllmEngineConfig(kind="vllm", model="m", device="cuda", parallelism=Parallelism(tp=4))
    lmcache = render_vllm_launch(cpu_tier("lmcache", 160), split, True, tmp_path)
    assert lmcache.pinned_host_bytes == int(160e9)  # 40 GB on each of 4 ranks
    server = render_vllm_launch(
        cpu_tier("lmcache-mp", 8), cuda, True, tmp_path, port_factory=iter(range(7000, 7100)).__next__
    )
    assert server.pinned_host_bytes == int(8e9)
    assert render_vllm_launch(OffloadProfile(name="hbm"), cuda, True, tmp_path).pinned_host_bytes == 0


def test_the_h100_hosts_oom_is_refused_with_what_to_change(tmp_path: Path) -> None:
    """1x H100, 128 GiB host: the native 100 GB tier was OOM-killed while starting; 60 GB ran."""
    cuda = VllmEngineConfig(kind="vllm", model="m", device="cuda")
    available = 124 * 10**9
    plan = render_vllm_launch(cpu_tier("native", 100), cuda, True, tmp_path)
    with pytest.raises(EngineStartError, match=r"at least 127\.0 GB.*124\.0 GB available.*capacity_gb"):
        check_host_memory(plan.pinned_host_bytes, "arm AMG-ON-native", available)
    fits = render_vllm_launch(cpu_tier("native", 60), cuda, True, tmp_path)
    check_host_memory(fits.pinned_host_bytes, "arm AMG-ON-native", available)
    check_host_memory(plan.pinned_host_bytes, "unknown host", None)  # nothing to compare with: no check
