"""Engine kind ``vllm-pd``: a prefill/decode-disaggregated vLLM deployment behind kvbench's P/D proxy.

Entering :class:`VllmPdEngine` starts, for one arm,

1. the prefill vLLM (``kv_producer``) on ``prefill.gpus`` and the decode vLLM (``kv_consumer``) on
   ``decode.gpus`` (``CUDA_VISIBLE_DEVICES`` per process), each a :class:`~harness.engines.vllm.VllmEngine` whose
   launch plan :func:`pd_plan` gives vLLM's NIXL push connector: alone, or -- on the prefill side of an arm with
   an offload tier -- first in a ``MultiConnector`` whose second connector is the tier's, rendered from the arm's
   offload profile by :func:`~harness.engines.vllm_offload.render_vllm_launch` exactly as for ``kind: vllm``
   (LMCache in-process or multi-process; vLLM native offload as an explicit ``OffloadingConnector``, since its
   ``--kv-offloading-size`` would replace any other connector). The decode side has no tier. Each side gets
   its own NIXL side-channel port (``VLLM_NIXL_SIDE_CHANNEL_PORT``: both default to 5600);
2. then kvbench's proxy (:mod:`harness.engines.pd_proxy`, kvbench's own python, 127.0.0.1) in front of them,
   writing one phase line per request to ``<arm log dir>/pd-proxy.jsonl`` (:data:`PROXY_LOG`).

The arm's endpoint is the proxy's. Leaving stops the proxy, then decode, then prefill. Any of the three that
dies is the engine's death (:meth:`RunningPd.exit_code`), as for every kind kvbench starts. An arm named in
``colocated_arms`` runs one plain vLLM with the prefill side's settings instead (the colocated baseline).

Refused before anything starts (one line naming the field and the allowed values), because vLLM would move
the KV over TCP between GPUs of one host: ``connector: pull``, a ``UCX_TLS`` without ``cuda_ipc`` (scenario or
inherited), NIXL backends other than UCX (:class:`~harness.engines.configs.VllmPdEngineConfig`,
:func:`refuse_tcp`).

The manifest's details record both sides' commands and kv-transfer-configs, the proxy's command, the KV bytes
per token of the model (``2 x layers x kv_heads x head_dim x dtype bytes``, :func:`kv_bytes_per_token`) and the
link's physical limit (``kv_link_gbps``), which the TTFT breakdown's physics check reads
(:mod:`harness.results.pd_breakdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from common.errors import EngineStartError
from common.redact import redact_argv
from harness.client.endpoint import Endpoint
from offload.analytical import kv_bytes_per_token as analytical_kv_bytes
from offload.profiles import OffloadProfile
from offload.shapes import model_from_hf_config
from workloads.tokenizer import Tokenizer

from . import pd_proxy
from .base import Engine, EngineConfigModel, EngineFacts, LaunchContext, RunningEngine
from .common import (
    ProcessEngine,
    RunningServer,
    ServerTokenizer,
    engine_config,
    open_session,
    reset_with_retry,
    served_model_name,
)
from .configs import (
    PD_CONNECTORS,
    PD_LINK_GBPS,
    UCX_TLS,
    VLLM_DEFAULT_BLOCK_SIZE,
    VllmEngineConfig,
    VllmPdEngineConfig,
    ucx_tcp_only,
)
from .host_link import HostLinkTarget, engine_target
from .modeldir import resolve_model_ref
from .process import ManagedProcess, ProcessSpec, free_port
from .vllm import RunningVllm, VllmEngine, build_vllm_argv, build_vllm_env, resolve_python
from .vllm_offload import GIB, VllmLaunchPlan, check_supported, render_vllm_launch

Role = Literal["prefill", "decode"]
PROXY_LOG = "pd-proxy.jsonl"
"""The proxy's phase log in the arm's log directory (one JSON line per request, :mod:`.pd_proxy`)."""
KV_BYTES_DETAIL = "kv_bytes_per_tok"
"""KV bytes of one token (not spelled ``..._token``: kvbench's redaction reads a name holding 'token' as a secret's)."""
KV_BLOCK_DETAIL = "kv_block_size"
KV_LINK_DETAIL = "kv_link"
KV_LINK_GBPS_DETAIL = "kv_link_gbps"
PROXY_LOG_DETAIL = "pd_proxy_log"
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NATIVE_OFFLOAD_CONNECTOR = "OffloadingConnector"
"""What vLLM's ``--kv-offloading-backend native`` turns into (vLLM 0.32.0 ``VllmConfig._post_init_kv_transfer_config``:
``kv_connector_extra_config.cpu_bytes_to_use`` = ``--kv-offloading-size`` GiB in bytes)."""
_TIER_FLAGS = ("--kv-transfer-config", "--kv-offloading-size", "--kv-offloading-backend")
_DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2}


def role_config(config: VllmPdEngineConfig, role: Role) -> VllmEngineConfig:
    """The ``kind: vllm`` config one side starts with: the shared fields, the side's own, its GPUs."""
    side = config.prefill if role == "prefill" else config.decode
    return VllmEngineConfig(
        kind="vllm",
        model=config.model,
        served_model_name=served_model_name(config),
        python=config.python,
        device="cuda",
        dtype=config.dtype,
        quantization=config.quantization,
        max_model_len=config.max_model_len,
        gpu_memory_utilization=side.gpu_memory_utilization or config.gpu_memory_utilization,
        load_format=config.load_format,
        enforce_eager=config.enforce_eager,
        max_num_batched_tokens=side.max_num_batched_tokens,
        block_size=config.block_size,
        num_gpu_blocks_override=side.num_gpu_blocks_override,
        parallelism=config.parallelism,
        hardware=config.hardware,
        extra_args=list(side.extra_args),
        env={**config.env, **side.env, VISIBLE_DEVICES: ",".join(str(gpu) for gpu in side.gpus)},
        host=config.host,
        startup_timeout_s=config.startup_timeout_s,
        stop_grace_s=config.stop_grace_s,
    )


def nixl_connector(config: VllmPdEngineConfig, role: Role) -> dict[str, object]:
    """The NIXL connector of one side, as ``--kv-transfer-config`` (or a MultiConnector child) takes it."""
    return {
        "kv_connector": PD_CONNECTORS[config.connector],
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_buffer_device": "cuda",  # GPU memory registered with NIXL: no staging through host buffers
        "kv_connector_extra_config": {"backends": list(config.nixl_backends)},
    }


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def tier_connector(plan: VllmLaunchPlan) -> dict[str, object] | None:
    """The offload tier's connector that ``plan`` (rendered for ``kind: vllm``) configures; None without a tier."""
    if plan.backend == "none":
        return None
    if plan.backend == "native":
        size_gib = float(_flag_value(plan.args, "--kv-offloading-size") or 0)
        return {
            "kv_connector": NATIVE_OFFLOAD_CONNECTOR,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": int(size_gib * GIB)},
        }
    rendered = _flag_value(plan.args, "--kv-transfer-config")
    if rendered is None:
        raise ValueError(f"offload backend {plan.backend}: the rendered launch has no --kv-transfer-config")
    connector: dict[str, object] = json.loads(rendered)
    return connector


def transfer_config(config: VllmPdEngineConfig, role: Role, tier: Mapping[str, object] | None) -> dict[str, object]:
    """One side's ``--kv-transfer-config``: NIXL alone, or NIXL then the tier's connector in a MultiConnector
    (NIXL first: the decode side's KV comes from the transfer, and the prefill side looks the tier up second)."""
    nixl = nixl_connector(config, role)
    if tier is None:
        return nixl
    return {
        "kv_connector": "MultiConnector",
        "kv_role": nixl["kv_role"],
        "kv_connector_extra_config": {"connectors": [nixl, dict(tier)]},
    }


def pd_plan(plan: VllmLaunchPlan, config: VllmPdEngineConfig, role: Role, side_channel_port: int) -> VllmLaunchPlan:
    """``plan`` with its tier's flags replaced by the side's P/D ``--kv-transfer-config`` and NIXL side channel."""
    args: list[str] = []
    skip = False
    for arg in plan.args:
        if skip:
            skip = False
            continue
        if arg in _TIER_FLAGS:
            skip = True
            continue
        args.append(arg)
    transfer = transfer_config(config, role, tier_connector(plan))
    args += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    env = {**plan.env, SIDE_CHANNEL_HOST_ENV: config.host, SIDE_CHANNEL_PORT_ENV: str(side_channel_port)}
    return VllmLaunchPlan(
        backend=plan.backend,
        args=tuple(args),
        env=env,
        files=plan.files,
        dirs=plan.dirs,
        must_exist=plan.must_exist,
        sidecars=plan.sidecars,
        notes=plan.notes,
        pinned_host_bytes=plan.pinned_host_bytes,
    )


def side_profile(profile: OffloadProfile, role: Role) -> OffloadProfile:
    """The offload profile one side realises: the arm's on the prefill side, none on the decode side (its GPU
    prefix cache as the arm has it)."""
    if role == "prefill":
        return profile
    return profile.model_copy(update={"tiers": (), "backend": "auto", "async_loading": False})


def preview_side(
    config: VllmPdEngineConfig, role: Role, profile: OffloadProfile, workdir: Path, *, python: str = "python"
) -> tuple[tuple[str, ...], dict[str, str]]:
    """One side's vLLM argv and added environment for an arm, rendered as :class:`VllmPdEngine` renders them
    (placeholder ports; nothing starts): for checking them against a vLLM install (``scripts/gpu/pd_argv.py``)."""
    side = role_config(config, role)
    ports = iter(range(40000, 40100))
    plan = render_vllm_launch(side_profile(profile, role), side, True, workdir, port_factory=lambda: next(ports))
    plan = pd_plan(plan, config, role, 5601 if role == "prefill" else 5602)
    return build_vllm_argv(side, python, 8000, plan), build_vllm_env(side, plan)


def refuse_tcp(config: VllmPdEngineConfig, inherited: Mapping[str, str]) -> None:
    """EngineStartError where kvbench's own environment (``inherited``) would leave NIXL only TCP (a scenario's
    own ``UCX_TLS`` is refused when it is read)."""
    if any(UCX_TLS in env for env in (config.env, config.prefill.env, config.decode.env)):
        return  # the scenario's value wins over the inherited one, and was checked with the scenario
    problem = ucx_tcp_only(inherited.get(UCX_TLS))
    if problem is not None:
        raise EngineStartError(f"${UCX_TLS} (kvbench's environment): {problem}")


def kv_bytes_per_token(model_dir: Path, config: VllmPdEngineConfig) -> float:
    """KV bytes of one token for the whole model: ``2 x layers x kv_heads x head_dim x dtype bytes``."""
    hf = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    profile = model_from_hf_config(hf, model_dir.name, str(model_dir / "config.json"))
    dtype = config.dtype if config.dtype not in (None, "auto") else str(hf.get("torch_dtype", "bfloat16"))
    return analytical_kv_bytes(profile.layers, profile.kv_heads, profile.head_dim, _DTYPE_BYTES.get(str(dtype), 2))


def check_pd_supported(profile: OffloadProfile, config: VllmPdEngineConfig, between_turns: str | None = None) -> None:
    """ValueError when the prefill side (where an arm's tier lives) cannot realise ``profile``."""
    check_supported(profile, role_config(config, "prefill"), between_turns)


def host_link_target(config: EngineConfigModel) -> HostLinkTarget | None:
    """The host-link probe's python and GPUs: both sides' GPUs."""
    pd = engine_config(config, VllmPdEngineConfig, "a vllm-pd host link")
    return engine_target(resolve_python(role_config(pd, "prefill")), gpus=pd.gpus, fleet_gpus=len(pd.gpus), env=pd.env)


class PdSide(Protocol):
    """A started side of the deployment (a :class:`~harness.engines.vllm.RunningVllm`)."""

    def exit_code(self) -> int | None: ...

    def log_tail(self, lines: int = 50) -> list[str]: ...


class RunningPd(RunningServer):
    """The :class:`~harness.engines.base.RunningEngine` of a started P/D deployment: the proxy's endpoint."""

    def __init__(
        self,
        *,
        endpoint: Endpoint,
        facts: EngineFacts,
        proxy: ManagedProcess,
        prefill: PdSide,
        decode: PdSide,
        tokenizer: Tokenizer,
        reset_url: str,
        session_owner: contextlib.AsyncExitStack,
    ) -> None:
        super().__init__(endpoint, facts)
        self._proxy = proxy
        self._prefill = prefill
        self._decode = decode
        self._tokenizer = tokenizer
        self._reset_url = reset_url
        self._session = open_session(session_owner)

    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def exit_code(self) -> int | None:
        """The first exit code among the proxy, the prefill and the decode server (None while all three run)."""
        for code in (self._proxy.returncode(), self._prefill.exit_code(), self._decode.exit_code()):
            if code is not None:
                return code
        return None

    async def reset_prefix_cache(self) -> None:
        """Both servers' GPU prefix caches (through the proxy); the prefill side's tier keeps its KV."""
        await reset_with_retry(
            self._session,
            self._reset_url,
            accepted=lambda status, text: '"success":false' not in text.replace(" ", "") if status == 200 else None,
            unsupported=lambda status: f"the P/D proxy's servers have no POST /reset_prefix_cache (HTTP {status})",
            attempts=20,
            retry_s=0.5,
            refusal="vLLM refused to reset the prefix cache {attempts} times (blocks still in use)",
        )

    def log_tail(self, lines: int = 50) -> list[str]:
        parts = (
            ("proxy", self._proxy.log_tail(lines)),
            ("prefill", self._prefill.log_tail(lines)),
            ("decode", self._decode.log_tail(lines)),
        )
        return [f"[{name}] {line}" for name, tail in parts for line in tail][-lines:]


def proxy_argv(port: int, prefill_url: str, decode_url: str, log: Path, host: str) -> tuple[str, ...]:
    """The proxy's command line: kvbench's python runs the module's file (it needs only aiohttp)."""
    script = str(Path(pd_proxy.__file__).resolve())
    return (
        sys.executable,
        script,
        "--host",
        host,
        "--port",
        str(port),
        "--prefill",
        prefill_url,
        "--decode",
        decode_url,
        "--log",
        str(log),
    )


class VllmPdEngine(ProcessEngine[VllmPdEngineConfig, RunningEngine]):
    """Engine kind ``vllm-pd``: ``async with VllmPdEngine(config, context) as running: ...``."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        super().__init__(config, context, VllmPdEngineConfig, check_pd_supported)

    def _side(self, role: Role, profile: OffloadProfile, side_channel_port: int) -> VllmEngine:
        config = self.config
        context = LaunchContext(
            arm=self.context.arm,
            profile=profile,
            log_dir=self.context.log_dir / role,
            prefix_caching=self.context.prefix_caching,
            tier_session=self.context.tier_session,
        )
        return VllmEngine(
            role_config(config, role), context, plan_hook=lambda plan: pd_plan(plan, config, role, side_channel_port)
        )

    async def _start(self, stack: contextlib.AsyncExitStack) -> RunningEngine:
        config, context = self.config, self.context
        if context.arm in config.colocated_arms:
            colocated: Engine = VllmEngine(role_config(config, "prefill"), context)
            running: RunningEngine = await stack.enter_async_context(colocated)
            return running
        refuse_tcp(config, os.environ)
        model_dir = await _model_dir(config.model)
        kv_bytes = kv_bytes_per_token(model_dir, config)
        tierless = side_profile(context.profile, "decode")
        prefill_channel, decode_channel = free_port(config.host), free_port(config.host)
        while decode_channel == prefill_channel:
            decode_channel = free_port(config.host)
        # both sides load at once: they meet only per request, through the kv_transfer_params the proxy hands on
        prefill_engine = self._side("prefill", context.profile, prefill_channel)
        decode_engine = self._side("decode", tierless, decode_channel)
        prefill, decode = await _start_both(stack, prefill_engine, decode_engine)
        log_path = context.log_dir / PROXY_LOG
        port = free_port(config.host)
        argv = proxy_argv(port, prefill.endpoint.base_url, decode.endpoint.base_url, log_path, config.host)
        base_url = f"http://{config.host}:{port}"
        proxy = ManagedProcess(
            ProcessSpec(
                name=f"P/D proxy ({context.arm})",
                argv=argv,
                env={"PYTHONUNBUFFERED": "1"},
                log_path=context.log_dir / "pd-proxy.log",
                health_url=base_url + "/health",
                startup_timeout_s=60.0,
                stop_grace_s=5.0,
                launch_token=True,
            )
        )
        await stack.enter_async_context(proxy)
        details = {f"prefill.{key}": value for key, value in prefill.facts.details.items()}
        details |= {f"decode.{key}": value for key, value in decode.facts.details.items()}
        details |= {
            "decode_command": " ".join(decode.facts.command),
            "proxy_command": " ".join(redact_argv(argv)),
            "model": config.model,
            "served_model_name": served_model_name(config),
            "hardware": config.hardware,
            "connector": PD_CONNECTORS[config.connector],
            "prefill_gpus": ",".join(map(str, config.prefill.gpus)),
            "decode_gpus": ",".join(map(str, config.decode.gpus)),
            KV_BYTES_DETAIL: f"{kv_bytes:.0f}",
            KV_BLOCK_DETAIL: str(config.block_size or VLLM_DEFAULT_BLOCK_SIZE["cuda"]),
            KV_LINK_DETAIL: config.kv_link,
            KV_LINK_GBPS_DETAIL: f"{PD_LINK_GBPS[config.kv_link]:g}",
            PROXY_LOG_DETAIL: PROXY_LOG,
        }
        if "lmcache_version" in prefill.facts.details:  # the tier's, named as for kind vllm (the provenance reads it)
            details["lmcache_version"] = prefill.facts.details["lmcache_version"]
        facts = EngineFacts(
            kind=config.kind, version=prefill.facts.version, command=prefill.facts.command, details=details
        )
        endpoint = Endpoint(base_url=base_url, model=served_model_name(config))
        session = open_session(stack)
        return RunningPd(
            endpoint=endpoint,
            facts=facts,
            proxy=proxy,
            prefill=prefill,
            decode=decode,
            tokenizer=ServerTokenizer(session, base_url, endpoint.model),
            reset_url=base_url + "/reset_prefix_cache",
            session_owner=stack,
        )


async def _model_dir(model: str) -> Path:
    return await asyncio.to_thread(resolve_model_ref, model)


async def _start_both(
    stack: contextlib.AsyncExitStack, prefill: VllmEngine, decode: VllmEngine
) -> tuple[RunningVllm, RunningVllm]:
    """Start both sides at once; if one fails, the other is stopped (the stack unwinds what started)."""
    tasks = [asyncio.ensure_future(stack.enter_async_context(side)) for side in (prefill, decode)]
    try:
        started = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return started[0], started[1]
