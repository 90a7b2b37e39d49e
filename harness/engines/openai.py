"""Engine kind ``openai``: an endpoint kvbench attaches to but does not start or stop.

Staging and production clusters, or a server you run yourself, have no lifecycle here: entering
:class:`OpenAIEngine` waits for the endpoint to answer (``GET /health``, else ``GET /v1/models``),
reads ``GET /version`` for the manifest (and ``GET /v1/models``: an endpoint whose models are owned by
``kvbench-sim`` is kvbench's simulator, ``details.served_by``), and leaving only closes kvbench's HTTP session. Token
counts come from the server's ``POST /tokenize`` (vLLM's and the simulator's shape); the GPU
prefix cache is reset with ``POST /reset_prefix_cache`` where the server offers it. The API key is
read from the environment variable the scenario names and never stored.

A server without ``POST /tokenize`` (any other OpenAI-compatible server) is asked once, at attach time;
then prompts are built with a local tokenizer: ``engine.vocab`` (the served model's
``tokenizer.json``) or kvbench's own :class:`~workloads.tokenizer.WordTokenizer`. The manifest names
the tokenizer (``engines.ARM.details.prompts_built_with``), and the server's ``usage.prompt_tokens`` gives each
prompt's true length. :func:`discover_model` reads ``GET /v1/models`` for a run that names no model;
:func:`confirm_endpoint` asks it once for a run that names one, so an unreachable endpoint or refused
credentials are the same one-line configuration error (exit 2, no run directory) with or without ``--model``.

What another try cannot change is never retried: 401/403 and a rejected certificate or a redirect to another
origin (:func:`permanent_failure`) end the attach at once. A server that answers 404/405 on both ``/health``
and ``/v1/models`` is up (a chat-only server); its measured requests say the rest.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import aiohttp

from common.errors import EngineStartError, KvbenchError, ScenarioError
from common.redact import redact_text
from harness.client.connections import new_session
from harness.client.endpoint import Endpoint
from harness.client.models import served_models
from harness.client.openai import PERMANENT_STATUSES
from harness.client.redirects import CrossOriginRedirect
from offload.profiles import OffloadProfile
from workloads.tokenizer import Tokenizer, WordTokenizer

from .base import EngineConfigModel, EngineFacts, LaunchContext
from .common import (
    SERVED_BY,
    SIMULATOR_OWNER,
    TOKENIZER_FILE,
    EngineRequestError,
    ModelDirTokenizer,
    RunningServer,
    ServerTokenizer,
    engine_config,
    post_text,
    reset_with_retry,
    served_by_simulator,
    server_version,
)
from .configs import OpenAIEngineConfig

POLL_S = 0.5
PROMPTS_BUILT_WITH = "prompts_built_with"
"""The manifest's ``engines.ARM.details`` key naming the tokenizer that built the arm's prompts."""
COUNTS_EXACT = "counts_exact"
"""The details key saying whether that tokenizer's counts are the engine's ("true"/"false")."""
REQUEST_TIMEOUT_S = 30.0


class LabeledTokenizer:
    """A tokenizer with what it is and whether its counts are the engine's (a
    :class:`~workloads.tokenizer.DescribedTokenizer`)."""

    def __init__(self, inner: Tokenizer, description: str, *, exact: bool, location: str = "") -> None:
        self._inner = inner
        self.description = description
        self.exact = exact
        self.location = location
        """The URL it is served from (empty for a local one): prompt-building errors name it."""

    async def encode(self, text: str) -> list[int]:
        return await self._inner.encode(text)

    async def prompt_ids(self, text: str) -> list[int]:
        return await self._inner.prompt_ids(text)

    async def decode(self, token_ids: Sequence[int]) -> str:
        return await self._inner.decode(token_ids)


def refuse_query_or_fragment(url: str, where: str) -> str:
    """``url`` unchanged; a one-line :class:`ScenarioError` naming ``where`` when it has a ?query or #fragment.

    A base URL is a root that paths (``/v1/chat/completions``, ``/tokenize``) are appended to: with a query
    or fragment they would compose into other URLs (``http://h/?a=1/v1/chat/completions``).
    """
    if "?" in url or "#" in url:
        raise ScenarioError(
            f"{where} {redact_text(url)!r}: give the server's root URL without ?query or #fragment "
            "(paths such as /v1/chat/completions are appended to it), e.g. http://127.0.0.1:8000/v1"
        )
    return url


def local_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer at ``path`` (a directory with a tokenizer.json, or that file), else kvbench's word tokenizer.

    One-line :class:`KvbenchError` naming the path when it holds no readable tokenizer.
    """
    if path is None:
        return WordTokenizer()
    where = Path(path).expanduser()
    file = where / TOKENIZER_FILE if where.is_dir() else where
    if not file.is_file():
        raise KvbenchError(f"tokenizer {path}: no {TOKENIZER_FILE} there (give a model directory or the file)")
    return LabeledTokenizer(ModelDirTokenizer(file), f"{TOKENIZER_FILE} at {file}", exact=False)


async def endpoint_tokenizer(
    session: aiohttp.ClientSession, base_url: str, model: str, local: str | None
) -> LabeledTokenizer:
    """The server's ``POST /tokenize`` when it answers a token list, else :func:`local_tokenizer` (asked once)."""
    why = "no token list"
    try:
        status, text = await post_text(session, base_url + "/tokenize", {"model": model, "prompt": "kvbench"})
    except EngineRequestError as error:
        status, text, why = 0, "", str(error)
    if status == 200:
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if isinstance(tokens, list) and tokens and all(isinstance(token, int) for token in tokens):
            return LabeledTokenizer(
                ServerTokenizer(session, base_url, model),
                "the server's POST /tokenize",
                exact=True,
                location=redact_text(base_url + "/tokenize"),
            )
    elif status:
        why = f"HTTP {status}"
    chosen = local_tokenizer(local)
    label = chosen.description if isinstance(chosen, LabeledTokenizer | WordTokenizer) else str(local)
    return LabeledTokenizer(chosen, f"{label}; the server has no POST /tokenize ({why})", exact=False)


class RunningEndpoint(RunningServer):
    """The :class:`~harness.engines.base.RunningEngine` of an attached endpoint."""

    def __init__(
        self, endpoint: Endpoint, facts: EngineFacts, session: aiohttp.ClientSession, tokenizer: Tokenizer
    ) -> None:
        super().__init__(endpoint, facts)
        self._session = session
        self._tokenizer = tokenizer

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
        self.config = engine_config(config, OpenAIEngineConfig, "OpenAIEngine")
        self.context = context
        self._session: aiohttp.ClientSession | None = None

    def base_url(self) -> str:
        url = self.config.arm_urls.get(self.context.arm) or self.config.base_url
        if not url:
            raise EngineStartError(
                f"engine kind openai, arm {self.context.arm}: set engine.base_url or engine.arm_urls.{self.context.arm}"
            )
        where = f"engine.arm_urls.{self.context.arm}" if self.context.arm in self.config.arm_urls else "engine.base_url"
        try:
            refuse_query_or_fragment(url, where)
        except ScenarioError as error:
            raise EngineStartError(str(error)) from None
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
            tokenizer = await endpoint_tokenizer(session, endpoint.base_url, self.config.model, self.config.vocab)
            simulated = await served_by_simulator(session, endpoint.base_url)
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
                # keys without "token" in them: the manifest stores such keys as secrets
                PROMPTS_BUILT_WITH: tokenizer.description,
                COUNTS_EXACT: "true" if tokenizer.exact else "false",
            }
            | ({SERVED_BY: SIMULATOR_OWNER} if simulated else {}),
        )
        return RunningEndpoint(endpoint, facts, session, tokenizer)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _wait_ready(self, session: aiohttp.ClientSession, base_url: str) -> None:
        """Until ``/health`` or ``/v1/models`` answers 200, or both answer 404/405 (a server with neither,
        chat only, is up: its measured requests tell the rest). A refusal another try cannot change (401,
        403, a certificate, a redirect to another origin) is an error at once (:func:`permanent_failure`)."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        last = "no answer"
        while True:
            missing = 0
            for path in ("/health", "/v1/models"):
                try:
                    async with session.get(base_url + path) as response:
                        if response.status == 200:
                            return
                        if response.status in (404, 405):
                            missing += 1
                        last = f"GET {path}: HTTP {response.status}"
                        if response.status in PERMANENT_STATUSES:
                            raise EngineStartError(
                                f"engine kind openai: {redact_text(base_url + path)} answered HTTP {response.status} "
                                f"{response.reason or ''}: the endpoint refused kvbench's credentials "
                                "(give the key's variable with --api-key-env / engine.api_key_env); not retried"
                            )
                except (aiohttp.ClientError, TimeoutError) as error:
                    refused = permanent_failure(error)
                    if refused is not None:
                        where = redact_text(base_url + path)
                        raise EngineStartError(f"engine kind openai: {where}: {refused}") from None
                    last = f"GET {path}: {type(error).__name__}: {error}"
            if missing == 2:
                return
            if time.monotonic() >= deadline:
                raise EngineStartError(
                    f"engine kind openai: {redact_text(base_url)} did not answer within "
                    f"{self.config.startup_timeout_s:g} s ({redact_text(last)})"
                )
            await asyncio.sleep(POLL_S)

    @staticmethod
    async def _version(session: aiohttp.ClientSession, base_url: str) -> str:
        return await server_version(session, base_url)


DISCOVERY_TIMEOUT_S = 30.0


def permanent_failure(error: BaseException) -> str | None:
    """Why ``error`` would happen again on every try (a rejected certificate, a redirect to another origin),
    in words; None for failures worth another try."""
    if isinstance(error, CrossOriginRedirect):
        return str(error)
    if isinstance(error, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return f"TLS failed ({type(error).__name__}: {error}); not retried: fix the certificate or use its http:// URL"
    return None


def confirm_endpoint(base_url: str, api_key: str | None) -> None:
    """Before a run directory is made for a model given by name: the endpoint at ``base_url`` is reachable and
    takes kvbench's credentials (``GET /v1/models`` answers 200, or 404/405 from a chat-only server).

    One-line :class:`KvbenchError` otherwise: the same refusal :func:`discover_model` gives without ``--model``.
    """

    async def status() -> tuple[int, str]:
        headers = Endpoint(base_url=base_url, model="", api_key=api_key).headers
        url = base_url.rstrip("/").removesuffix("/v1") + "/v1/models"
        async with new_session(headers=headers, timeout=aiohttp.ClientTimeout(total=DISCOVERY_TIMEOUT_S)) as session:
            try:
                async with session.get(url) as response:
                    return response.status, response.reason or ""
            except (aiohttp.ClientError, TimeoutError) as error:
                refused = permanent_failure(error)
                raise KvbenchError(f"{redact_text(url)}: {refused or f'{type(error).__name__}: {error}'}") from None

    code, reason = asyncio.run(status())
    if code == 200 or code in (404, 405):
        return
    hint = "; the endpoint refused kvbench's credentials (--api-key-env NAME)" if code in PERMANENT_STATUSES else ""
    raise KvbenchError(f"{redact_text(base_url)}: GET /v1/models answered HTTP {code} {reason}{hint}")


def confirm_endpoints(config: EngineConfigModel) -> None:
    """:func:`confirm_endpoint` for each distinct URL an ``openai`` engine config names (none for other kinds)."""
    if not isinstance(config, OpenAIEngineConfig):
        return
    api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
    urls = [config.base_url, *config.arm_urls.values()]
    for url in dict.fromkeys(url for url in urls if url):
        confirm_endpoint(url, api_key)


def shared_url_note(config: EngineConfigModel, arms: Sequence[tuple[str, str | OffloadProfile]]) -> str | None:
    """A note when two arms (name, offload profile) of an ``openai`` engine measure one URL; a one-line
    :class:`KvbenchError` when they also declare the same profile: that is one deployment measured twice, and a
    table setting the two side by side would present run-to-run noise as a difference between deployments."""
    if not isinstance(config, OpenAIEngineConfig):
        return None
    by_url: dict[str, list[tuple[str, str]]] = {}
    for name, offload in arms:
        url = config.arm_urls.get(name) or config.base_url
        profile = offload if isinstance(offload, str) else offload.model_dump_json()
        if url:
            by_url.setdefault(url.rstrip("/").removesuffix("/v1"), []).append((name, profile))
    notes: list[str] = []
    for url, named in by_url.items():
        if len(named) < 2:
            continue
        profiles = [profile for _, profile in named]
        arm_names = ", ".join(name for name, _ in named)
        if len(set(profiles)) < len(profiles):
            raise KvbenchError(
                f"--arm: arms {arm_names} measure the same URL {redact_text(url)} with the same offload profile: "
                "one deployment twice; give each arm its own endpoint (or NAME:PROFILE=URL for what differs)"
            )
        notes.append(
            f"note: arms {arm_names} measure the same URL {redact_text(url)}: one server, so their difference "
            "is what changed on it between the arms, if anything"
        )
    return "; ".join(notes) or None


def discover_model(base_url: str, api_key: str | None) -> str:
    """The one model the server at ``base_url`` lists under ``GET /v1/models``.

    One-line :class:`KvbenchError` when it cannot be read, lists none, or lists several (naming them: give one).
    """

    async def listed() -> list[str]:
        headers = Endpoint(base_url=base_url, model="", api_key=api_key).headers
        async with new_session(headers=headers, timeout=aiohttp.ClientTimeout(total=DISCOVERY_TIMEOUT_S)) as session:
            return await served_models(session, base_url.rstrip("/").removesuffix("/v1"))

    models = asyncio.run(listed())
    if len(models) == 1:
        return models[0]
    if not models:
        raise KvbenchError(f"{redact_text(base_url)}: GET /v1/models lists no model; give --model NAME")
    raise KvbenchError(
        f"{redact_text(base_url)} serves {len(models)} models ({', '.join(models)}); choose one with --model NAME"
    )
