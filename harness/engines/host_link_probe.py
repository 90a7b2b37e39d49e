"""Host link probe: how fast pinned host memory reaches each GPU, alone and with every GPU at once.

An offload tier's turn-2 load is a host-to-device copy. Two hosts of one kind (4x H200 VMs) gave
LMCache per-rank retrieval rates of 42 GB/s and 19-36 GB/s (docs/simulator.md, "Run to run"), and
nothing in those runs' files said why. This probe puts the link's own rate into the run's manifest,
so a load rate can be read against the link it ran on.

Measured, per GPU, with ``--mib`` MiB buffers (default 1024), after one warm-up copy, the median of
``--repeats`` copies (default 5), in GB/s (10^9 bytes per second):

* ``h2d_gbps``: pinned host -> device, this GPU alone (CUDA events around one ``copy_``);
* ``d2h_gbps``: device -> pinned host, alone;
* ``h2d_concurrent_gbps``: pinned host -> device while every listed GPU copies at the same time, one
  process per GPU (as TP ranks load their KV shards: one process each), started together at a barrier;
  ``concurrent_aggregate_gbps`` = all bytes copied / (last end - first start) on the host's monotonic
  clock, over the same ``--repeats`` rounds (median).

Run by the *engine's* Python, which has torch and no kvbench: this file is standard-library only
apart from torch, imported inside the functions that need it, and imports nothing from kvbench. It
prints one line, ``KVBENCH_HOST_LINK <json>``; without CUDA the JSON has ``error`` and no rates.

    python host_link_probe.py --gpus 0,1,2,3 --mib 1024 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

MARKER = "KVBENCH_HOST_LINK "
BYTES_PER_MIB = 1024 * 1024


def _copy_seconds(torch: Any, gpu: int, nbytes: int, repeats: int, to_device: bool) -> list[float]:
    """Seconds of each of ``repeats`` copies of ``nbytes`` between pinned host memory and ``gpu``."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
    source, target = (host, device) if to_device else (device, host)
    with torch.cuda.device(gpu):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        target.copy_(source, non_blocking=True)  # warm-up: first-touch and driver setup
        torch.cuda.synchronize(gpu)
        seconds = []
        for _ in range(repeats):
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            end.synchronize()
            seconds.append(float(start.elapsed_time(end)) / 1000.0)
    return seconds


def _concurrent_worker(gpu: int, nbytes: int, repeats: int, barrier: Any, results: Any) -> None:
    """One rank: at each round's barrier, one host -> device copy; (start_ns, end_ns) per round."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize(gpu)
    spans = []
    for _ in range(repeats):
        barrier.wait()
        began = time.monotonic_ns()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize(gpu)
        spans.append((began, time.monotonic_ns()))
    results.put((gpu, spans))


def _concurrent(gpus: list[int], nbytes: int, repeats: int) -> tuple[dict[int, float], float]:
    """Per GPU median rate while all copy at once, and the median aggregate rate over the rounds."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    barrier = context.Barrier(len(gpus))
    results = context.Queue()
    workers = [
        context.Process(target=_concurrent_worker, args=(gpu, nbytes, repeats, barrier, results)) for gpu in gpus
    ]
    for worker in workers:
        worker.start()
    spans = dict(results.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    per_gpu = {
        gpu: statistics.median(nbytes / ((end - began) / 1e9) / 1e9 for began, end in spans[gpu]) for gpu in gpus
    }
    aggregate = []
    for round_index in range(repeats):
        first = min(spans[gpu][round_index][0] for gpu in gpus)
        last = max(spans[gpu][round_index][1] for gpu in gpus)
        aggregate.append(len(gpus) * nbytes / ((last - first) / 1e9) / 1e9)
    return per_gpu, statistics.median(aggregate)


def measure(gpus: list[int] | None, mib: int, repeats: int) -> dict[str, Any]:
    """The probe's JSON document (see the module docstring)."""
    try:
        import torch
    except ImportError as error:
        return {"error": f"torch is not importable: {error}"}
    if not torch.cuda.is_available():
        return {"error": "CUDA is not available to torch"}
    listed = list(range(torch.cuda.device_count())) if gpus is None else gpus
    nbytes = mib * BYTES_PER_MIB
    rates: dict[int, dict[str, float]] = {}
    for gpu in listed:
        h2d = statistics.median(_copy_seconds(torch, gpu, nbytes, repeats, to_device=True))
        d2h = statistics.median(_copy_seconds(torch, gpu, nbytes, repeats, to_device=False))
        rates[gpu] = {"h2d_gbps": nbytes / h2d / 1e9, "d2h_gbps": nbytes / d2h / 1e9}
    torch.cuda.empty_cache()
    concurrent, aggregate = _concurrent(listed, nbytes, repeats)
    return {
        "bytes_per_copy": nbytes,
        "repeats": repeats,
        "torch": str(torch.__version__),
        "gpus": [
            {
                "index": gpu,
                "name": str(torch.cuda.get_device_name(gpu)),
                **{key: round(value, 3) for key, value in rates[gpu].items()},
                "h2d_concurrent_gbps": round(concurrent[gpu], 3),
            }
            for gpu in listed
        ],
        "concurrent_aggregate_gbps": round(aggregate, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pinned host <-> GPU copy rates, alone and all GPUs at once")
    parser.add_argument("--gpus", help="comma-separated CUDA device indices (default: every visible GPU)")
    parser.add_argument("--mib", type=int, default=1024, help="bytes per copy, in MiB (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="timed copies per measurement (default 5)")
    args = parser.parse_args(argv)
    gpus = None if args.gpus is None else [int(part) for part in args.gpus.split(",") if part.strip()]
    print(MARKER + json.dumps(measure(gpus, args.mib, args.repeats), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
