"""A real SGLang server: started from its own environment, health-checked, stopped, cleaned up.

``SglangEngine(config, context)`` is the engine kind ``sglang``. Entering it

1. renders the arm's offload profile into HiCache flags
   (:func:`harness.engines.sglang_offload.render_sglang_launch`) and creates the storage directory
   of a disk tier (a shared tier's directory must already exist);
2. asks SGLang's python for ``sglang.__version__``, so a broken environment fails before a long
   start-up, with a message that says how to fix it;
3. runs ``python -m sglang.launch_server --model-path M --host H --port P ...`` (argv list, its own
   process group, log ``engine.log``) and waits for ``GET /health``.

kvbench always passes ``--enable-cache-report`` (cached tokens in ``usage.prompt_tokens_details``)
and, unless ``enable_metrics`` is off, ``--enable-metrics`` (SGLang serves ``/metrics`` only then).

Between turns, ``POST /flush_cache`` resets the radix cache; SGLang refuses (HTTP 400) while
requests are running or waiting, so a refusal is retried for ~10 s. With HiCache the flush also
empties the host pool, which is why scenario validation refuses ``reset_prefix_cache`` for arms
with tiers (:mod:`harness.engines.sglang_offload`). Exact token counts come from SGLang's
``POST /tokenize``; a server without it (older SGLang) falls back to the model directory's
``tokenizer.json``, and with neither, tokenizing raises :class:`TokenizerUnavailable`.

Checked against SGLang's sources (0.5.x) and a stand-in server, and run with SGLang 0.5.17 on 1x H200 (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import aiohttp

from common.errors import EngineStartError
from common.redact import redact_argv, redact_env
from harness.client.endpoint import Endpoint
from harness.client.scrape import SGLANG, metrics_path
from workloads.tokenizer import Tokenizer

from . import common
from .base import EngineConfigModel, EngineFacts, LaunchContext
from .common import (
    EngineRequestError,
    ModelDirTokenizer,
    ProcessEngine,
    RunningProcess,
    ServerTokenizer,
    TokenizerUnavailable,
    make_offload_dirs,
    open_session,
    parallelism_text,
    prepare_served,
    probe_python,
    reset_with_retry,
    served_model_name,
    serving_args,
    start_server,
)
from .configs import SglangEngineConfig
from .host_link import HostLinkTarget, engine_target
from .process import ManagedProcess, free_port
from .sglang_offload import SglangLaunchPlan, check_supported, render_sglang_launch

__all__ = [
    "LAUNCH_MODULE",
    "PYTHON_ENV_VAR",
    "EngineRequestError",
    "RunningSglang",
    "SglangEngine",
    "SglangTokenizer",
    "TokenizerUnavailable",
    "build_sglang_argv",
    "build_sglang_env",
    "host_link_target",
    "probe_version",
    "resolve_python",
    "served_model_name",
]

PYTHON_ENV_VAR = "KVBENCH_SGLANG_PYTHON"
LAUNCH_MODULE = "sglang.launch_server"
VERSION_PROBE_TIMEOUT_S = 180.0
RESET_ATTEMPTS = 20
RESET_RETRY_S = 0.5
_VERSION_MARK = "KVBENCH_SGLANG_VERSION="
_VERSION_SCRIPT = f"import sglang; print({_VERSION_MARK!r} + str(getattr(sglang, '__version__', 'unknown')))"


def resolve_python(config: SglangEngineConfig) -> str:
    """The python that runs SGLang: ``config.python``, else $KVBENCH_SGLANG_PYTHON, else kvbench's own."""
    return common.resolve_python(config.python, PYTHON_ENV_VAR)


def host_link_target(config: EngineConfigModel) -> HostLinkTarget:
    """The host-link probe's python and GPUs: SGLang's own, on the GPUs its replicas take."""
    if not isinstance(config, SglangEngineConfig):
        raise TypeError(f"an SGLang host link needs a SglangEngineConfig, got {type(config).__name__}")
    return engine_target(resolve_python(config), gpus=config.gpus, fleet_gpus=config.fleet_gpus, env=config.env)


def build_sglang_argv(config: SglangEngineConfig, python: str, port: int, plan: SglangLaunchPlan) -> tuple[str, ...]:
    """The full SGLang command line (no shell): launcher, model, server flags, offload flags, extra_args."""
    args = [
        python,
        "-m",
        LAUNCH_MODULE,
        "--model-path",
        config.model,
        *serving_args(config, port),
        "--enable-cache-report",
    ]
    if config.enable_metrics:
        args.append("--enable-metrics")
    if config.dtype is not None:
        args += ["--dtype", config.dtype]
    if config.context_length is not None:
        args += ["--context-length", str(config.context_length)]
    if config.mem_fraction_static is not None:
        args += ["--mem-fraction-static", repr(config.mem_fraction_static)]
    if config.load_format is not None:
        args += ["--load-format", config.load_format]
    if config.page_size is not None:
        args += ["--page-size", str(config.page_size)]
    if config.chunked_prefill_size is not None:
        args += ["--chunked-prefill-size", str(config.chunked_prefill_size)]
    if config.skip_server_warmup:
        args.append("--skip-server-warmup")
    parallel = config.parallelism
    if parallel.tp != 1:
        args += ["--tp-size", str(parallel.tp)]
    if parallel.pp != 1:
        args += ["--pp-size", str(parallel.pp)]
    if parallel.dp != 1:
        args += ["--dp-size", str(parallel.dp)]
    return (*args, *plan.args, *config.extra_args)


def build_sglang_env(config: SglangEngineConfig, plan: SglangLaunchPlan) -> dict[str, str]:
    """What kvbench adds to the inherited environment (config.env wins over the plan's)."""
    return {"PYTHONUNBUFFERED": "1", **plan.env, **config.env}


def _python_hint(python: str, problem: str) -> str:
    return (
        f"SGLang python {python}: {problem}\n"
        "  Install SGLang in its own virtualenv (pip install 'sglang[all]') and point "
        f"{PYTHON_ENV_VAR} (or engine.python) at its bin/python."
    )


async def probe_version(python: str) -> str:
    """``import sglang`` with ``python`` and return its version; EngineStartError if that fails."""
    version = await probe_python(
        python,
        _VERSION_SCRIPT,
        _VERSION_MARK,
        what="'import sglang'",
        timeout_s=VERSION_PROBE_TIMEOUT_S,
        hint=_python_hint,
    )
    return version.strip() or "unknown"


class SglangTokenizer(ServerTokenizer):
    """Exact token counts from SGLang's ``POST /tokenize`` / ``/detokenize``, else the model's tokenizer.json.

    ``encode`` adds no special tokens (BOS): it counts the text itself, as a prompt builder needs.
    The first 404 switches to the model directory's ``tokenizer.json`` for good
    (:class:`~harness.engines.common.ModelDirTokenizer`); without one, TokenizerUnavailable.
    """

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str, model_dir: Path | None) -> None:
        def fallback(path: str, status: int) -> Tokenizer:
            why = f"SGLang at {base_url} has no POST {path} (HTTP {status})"
            return ModelDirTokenizer.from_model_dir(model_dir, why)

        super().__init__(session, base_url, model, fallback=fallback)


class RunningSglang(RunningProcess):
    """The :class:`~harness.engines.base.RunningEngine` of a started SGLang server."""

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        facts: EngineFacts,
        process: ManagedProcess,
        session: aiohttp.ClientSession,
        model_dir: Path | None,
    ) -> None:
        super().__init__(endpoint, facts, process)
        self._session = session
        self._tokenizer = SglangTokenizer(session, endpoint.base_url, endpoint.model, model_dir)

    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def reset_prefix_cache(self) -> None:
        """``POST /flush_cache``: SGLang resets its radix cache (with HiCache: the host pool too).

        SGLang answers HTTP 400 while requests are running or waiting, so a refusal is retried for
        ~10 s before it is an error.
        """
        base_url = self._endpoint.base_url
        await reset_with_retry(
            self._session,
            base_url + "/flush_cache",
            accepted=lambda status, _text: True if status == 200 else False if status == 400 else None,
            unsupported=lambda _status: f"SGLang at {base_url} has no /flush_cache",
            attempts=RESET_ATTEMPTS,
            retry_s=RESET_RETRY_S,
            refusal="SGLang refused to flush its cache {attempts} times (requests still running or waiting)",
        )


class SglangEngine(ProcessEngine[SglangEngineConfig, RunningSglang]):
    """Engine kind ``sglang``: ``async with SglangEngine(config, context) as running: ...``."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        super().__init__(config, context, SglangEngineConfig, check_supported)

    async def _start(self, stack: contextlib.AsyncExitStack) -> RunningSglang:
        context = self.context
        model_dir, config, python = await prepare_served(self.config, context.log_dir, resolve_python)
        try:
            plan = render_sglang_launch(context.profile, config, context.prefix_caching, context.tier_scope)
        except ValueError as error:
            raise EngineStartError(f"SGLang ({context.arm}): {error}") from None
        make_offload_dirs(plan.must_exist, plan.dirs)

        started = time.monotonic()
        version = await probe_version(python)
        port = config.port or free_port(config.host)
        argv = build_sglang_argv(config, python, port, plan)
        env = build_sglang_env(config, plan)
        base_url = f"http://{config.host}:{port}"
        process = await start_server(
            stack,
            common.server_process(
                name=f"SGLang ({context.arm})",
                argv=argv,
                env=env,
                log_path=self.log_path,
                base_url=base_url,
                config=config,
            ),
        )
        session = open_session(stack)

        name = served_model_name(config)
        details: dict[str, str] = {
            "python": python,
            "hardware": config.hardware,
            "model": config.model,
            "served_model_name": name,
            "parallelism": parallelism_text(config.parallelism.tp, config.parallelism.pp, config.parallelism.dp),
            "prefix_caching": str(plan.prefix_caching).lower(),
            "hierarchical_cache": str(plan.hierarchical).lower(),
            "metrics_family": SGLANG,
            "metrics_path": metrics_path(SGLANG) if config.enable_metrics else "",
            "reset_prefix_cache": "POST /flush_cache",
            "env": json.dumps(redact_env(env), sort_keys=True),
            "startup_s": f"{time.monotonic() - started:.1f}",
        }
        if plan.storage_dir is not None:
            details["hicache_storage_dir"] = str(plan.storage_dir)
        if plan.notes:
            details["notes"] = " | ".join(plan.notes)
        facts = EngineFacts(kind="sglang", version=version, command=tuple(redact_argv(argv)), details=details)
        return RunningSglang(
            endpoint=Endpoint(base_url=base_url, model=name),
            facts=facts,
            process=process,
            session=session,
            model_dir=model_dir if model_dir.is_dir() else None,
        )
