"""A returning user on an endpoint without a prefix-cache reset (``between_turns: auto``, the default).

The endpoint is the simulator (offload ``hbm``: a GPU prefix cache, no tier; a KV cache of 1,500 blocks of 16
tokens, so both conversations' turn 1 of the longest context fit in it and turn 2 would hit it) behind
:mod:`tests.fakes.no_reset_proxy`, which answers 404 to ``POST /reset_prefix_cache`` as a production vLLM does:

* its ``/metrics`` gives the KV size: ``kvbench run --base-url URL`` sends filler traffic of 1.25 x that size
  between the turns, turn 2 recomputes (the engine's GPU prefix-cache hits stay under the limit), the run is
  VALID (exit 0), the filler requests are kept apart from the measured ones, and the summary, the Markdown and
  the console name the method;
* its ``/metrics`` hides the KV size and no flag gives it: turn 2 hits the GPU cache, INCONCLUSIVE (exit 3), and
  the verdict says what would make it valid (``--gpu-kv-tokens N`` or ``VLLM_SERVER_DEV_MODE=1``); with
  ``--gpu-kv-tokens`` the same endpoint is VALID again, the summary naming the flag as the size's source.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.no_reset_proxy import no_reset_proxy
from tests.support import kvbench, simulator

pytestmark = pytest.mark.integration

BLOCKS, BLOCK_TOKENS = 1500, 16
CAPACITY = BLOCKS * BLOCK_TOKENS


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    where = tmp_path_factory.mktemp("sim")
    settings = where / "sim.json"
    settings.write_text(
        json.dumps({"model": "llama-3.1-8b", "hardware": "h100-sxm", "num_gpu_blocks_override": BLOCKS}),
        encoding="utf-8",
    )
    with simulator(where, "--config", str(settings)) as base_url:
        yield base_url


def run_behind_proxy(sim_url: str, tmp_path: Path, *flags: str, hide_kv_size: bool) -> tuple[int, str, Path]:
    tmp_path.mkdir(exist_ok=True)
    with no_reset_proxy(sim_url, hide_kv_size=hide_kv_size) as proxy:
        argv = ["run", "--base-url", proxy.base_url + "/v1", "--contexts", "2000,8000", "-o", str(tmp_path / "runs")]
        done = kvbench(*argv, *flags, cwd=tmp_path)
        assert proxy.paths.count("POST /reset_prefix_cache") == 1  # tried once, answered 404, not retried
    (run_dir,) = (tmp_path / "runs").iterdir()
    return done.returncode, done.stdout + done.stderr, run_dir


def gpu_shares(summary: dict[str, object]) -> dict[tuple[int, int], float]:
    cache = summary["cache"]
    assert isinstance(cache, list)
    return {(c["context_tokens"], c["turn"]): c["gpu_hits"] / c["gpu_queries"] for c in cache}


def test_filler_sized_from_metrics_makes_turn_2_recompute(sim_url: str, tmp_path: Path) -> None:
    code, output, run_dir = run_behind_proxy(sim_url, tmp_path, hide_kv_size=False)
    assert code == 0, output[-3000:]
    assert "Traceback" not in output
    filler_tokens = round(CAPACITY * 1.25)
    described = f"filler {filler_tokens:,} tokens (GPU KV {CAPACITY:,} tokens from /metrics)"
    assert described in " ".join(output.split())  # said when chosen and in the console report (lines may wrap)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["schema_version"] == 2
    assert summary["between_turns"] == [
        {
            "arm": "endpoint",
            "method": "filler",
            "filler_tokens": filler_tokens,
            "gpu_kv_tokens": CAPACITY,
            "gpu_kv_source": "metrics",
        }
    ]
    assert summary["validity"]["verdict"] == "valid" and summary["reset_unavailable"] == {}
    shares = gpu_shares(summary)
    assert all(shares[(context, 2)] < 0.1 for context in (2000, 8000)), shares  # turn 2 recomputed

    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    filler = [r for r in records if r["phase"] == "filler"]
    measured = [r for r in records if r["phase"] == "measure"]
    assert len(measured) == summary["requests"]["measured"] == 8  # 2 contexts x 2 conversations x 2 turns
    assert len(filler) == summary["requests"]["filler"]
    for context in (2000, 8000):  # one gap per context, each over the capacity, between turn 1 and turn 2
        sent = sum(r["prompt_tokens"] or 0 for r in filler if r["context_tokens"] == context)
        assert sent >= CAPACITY and all(r["turn"] == 2 for r in filler if r["context_tokens"] == context)
    # unique prompts: none shares more with the others or the conversations than the chat template's first blocks
    assert all(r["cached_tokens"] <= 2 * BLOCK_TOKENS for r in filler)
    assert f"Between turns: filler {filler_tokens:,} tokens" in (run_dir / "report" / "ttft_table.md").read_text()


def test_unknown_kv_size_is_inconclusive_naming_the_fix_and_the_flag_fixes_it(sim_url: str, tmp_path: Path) -> None:
    code, output, run_dir = run_behind_proxy(sim_url, tmp_path / "unknown", hide_kv_size=True)
    assert code == 3, output[-3000:]
    assert "Traceback" not in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["between_turns"][0]["method"] == "unavailable"
    assert summary["requests"]["filler"] == 0
    assert all(share > 0.5 for (_, turn), share in gpu_shares(summary).items() if turn == 2)  # the GPU cache served
    (finding, *_) = summary["validity"]["findings"]
    assert finding["gate"] == "reset_missed" and "found no way to drop that cache" in finding["message"]
    assert "pass --gpu-kv-tokens N" in finding["message"] and "VLLM_SERVER_DEV_MODE=1" in finding["message"]
    said = " ".join(output.split())  # the console wraps long lines
    assert "INCONCLUSIVE" in said and "pass --gpu-kv-tokens N" in said and "VLLM_SERVER_DEV_MODE=1" in said

    code, output, run_dir = run_behind_proxy(
        sim_url, tmp_path / "flag", "--gpu-kv-tokens", str(CAPACITY), hide_kv_size=True
    )
    assert code == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["between_turns"][0]["gpu_kv_source"] == "gpu_kv_tokens"
    assert all(share < 0.1 for (_, turn), share in gpu_shares(summary).items() if turn == 2)
