"""A TensorRT-LLM server (``trtllm-serve``, PyTorch backend): started, health-checked, stopped.

``TrtllmEngine(config, context)`` is the engine kind ``trtllm``. Entering it

1. renders the arm's offload profile into LLM-API options
   (:func:`harness.engines.trtllm_offload.render_trtllm_options`) and writes them to a YAML file in a
   fresh temporary directory;
2. runs ``trtllm-serve MODEL --host H --port P --backend pytorch --extra_llm_api_options FILE``
   (argv list, its own process group, log ``engine.log``) and waits for ``GET /health``;
3. reads ``GET /version`` for the manifest.

What TensorRT-LLM does not offer, kvbench says plainly instead of faking:

* no endpoint drops the GPU prefix cache: :meth:`RunningTrtllm.reset_prefix_cache` raises
  :class:`~harness.engines.base.PrefixCacheResetUnsupported` (scenario validation already
  refuses ``between_turns: reset_prefix_cache``; use ``filler``);
* no ``/tokenize`` endpoint: exact token counts come from the model directory's ``tokenizer.json``
  (the same Hugging Face fast-tokenizer file the server loads), read with the ``tokenizers``
  package (:class:`ModelDirTokenizer`);
* ``/metrics`` is JSON iteration stats; Prometheus text is on ``/prometheus/metrics`` when
  ``return_perf_metrics`` is on (``enable_metrics``, the default).

TensorRT-LLM cannot be installed on kvbench's machines: this module is tested against the documented
command line and YAML format and a stand-in server, not against TensorRT-LLM itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp

from common.errors import EngineStartError
from common.redact import redact_argv, redact_env, redact_text
from harness.client.endpoint import Endpoint
from harness.client.scrape import TRTLLM, metrics_path
from workloads.tokenizer import Tokenizer

from .base import EngineConfigModel, EngineFacts, LaunchContext, PrefixCacheResetUnsupported
from .common import (
    TOKENIZER_FILE,
    ModelDirTokenizer,
    ProcessEngine,
    RunningProcess,
    TokenizerUnavailable,
    parallelism_text,
    server_process,
    server_version,
    start_server,
    value_flags,
)
from .configs import TrtllmEngineConfig
from .modeldir import resolve_model_ref
from .process import ManagedProcess, free_port
from .trtllm_offload import RESET_ADVICE, TrtllmLaunchPlan, check_supported, render_trtllm_options

SERVE_ENV_VAR = "KVBENCH_TRTLLM_SERVE"
DEFAULT_SERVE = "trtllm-serve"
OPTIONS_FILE = "llm_api_options.yaml"
VERSION_TIMEOUT_S = 10.0

__all__ = [
    "DEFAULT_SERVE",
    "OPTIONS_FILE",
    "SERVE_ENV_VAR",
    "TOKENIZER_FILE",
    "ModelDirTokenizer",
    "RunningTrtllm",
    "TokenizerUnavailable",
    "TrtllmEngine",
    "build_trtllm_argv",
    "build_trtllm_env",
    "resolve_serve",
    "served_model_name",
]


def resolve_serve(config: TrtllmEngineConfig) -> str:
    """The trtllm-serve executable: ``config.trtllm_serve``, else $KVBENCH_TRTLLM_SERVE, else ``trtllm-serve``."""
    return config.trtllm_serve or os.environ.get(SERVE_ENV_VAR) or DEFAULT_SERVE


def served_model_name(model: str) -> str:
    """The name trtllm-serve gives the model: a local directory's name, else the model string as given."""
    path = Path(model)
    return path.name if path.is_dir() else model


def build_trtllm_argv(config: TrtllmEngineConfig, serve: str, port: int, options_path: Path) -> tuple[str, ...]:
    """The full trtllm-serve command line (no shell): model, server, backend, LLM-API YAML, sizes, extra_args."""
    args = [
        serve,
        config.model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--backend",
        config.backend,
        "--extra_llm_api_options",
        str(options_path),
    ]
    parallel = config.parallelism
    args += value_flags(
        ("--tp_size", parallel.tp if parallel.tp != 1 else None),
        ("--pp_size", parallel.pp if parallel.pp != 1 else None),
        ("--max_batch_size", config.max_batch_size),
        ("--max_num_tokens", config.max_num_tokens),
        ("--max_seq_len", config.max_seq_len),
    )
    return (*args, *config.extra_args)


def build_trtllm_env(config: TrtllmEngineConfig) -> dict[str, str]:
    """What kvbench adds to the inherited environment (config.env wins)."""
    return {"PYTHONUNBUFFERED": "1", **config.env}


def _serve_hint(serve: str, problem: str) -> str:
    return (
        f"trtllm-serve {serve!r}: {problem}\n"
        "  Install TensorRT-LLM in its own environment (pip install tensorrt_llm, or NVIDIA's container) and "
        f"point engine.trtllm_serve or ${SERVE_ENV_VAR} at its trtllm-serve."
    )


class RunningTrtllm(RunningProcess):
    """The :class:`~harness.engines.base.RunningEngine` of a started trtllm-serve."""

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        facts: EngineFacts,
        process: ManagedProcess,
        model_dir: Path | None,
    ) -> None:
        super().__init__(endpoint, facts, process)
        self._model_dir = model_dir
        self._tokenizer: ModelDirTokenizer | None = None

    def tokenizer(self) -> Tokenizer:
        """The model directory's tokenizer.json (trtllm-serve has no /tokenize); TokenizerUnavailable if none."""
        if self._tokenizer is None:
            self._tokenizer = ModelDirTokenizer.from_model_dir(
                self._model_dir, "trtllm-serve has no /tokenize endpoint"
            )
        return self._tokenizer

    async def reset_prefix_cache(self) -> None:
        raise PrefixCacheResetUnsupported(f"TensorRT-LLM at {self._endpoint.base_url}: {RESET_ADVICE}")


class TrtllmEngine(ProcessEngine[TrtllmEngineConfig, RunningTrtllm]):
    """Engine kind ``trtllm``: ``async with TrtllmEngine(config, context) as running: ...``."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        super().__init__(config, context, TrtllmEngineConfig, check_supported)

    async def _start(self, stack: contextlib.AsyncExitStack) -> RunningTrtllm:
        context = self.context
        # `synth:SHAPE` names a hub-free model directory that kvbench builds (once) for dummy weights
        model_dir = await asyncio.to_thread(resolve_model_ref, self.config.model)
        config = self.config.model_copy(update={"model": str(model_dir)})
        serve = resolve_serve(config)
        if shutil.which(serve) is None:
            raise EngineStartError(_serve_hint(serve, "not found, or not executable"))
        context.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            plan = render_trtllm_options(context.profile, config, context.prefix_caching)
        except ValueError as error:
            raise EngineStartError(f"TensorRT-LLM ({context.arm}): {error}") from None
        self._workdir = Path(tempfile.mkdtemp(prefix="kvbench-trtllm-"))
        options_path = self._workdir / OPTIONS_FILE
        options_text = plan.yaml_text()
        options_path.write_text(options_text, encoding="utf-8")

        started = time.monotonic()
        port = config.port or free_port(config.host)
        argv = build_trtllm_argv(config, serve, port, options_path)
        env = build_trtllm_env(config)
        base_url = f"http://{config.host}:{port}"
        process = await start_server(
            stack,
            server_process(
                name=f"TensorRT-LLM ({context.arm})",
                argv=argv,
                env=env,
                log_path=self.log_path,
                base_url=base_url,
                config=config,
            ),
        )
        version = await _server_version(base_url)
        name = served_model_name(config.model)
        facts = EngineFacts(
            kind="trtllm",
            version=version,
            command=tuple(redact_argv(argv)),
            details=_details(config, plan, serve, name, env, options_text, time.monotonic() - started),
        )
        local_dir = model_dir if model_dir.is_dir() else None
        return RunningTrtllm(
            endpoint=Endpoint(base_url=base_url, model=name, metrics_path=metrics_path(TRTLLM)),
            facts=facts,
            process=process,
            model_dir=local_dir,
        )


def _details(
    config: TrtllmEngineConfig,
    plan: TrtllmLaunchPlan,
    serve: str,
    name: str,
    env: dict[str, str],
    options_text: str,
    startup_s: float,
) -> dict[str, str]:
    details = {
        "trtllm_serve": serve,
        "backend": config.backend,
        "hardware": config.hardware,
        "model": config.model,
        "served_model_name": name,
        "parallelism": parallelism_text(config.parallelism.tp, config.parallelism.pp),
        "prefix_caching": str(plan.prefix_caching).lower(),
        "host_cache_size": str(plan.host_cache_bytes or 0),
        "metrics_family": TRTLLM,
        "metrics_path": metrics_path(TRTLLM) if config.enable_metrics else "",
        "reset_prefix_cache": "unsupported",
        "tokenizer": f"model directory {TOKENIZER_FILE}",
        "env": json.dumps(redact_env(env), sort_keys=True),
        f"file:{OPTIONS_FILE}": redact_text(options_text),
        "startup_s": f"{startup_s:.1f}",
    }
    if plan.notes:
        details["notes"] = " | ".join(plan.notes)
    return details


async def _server_version(base_url: str) -> str:
    """``GET /version`` ({"version": ...}) with a short timeout; "unknown" if the server does not say."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=VERSION_TIMEOUT_S)) as session:
        return await server_version(session, base_url)
