"""``kvbench selftest client``: how much latency kvbench's own client adds, against a server whose latency is known.

The simulator's fixed-latency server (:mod:`harness.sim.fixed`, started as ``workers`` processes on one port)
answers every request with exactly ``ttft_ms`` to the first token, counted from when it finished reading the
request body, and one token every ``itl_ms`` after it, on absolute deadlines; it logs when it really wrote each
first token. For each level (streams × client worker processes) kvbench's own load runner
(:func:`~harness.runs.load.run_load`, the code ``kvbench sweep`` runs) keeps ``streams`` requests in flight
(closed loop, no think time) with prompts of about ``prompt_tokens`` tokens for a warm-up and a measured window,
and this module reports, over the window's successful requests (ms):

* added TTFT = measured TTFT − ``ttft_ms``: what the client adds (encoding and sending the prompt, its loop's
  backlog before it reads the first chunk) plus what the server was late (reported beside it, from the server's
  log: first token written − first token due; on a shared machine the server and the client share the cores);
* added ITL = every measured inter-chunk gap − ``itl_ms``;
* requests/s, the client's CPU use in cores (Σ over its processes of CPU time / wall time over the window, from
  the window's :class:`~harness.store.events.ClientLag`), streams per core = streams / cores and requests/s per
  core = requests/s / cores, and the worst event-loop delay p99 of its processes.

Percentiles are nearest-rank (:func:`harness.client.fidelity.percentile_ns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.client.endpoint import Endpoint
from harness.client.fidelity import percentile_ns
from harness.client.openai import OpenAIClient
from harness.client.pool import ProcessClientPool, StreamingClient
from harness.engines.process import free_port
from harness.sim.fixed import MODEL_NAME
from harness.sim.tokenizer import SimTokenizer
from harness.store.records import RequestRecord
from workloads.config import MultiUserQA
from workloads.multi_user import MultiUserWorkload

from .load import LoadPlan, LoadWindow, RecordContext, run_load

NS_PER_MS = 1_000_000
ROUNDS = 2
"""Rounds per session: round 2 resends round 1's prompt with its answer and a new question (a returning user)."""
QUESTION_TOKENS = 16
MAX_CONTEXTS = 64
"""Distinct user contexts built (sessions share them round-robin): building 1,000 × 32k-token texts would take
longer than the measurement and change nothing for a server that caches nothing."""
SERVER_START_S = 60.0
Result = TypeVar("Result")


@dataclass(frozen=True)
class Spread:
    """A latency distribution over one population (ms; nearest-rank percentiles)."""

    n: int
    p50: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of_ns(cls, values_ns: Sequence[int]) -> Spread:
        if not values_ns:
            return cls(0, None, None, None)
        p50, p99, top = (percentile_ns(values_ns, q) / NS_PER_MS for q in (50, 99, 100))
        return cls(len(values_ns), p50, p99, top)


@dataclass(frozen=True)
class Level:
    """One load level of the self-test."""

    streams: int
    workers: int
    prompt_tokens: int
    output_tokens: int
    warmup_s: float
    duration_s: float
    use_uvloop: bool = True


@dataclass(frozen=True)
class LevelResult:
    """What the client added at one level (see the module docstring for each formula)."""

    streams: int
    workers: int
    prompt_tokens: int
    measured: int
    errors: int
    requests_per_s: float
    added_ttft: Spread
    added_itl: Spread
    server_late: Spread
    client_cores: float | None
    streams_per_core: float | None
    requests_per_s_per_core: float | None
    loop_delay_p99_ms: float | None
    send_lag_p99_ms: float | None


def workload_config(level: Level) -> MultiUserQA:
    """Sessions of :data:`ROUNDS` rounds whose prompts are about ``level.prompt_tokens`` tokens."""
    history = (ROUNDS - 1) * (QUESTION_TOKENS + level.output_tokens)
    return MultiUserQA.model_validate(
        {
            "kind": "multi_user_qa",
            "users": min(level.streams, MAX_CONTEXTS),
            "rounds": ROUNDS,
            "system_prompt_tokens": 0,
            "context_tokens": max(16, level.prompt_tokens - QUESTION_TOKENS - history // 2),
            "question_tokens": QUESTION_TOKENS,
            "answer_tokens": level.output_tokens,
            "think_time_s": 0,
            "warmup_requests": 0,
            "request_timeout_s": 600,
        }
    )


async def drive(
    base_url: str, level: Level, on_tick: Callable[[int], None] | None = None
) -> tuple[list[RequestRecord], LoadWindow]:
    """Keep ``level.streams`` requests in flight against ``base_url`` for the warm-up and the window."""
    workload = MultiUserWorkload(workload_config(level), SimTokenizer(), seed=level.streams)
    await workload.prepare()
    plan = LoadPlan(
        mode="concurrency",
        value=level.streams,
        warmup_s=level.warmup_s,
        duration_s=level.duration_s,
        ramp_up_s=min(level.warmup_s * 0.6, 3.0),
        stagger_rounds=False,
        drain_timeout_s=60.0,
    )
    records: list[RequestRecord] = []
    endpoint = Endpoint(base_url=base_url, model=MODEL_NAME)
    connections = level.streams + 8
    async with contextlib.AsyncExitStack() as stack:
        client: StreamingClient
        if level.workers > 1:
            pool = ProcessClientPool(
                endpoint,
                workers=level.workers,
                timeout_s=600.0,
                max_connections=connections,
                use_uvloop=level.use_uvloop,
            )
            client = await stack.enter_async_context(pool)
        else:
            client = await stack.enter_async_context(
                OpenAIClient(endpoint, timeout_s=600.0, max_connections=connections)
            )
        window = await run_load(
            client,
            workload,
            plan,
            RecordContext(arm="selftest", attempt=0),
            on_record=records.append,
            on_tick=on_tick,
            tick_s=0.5,
        )
    return records, window


def server_lateness_ns(stats_dir: Path, start_ns: int, end_ns: int) -> list[int]:
    """First token written − first token due, of the requests the server received in [start_ns, end_ns]."""
    out: list[int] = []
    for path in stats_dir.glob("fixed-*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a line being written
            if start_ns <= item["received_ns"] <= end_ns and item["first_sent_ns"]:
                out.append(item["first_sent_ns"] - item["first_due_ns"])
    return out


def level_result(
    level: Level,
    records: Sequence[RequestRecord],
    window: LoadWindow,
    lateness_ns: Sequence[int],
    ttft_ms: float,
    itl_ms: float,
) -> LevelResult:
    measured = [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    ttfts = [r.ttft_ns - int(ttft_ms * NS_PER_MS) for r in ok if r.ttft_ns is not None]
    gaps = [gap - int(itl_ms * NS_PER_MS) for r in ok for gap in r.itl_ns]
    rate = len(ok) / window.window_s if window.window_s > 0 else 0.0
    client = window.client
    fractions = [p.cpu_fraction for p in client.processes if p.cpu_fraction is not None] if client else []
    cores = sum(fractions) if fractions else None
    return LevelResult(
        streams=level.streams,
        workers=level.workers,
        prompt_tokens=level.prompt_tokens,
        measured=len(measured),
        errors=len(measured) - len(ok),
        requests_per_s=rate,
        added_ttft=Spread.of_ns(ttfts),
        added_itl=Spread.of_ns(gaps),
        server_late=Spread.of_ns(lateness_ns),
        client_cores=cores,
        streams_per_core=level.streams / cores if cores else None,
        requests_per_s_per_core=rate / cores if cores else None,
        loop_delay_p99_ms=client.loop_delay_p99_ms if client else None,
        send_lag_p99_ms=client.send_lag_p99_ms if client else None,
    )


def measure_level(
    base_url: str, stats_dir: Path, level: Level, ttft_ms: float, itl_ms: float, on_tick: Callable[[int], None] | None
) -> LevelResult:
    """Run one level in a new event loop of this process (uvloop when asked and installed)."""
    records, window = run_loop(drive(base_url, level, on_tick), level.use_uvloop)
    lateness = server_lateness_ns(stats_dir, window.window_start_ns, window.window_end_ns)
    return level_result(level, records, window, lateness, ttft_ms, itl_ms)


def run_loop(main: Coroutine[Any, Any, Result], use_uvloop: bool) -> Result:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def wait_healthy(base_url: str, server: subprocess.Popen[bytes], timeout_s: float = SERVER_START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the fixed-latency server exited (code {server.returncode}) before it served")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"the fixed-latency server at {base_url} did not answer /health within {timeout_s:g} s")


@contextlib.contextmanager
def fixed_server(
    ttft_ms: float, itl_ms: float, stats_dir: Path, *, workers: int = 1, use_uvloop: bool = True
) -> Iterator[str]:
    """A fixed-latency server on 127.0.0.1 (``workers`` processes, no usage blocks) logging into ``stats_dir``;
    yields its URL."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "harness.sim.fixed",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
        "--workers",
        str(workers),
        "--stats-dir",
        str(stats_dir),
        "--no-usage",  # the server's tokenizer would cost more than the client at long prompts
        *(["--uvloop"] if use_uvloop else []),
    ]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, server)
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
