"""Engine kind ``openai``: an endpoint kvbench attaches to but does not start or stop.

Staging and production clusters, or a server you run yourself, have no lifecycle here: entering
:class:`OpenAIEngine` waits for the endpoint to answer (``GET /health``, else ``GET /v1/models``),
reads ``GET /version`` for the manifest, and leaving only closes kvbench's HTTP session. Token
counts come from the server's ``POST /tokenize`` (vLLM's and the simulator's shape); the GPU
prefix cache is reset with ``POST /reset_prefix_cache`` where the server offers it. The API key is
read from the environment variable the scenario names and never stored.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import TracebackType

import aiohttp

from common.errors import EngineStartError
from common.redact import redact_text
from harness.client.connections import new_session
from harness.client.endpoint import Endpoint
from workloads.tokenizer import Tokenizer

from .base import EngineConfigModel, EngineFacts, LaunchContext
from .common import RunningServer, ServerTokenizer, reset_with_retry, server_version
from .configs import OpenAIEngineConfig

POLL_S = 0.5
REQUEST_TIMEOUT_S = 30.0


class RunningEndpoint(RunningServer):
    """The :class:`~harness.engines.base.RunningEngine` of an attached endpoint."""

    def __init__(self, endpoint: Endpoint, facts: EngineFacts, session: aiohttp.ClientSession) -> None:
        super().__init__(endpoint, facts)
        self._session = session
        self._tokenizer = ServerTokenizer(session, endpoint.base_url, endpoint.model)

    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache`` once; PrefixCacheResetUnsupported where the server has none."""
        base_url = self._endpoint.base_url
        await reset_with_retry(
            self._session,
            base_url + "/reset_prefix_cache",
            accepted=lambda status, _text: True if status == 200 else None,
            unsupported=lambda _status: f"{base_url} has no POST /reset_prefix_cache",
        )

    def log_tail(self, lines: int = 50) -> list[str]:
        return [f"(engine kind openai: kvbench does not run {self._endpoint.base_url}, so it has no log)"]


class OpenAIEngine:
    """Engine kind ``openai``: ``async with OpenAIEngine(config, context) as running: ...``."""

    def __init__(self, config: EngineConfigModel, context: LaunchContext) -> None:
        if not isinstance(config, OpenAIEngineConfig):
            raise TypeError(f"OpenAIEngine needs an OpenAIEngineConfig, got {type(config).__name__}")
        self.config = config
        self.context = context
        self._session: aiohttp.ClientSession | None = None

    def base_url(self) -> str:
        url = self.config.arm_urls.get(self.context.arm) or self.config.base_url
        if not url:
            raise EngineStartError(
                f"engine kind openai, arm {self.context.arm}: set engine.base_url or engine.arm_urls.{self.context.arm}"
            )
        return url.rstrip("/").removesuffix("/v1")

    def api_key(self) -> str | None:
        name = self.config.api_key_env
        if name is None:
            return None
        value = os.environ.get(name)
        if not value:
            raise EngineStartError(f"engine.api_key_env names {name}, but that environment variable is not set")
        return value

    async def __aenter__(self) -> RunningEndpoint:
        endpoint = Endpoint(base_url=self.base_url(), model=self.config.model, api_key=self.api_key())
        session = new_session(headers=endpoint.headers, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        self._session = session
        try:
            await self._wait_ready(session, endpoint.base_url)
            version = await self._version(session, endpoint.base_url)
        except BaseException:
            await session.close()
            self._session = None
            raise
        facts = EngineFacts(
            kind="openai",
            version=version,
            details={
                "base_url": redact_text(endpoint.base_url),
                "model": self.config.model,
                "hardware": self.config.hardware,
                "managed": "false",
            },
        )
        return RunningEndpoint(endpoint, facts, session)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _wait_ready(self, session: aiohttp.ClientSession, base_url: str) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        last = "no answer"
        while True:
            for path in ("/health", "/v1/models"):
                try:
                    async with session.get(base_url + path) as response:
                        if response.status == 200:
                            return
                        last = f"GET {path}: HTTP {response.status}"
                except (aiohttp.ClientError, TimeoutError) as error:
                    last = f"GET {path}: {type(error).__name__}: {error}"
            if time.monotonic() >= deadline:
                raise EngineStartError(
                    f"engine kind openai: {redact_text(base_url)} did not answer within "
                    f"{self.config.startup_timeout_s:g} s ({redact_text(last)})"
                )
            await asyncio.sleep(POLL_S)

    @staticmethod
    async def _version(session: aiohttp.ClientSession, base_url: str) -> str:
        return await server_version(session, base_url)
