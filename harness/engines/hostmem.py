"""Host DRAM an engine's offload tier will pin, checked against what the host has before the engine starts.

An engine that pins more host memory than the machine has is killed by the kernel's OOM killer minutes
into its start-up, and its log ends without a word on why (vLLM prints "Engine core initialization
failed ... Failed core proc(s): {}"). Measured on 1× H100 (128 GiB host, vLLM 0.26.0): the native CPU
offload with ``--kv-offloading-size 93.132`` (a 100 GB tier) held 126.7 GB of shared memory when the
kernel killed it, still allocating; a 60 GB tier started and ran. So before starting, kvbench compares
a lower bound of what the tier pins with ``MemAvailable`` and refuses what certainly cannot fit:

    pinned bytes ≥ capacity_gb × 10⁹ × factor,  factor = 1.27 for vLLM's native offload (the measured
    lower bound above), 1.0 for LMCache (its CPU buffer is the tier, split over the TP ranks).
"""

from __future__ import annotations

from pathlib import Path

from common.errors import EngineStartError

MEMINFO = Path("/proc/meminfo")
NATIVE_PIN_FACTOR = 1.27
"""Host bytes vLLM's native CPU offload pins per byte of ``--kv-offloading-size``, at least (measured)."""


def available_host_bytes(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where the file or the line is missing."""
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                return int(fields[0]) * 1024
    return None


def check_host_memory(pinned_bytes: int, what: str, available: int | None) -> None:
    """Raise :class:`EngineStartError` when ``pinned_bytes`` exceed ``available`` (unknown: no check)."""
    if pinned_bytes <= 0 or available is None or pinned_bytes <= available:
        return
    raise EngineStartError(
        f"{what} would pin at least {pinned_bytes / 1e9:.1f} GB of host memory, but this host has "
        f"{available / 1e9:.1f} GB available (MemAvailable): the kernel would kill the engine while it starts. "
        "Lower the tier's capacity_gb in the arm's offload profile."
    )
