"""The simulator's HTTP server: an OpenAI-compatible API shaped like vLLM's.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming SSE or one JSON
answer, with ``usage.prompt_tokens_details.cached_tokens``), ``GET /v1/models``, ``GET /health``,
``GET /version``, ``POST /tokenize`` and ``POST /detokenize`` (vLLM's request and response
shapes), ``POST /reset_prefix_cache`` and ``GET /metrics``.

Handlers only translate HTTP to engine requests: the :class:`~.scheduler.EngineLoop` decides when
each token exists, and a handler writes it out the moment its event arrives. A client that goes
away aborts its request, which frees its KV blocks (the server runs with handler cancellation).
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from common import __version__
from harness.engines.common import SIMULATOR_OWNER
from harness.engines.kvbench_replica_header import REPLICA_ENV, REPLICA_HEADER
from harness.engines.process import LAUNCH_TOKEN_ENV, LAUNCH_TOKEN_HEADER

from .disagg import Cluster, ClusterLoop
from .engine import url_host
from .faults import FaultInjector
from .metrics import metrics_registry, render
from .scheduler import (
    EngineCore,
    EngineLoop,
    ErrorEvent,
    Event,
    FinishEvent,
    SimRequest,
    TokenEvent,
)
from .settings import SimSettings
from .stream import DONE_FRAME, StreamEncoder, usage_json
from .tokenizer import SimTokenizer, apply_chat_template

logger = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text format, as vLLM serves it
MAX_BODY_BYTES = 256 * 1024 * 1024  # a 2M-token prompt as JSON is ~12 MB; leave room for messages


class ApiError(Exception):
    """An error answered as JSON with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()


def _int_field(body: Mapping[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum}, got {value!r}", param=name)
    return value


def _float_field(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ApiError(400, f"'{name}' must be a number >= 0, got {value!r}", param=name)
    return float(value)


def _token_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ApiError(400, f"'{name}' must be a list of token ids", param=name)
    return value


class SimServer:
    """State and handlers of one simulator server."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.model_name = settings.name
        self.loop: EngineLoop | ClusterLoop
        if settings.disaggregation is None:
            self.core = EngineCore(settings)
            self.cores = [self.core]
            self.loop = EngineLoop(self.core)
        else:
            cluster = Cluster(settings, settings.disaggregation)
            # /metrics, limits and tier faults are the first prefill instance's, as a P/D producer reports its own
            self.core = cluster.prefill[0]
            self.cores = [*cluster.prefill, *cluster.decode]
            self.loop = ClusterLoop(cluster)
        self.tokenizer = SimTokenizer()
        self.faults = FaultInjector(settings.faults, seed=settings.fault_seed)
        self.registry = metrics_registry(self.core, self.model_name, self.faults)
        self.started = int(time.time())
        # the per-launch token kvbench gave this process: echoed on every answer so that kvbench can
        # tell its own simulator from another server on the same port (harness.engines.process)
        self.launch_token = os.environ.get(LAUNCH_TOKEN_ENV)
        self.replica = os.environ.get(REPLICA_ENV)  # set for a fleet's replica: named in every response

    # -- application ------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/metrics", self.metrics)
        app.on_startup.append(self._on_startup)
        app.on_response_prepare.append(self._identify)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _identify(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.launch_token is not None:
            response.headers[LAUNCH_TOKEN_HEADER] = self.launch_token
        if self.replica is not None:
            response.headers[REPLICA_HEADER] = self.replica

    async def _on_startup(self, app: web.Application) -> None:
        self.loop.start()
        deployment = self.core.deployment
        logger.info(
            "simulating %s: KV cache %d tokens (%d blocks of %d), max_model_len %d, HBM prefix caching %s, "
            "offload profile %r with tiers [%s]",
            deployment.label,
            self.core.kv_cache_tokens,
            self.core.pool.num_blocks,
            self.settings.block_tokens,
            self.core.max_model_len,
            "on" if self.core.pool.caching else "off",
            self.settings.offload.name,
            ", ".join(f"{t.kind} {t.capacity_gb:g} GB" for t in self.settings.offload.tiers),
        )
        layout = self.settings.disaggregation
        if layout is not None:
            logger.info(
                "prefill/decode disaggregation %s: KV link %g GB/s per GPU, %g ms per transfer (not fitted); "
                "the tiers are on the prefill side, /metrics is the first prefill instance's",
                layout.label,
                layout.link_gbps,
                layout.per_transfer_ms,
            )

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.loop.stop()

    # -- simple routes ----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.loop.failure is not None:
            return web.Response(status=503, text=f"engine failed: {self.loop.failure!r}")
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.started,
            "owned_by": SIMULATOR_OWNER,  # how kvbench knows it attached to a simulator
            "root": self.core.deployment.model.hf_id,
            "parent": None,
            "max_model_len": self.core.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.registry), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        dropped = sum(core.reset_prefix_cache() for core in self.cores)
        logger.info("reset_prefix_cache: dropped %d cached blocks (offload tiers kept)", dropped)
        return web.Response(status=200)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        if "messages" in body:
            ids = self._chat_ids(body)
        elif isinstance(body.get("prompt"), str):
            ids = self.tokenizer.encode_sync(body["prompt"])
        else:
            raise ApiError(400, "give 'prompt' (a string) or 'messages'", param="prompt")
        return web.json_response(
            {"count": len(ids), "max_model_len": self.core.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        ids = _token_list(body.get("tokens"), "tokens")
        try:
            text = self.tokenizer.decode_sync(ids)
        except ValueError as error:
            raise ApiError(400, str(error), param="tokens") from None
        return web.json_response({"prompt": text})

    # -- generation -------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        body = await self._json(request)
        self._check_model(body)
        ids = self._chat_ids(body)
        max_tokens = _int_field(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", None, 1)
        return await self._generate(request, body, ids, max_tokens, chat=True, received=received)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        body = await self._json(request)
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = self.tokenizer.encode_sync(prompt)
        elif isinstance(prompt, list):
            ids = _token_list(prompt, "prompt")
        else:
            raise ApiError(400, "'prompt' must be a string, a list of token ids, or a batch of one", param="prompt")
        max_tokens = _int_field(body, "max_tokens", None, 1)
        return await self._generate(request, body, ids, max_tokens, chat=False, received=received)

    async def _generate(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        ids: list[int],
        max_tokens: int | None,
        chat: bool,
        received: float | None = None,
    ) -> web.StreamResponse:
        if _int_field(body, "n", 1, 1) != 1:
            raise ApiError(400, "the simulator supports only n=1", param="n")
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        temperature = _float_field(body, "temperature", 1.0)
        seed = _int_field(body, "seed", None, 0)
        stream = bool(body.get("stream", False))
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage", False)) if isinstance(options, Mapping) else False
        injected = self.faults.on_request(self.core.tiers.tiers) if self.faults.enabled else None
        if injected is not None and injected.http_status is not None:
            raise ApiError(injected.http_status, "injected fault: http_error", kind="InternalServerError")
        if injected is not None and injected.delay_s > 0:
            await asyncio.sleep(injected.delay_s)
        drop_after = injected.drop_after_tokens if injected is not None else None
        queue: asyncio.Queue[Event] = asyncio.Queue()
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if max_tokens is None:
            # like vLLM, a request without max_tokens may use what is left of the context
            max_tokens = max(1, min(self.settings.default_max_tokens, self.core.max_model_len - len(ids)))
        sim_request = SimRequest(request_id, ids, max_tokens, queue.put_nowait, temperature=temperature, seed=seed)
        sim_request.received_at = received
        try:
            self.loop.submit(sim_request)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        except RuntimeError as error:
            raise ApiError(503, str(error), kind="ServiceUnavailableError") from None
        done = False
        try:
            if stream:
                response, done = await self._stream(request, request_id, queue, chat, include_usage, drop_after)
            else:
                response = await self._collect(request_id, queue, chat)
                done = True
            return response
        finally:
            if not done:
                self.loop.abort(sim_request)

    async def _stream(
        self,
        request: web.Request,
        request_id: str,
        queue: asyncio.Queue[Event],
        chat: bool,
        include_usage: bool,
        drop_after: int | None = None,
    ) -> tuple[web.StreamResponse, bool]:
        """Stream a request's events as SSE; returns the response and whether it completed.

        Nothing is sent before the first token exists (vLLM sends its role chunk with the first
        token, after prefill); see :mod:`.stream` for the chunks.
        """
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        encoder = StreamEncoder(request_id, self.model_name, int(time.time()), chat=chat, include_usage=include_usage)
        try:
            async for batch in _batches(queue):
                if drop_after is not None:
                    allowed = _until_drop(batch, drop_after - encoder.tokens_sent)
                    if allowed < len(batch):
                        # injected drop_stream fault: the connection closes without data: [DONE]
                        if allowed:
                            await response.write(encoder.frames(batch[:allowed]))
                        if request.transport is not None:
                            request.transport.abort()
                        logger.info("%s: stream dropped (injected fault)", request_id)
                        return response, False
                await response.write(encoder.frames(batch))
            await response.write(DONE_FRAME)
            await response.write_eof()
        except ConnectionResetError:
            # the client went away mid-stream; the caller stops generating
            logger.info("%s: client disconnected", request_id)
            return response, False
        return response, True

    async def _collect(self, request_id: str, queue: asyncio.Queue[Event], chat: bool) -> web.Response:
        texts: list[str] = []
        finish: FinishEvent | None = None
        async for event in _events(queue):
            if isinstance(event, TokenEvent):
                texts.append(event.text)
            elif isinstance(event, FinishEvent):
                finish = event
            else:
                raise ApiError(500, event.message, kind="InternalServerError")
        assert finish is not None
        text = "".join(texts)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish.reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish.reason}
        return web.json_response(
            {
                "id": request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": usage_json(finish.usage),
            }
        )

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except json.JSONDecodeError as error:
            raise ApiError(400, f"the request body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def _check_model(self, body: Mapping[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")

    def _chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
            raise ApiError(400, "'messages' must be a non-empty list of message objects", param="messages")
        add_generation_prompt = body.get("add_generation_prompt", True)
        try:
            text = apply_chat_template(messages, add_generation_prompt=bool(add_generation_prompt))
        except ValueError as error:
            raise ApiError(400, str(error), param="messages") from None
        return self.tokenizer.encode_sync(text)


async def _events(queue: asyncio.Queue[Event]) -> AsyncIterator[Event]:
    """A request's events until (and including) its finish or error."""
    while True:
        event = await queue.get()
        yield event
        if isinstance(event, FinishEvent | ErrorEvent):
            return


async def _batches(queue: asyncio.Queue[Event]) -> AsyncIterator[list[Event]]:
    """A request's events, grouped as the engine handed them over (everything already queued).

    The engine loop queues a step's token and, on the last step, the finish in one go, so the
    finish arrives in the same batch as the last token (and rides on its chunk, as in vLLM).
    """
    while True:
        batch = [await queue.get()]
        while not queue.empty():
            batch.append(queue.get_nowait())
        yield batch
        if any(isinstance(event, FinishEvent | ErrorEvent) for event in batch):
            return


def _until_drop(batch: Sequence[Event], tokens_left: int) -> int:
    """How many leading events of ``batch`` go out before an injected stream drop.

    The drop comes at the first event after ``tokens_left`` more tokens (the original rule: after
    ``drop_after_tokens`` tokens, the next event is not sent). Returns ``len(batch)`` if no drop.
    """
    for index, event in enumerate(batch):
        if tokens_left <= 0:
            return index
        if isinstance(event, TokenEvent):
            tokens_left -= 1
    return len(batch)


def create_app(settings: SimSettings) -> web.Application:
    """The aiohttp application of one simulator server (the engine starts with the app)."""
    return SimServer(settings).app()


@contextlib.asynccontextmanager
async def running_server(settings: SimSettings, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve in this process (tests, notebooks); yields the base URL, e.g. http://127.0.0.1:8000."""
    runner = web.AppRunner(create_app(settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        addresses = runner.addresses
        bound_port = addresses[0][1] if addresses else port
        yield f"http://{url_host(host)}:{bound_port}"
    finally:
        await runner.cleanup()


def serve(settings: SimSettings, host: str = "127.0.0.1", port: int = 8000, access_log: bool = False) -> None:
    """Run a simulator server until SIGINT/SIGTERM (``kvbench sim serve``)."""
    web.run_app(
        create_app(settings),
        host=host,
        port=port,
        handler_cancellation=True,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        print=None,
    )
