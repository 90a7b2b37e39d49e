"""Engine kind ``sim``: the built-in simulator, started as a real subprocess.

``SimEngine(config, context)`` writes the simulator's settings (the scenario's engine section, the
arm's offload profile and the runner's prefix-caching decision) to ``sim-settings.json`` in the
arm's log directory, runs ``python -m kvbench sim serve --config ...`` as a
:class:`~harness.engines.process.ManagedProcess` (log: ``engine.log``), and waits for
``/health`` (answered with this launch's token: :mod:`harness.engines.process`). The simulator
goes through the same process, HTTP and streaming paths as a real
engine, so a scenario can be tried on a laptop before it goes to a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import TracebackType

import aiohttp

from common import __version__
from common.errors import EngineStartError
from harness.client.endpoint import Endpoint
from harness.engines.base import EngineConfigModel, EngineFacts, LaunchContext
from harness.engines.common import RunningProcess, engine_config
from harness.engines.kvbench_replica_header import replica_env
from harness.engines.process import ManagedProcess, ProcessSpec, free_port
from workloads.tokenizer import Tokenizer

from .config import Disaggregation, SimEngineConfig
from .settings import SimSettings
from .tokenizer import SimTokenizer

SETTINGS_FILE = "sim-settings.json"
LOG_FILE = "engine.log"
STOP_GRACE_S = 5.0  # the simulator holds no GPU state; a short grace is plenty
RESET_TIMEOUT_S = 30.0


def url_host(host: str) -> str:
    """The host to put in a URL for a bind address (wildcards become loopback, IPv6 gets brackets)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class RunningSim(RunningProcess):
    """The :class:`~harness.engines.base.RunningEngine` of a started simulator."""

    def __init__(self, endpoint: Endpoint, facts: EngineFacts, process: ManagedProcess) -> None:
        super().__init__(endpoint, facts, process)
        self._tokenizer = SimTokenizer()

    def tokenizer(self) -> Tokenizer:
        # the simulator's tokenizer is deterministic across processes: no round trip needed
        return self._tokenizer

    async def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache``: drop the HBM prefix cache, keep the offload tiers."""
        url = self._endpoint.base_url + "/reset_prefix_cache"
        timeout = aiohttp.ClientTimeout(total=RESET_TIMEOUT_S)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url) as response:
                if response.status != 200:
                    text = await response.text()
                    raise RuntimeError(f"POST {url}: HTTP {response.status}: {text[:300]}")
        except (aiohttp.ClientError, TimeoutError) as error:
            raise RuntimeError(f"POST {url} failed: {type(error).__name__}: {error}") from None


class SimEngine:
    """Engine kind ``sim``: ``async with SimEngine(config, context) as running: ...``."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        self.config = engine_config(config, SimEngineConfig, "SimEngine")
        self.context = context
        self._process: ManagedProcess | None = None

    @property
    def settings_path(self) -> Path:
        return self.context.log_dir / SETTINGS_FILE

    @property
    def log_path(self) -> Path:
        return self.context.log_dir / LOG_FILE

    def settings(self) -> SimSettings:
        shared = self.context.shared_tier
        try:
            settings = SimSettings.from_engine_config(self.config, self.context.profile, self.context.prefix_caching)
            if shared is not None and shared.path is not None:
                settings = settings.model_copy(update={"shared_tier_dir": str(shared.path)})
            return settings
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            raise EngineStartError(f"simulator ({self.context.arm}): {error}") from None

    async def __aenter__(self) -> RunningSim:
        if self._process is not None:
            raise RuntimeError("SimEngine is already running")
        config, context = self.config, self.context
        settings = self.settings()
        settings.write(self.settings_path)
        port = config.port or free_port(config.host)
        argv = (
            sys.executable, "-m", "kvbench", "sim", "serve",
            "--config", str(self.settings_path), "--host", config.host, "--port", str(port),
        )  # fmt: skip
        base_url = f"http://{url_host(config.host)}:{port}"
        process = ManagedProcess(
            ProcessSpec(
                name=f"simulator ({context.arm}, replica {context.replica})",
                argv=argv,
                env={"PYTHONUNBUFFERED": "1", **replica_env(context.replica, context.fleet_size)},
                log_path=self.log_path,
                health_url=base_url + "/health",
                startup_timeout_s=config.startup_timeout_s,
                stop_grace_s=STOP_GRACE_S,
                launch_token=True,
            )
        )
        await process.__aenter__()  # stops the process itself if it never becomes healthy
        self._process = process
        deployment = settings.deployment()
        facts = EngineFacts(
            kind="sim",
            version=__version__,
            command=tuple(process.redacted_argv),
            details={
                "model": settings.model,
                "hardware": settings.hardware,
                "tp": str(settings.tp),
                "dtype": deployment.dtype,
                "kv_dtype": deployment.kv_cache_dtype,
                "offload_profile": context.profile.name,
                "prefix_caching": str(settings.hbm_prefix_caching).lower(),
                "max_batch_tokens": str(settings.max_batch_tokens),
                "block_tokens": str(settings.block_tokens),
                "gpu_memory_utilization": repr(settings.gpu_memory_utilization),
                "settings_file": str(self.settings_path),
                **({"calibration": settings.calibration_file} if settings.calibration_file else {}),
                **({"calibration_sha256": settings.calibration_sha256} if settings.calibration_sha256 else {}),
                **({"disaggregation": _layout_text(settings.disaggregation)} if settings.disaggregation else {}),
            },
        )
        return RunningSim(Endpoint(base_url=base_url, model=settings.name), facts, process)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        process, self._process = self._process, None
        if process is not None:
            await process.stop()


def _layout_text(layout: Disaggregation) -> str:
    return f"{layout.label}, KV link {layout.link_gbps:g} GB/s per GPU, {layout.per_transfer_ms:g} ms per transfer"
