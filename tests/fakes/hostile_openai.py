"""An OpenAI-compatible aiohttp server on 127.0.0.1 (in a thread) that misbehaves as it is told.

Each :class:`Hostile` field turns on one misbehaviour a tester met on attached endpoints:

* ``redirect_to``: streamed requests answer 307 to this root + their path (another server's root, or this
  server's ``/moved``, under which the same routes answer without redirecting);
* ``tokenize_tokens``: ``POST /tokenize`` answers this many tokens whatever the text (too few: a liar);
* ``detokenize_text``: ``POST /detokenize`` answers this text whatever the ids;
* ``usage_prompt_tokens``: ``usage.prompt_tokens`` reported for every request;
* ``stall_s``: seconds of silence after the response head, before the first chunk;
* ``trickle_s``: after the response head, one byte of an SSE comment every this many seconds, forever;
* ``endless``: the stream never ends (a chunk every few milliseconds, no ``[DONE]``);
* ``status``: every request (``/health`` and ``/v1/models`` too) answers this HTTP status;
* ``chat_only``: no ``/health``, ``/v1/models``, ``/tokenize`` or ``/v1/completions``: only chat.

Without ``tokenize_tokens`` it has a truthful ``/tokenize``: one token per whitespace-separated word, ids
are word indexes into the text it saw last, so ``/detokenize`` can give the words back.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

MODEL = "hostile-model"
MOVED = "/moved"
"""Where a same-origin redirect (``redirect_to`` = this server's root + MOVED) lands."""


@dataclass
class Hostile:
    redirect_to: str | None = None
    tokenize_tokens: int | None = None
    detokenize_text: str | None = None
    usage_prompt_tokens: int | None = None
    stall_s: float = 0.0
    trickle_s: float | None = None
    endless: bool = False
    status: int | None = None
    chat_only: bool = False
    seen: list[str] = field(default_factory=list)
    """'METHOD path' of every request, in order."""

    base_url: str = ""
    """``http://127.0.0.1:PORT/v1``, set when it serves."""

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")


def _words(text: str) -> list[str]:
    return text.split()


def _app(how: Hostile) -> web.Application:
    vocab: dict[str, int] = {}
    words: list[str] = []

    def ids_of(text: str) -> list[int]:
        out = []
        for word in _words(text):
            if word not in vocab:
                vocab[word] = len(words)
                words.append(word)
            out.append(vocab[word])
        return out

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        how.seen.append(f"{request.method} {request.path}")
        if how.status is not None:
            return web.json_response({"error": {"message": "no"}}, status=how.status)
        return await handler(request)

    async def health(_request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def models(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def tokenize(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = ids_of(str(body.get("prompt", "")))
        if how.tokenize_tokens is not None:
            ids = ids[: how.tokenize_tokens] or [0] * how.tokenize_tokens
        return web.json_response({"tokens": ids, "count": len(ids)})

    async def detokenize(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if how.detokenize_text is not None:
            return web.json_response({"prompt": how.detokenize_text})
        return web.json_response({"prompt": " ".join(words[i] for i in body["tokens"])})

    async def stream(request: web.Request) -> web.StreamResponse:
        if how.redirect_to is not None and not request.path.startswith(MOVED):
            raise web.HTTPTemporaryRedirect(how.redirect_to.rstrip("/") + request.path)
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if how.stall_s:
            await asyncio.sleep(how.stall_s)
        while how.trickle_s is not None:
            try:
                await response.write(b":")
            except ConnectionResetError:
                return response
            await asyncio.sleep(how.trickle_s)
        answer = int(body.get("max_tokens", 4))
        index = 0
        while how.endless or index < answer:
            choice = {"delta": {"content": f" w{index}"}} if chat else {"text": f" w{index}"}
            try:
                await response.write(f"data: {json.dumps({'choices': [{'index': 0, **choice}]})}\n\n".encode())
            except ConnectionResetError:  # the client stopped reading (an endless stream cut off)
                return response
            index += 1
            await asyncio.sleep(0.001 if how.endless else 0)
        prompt_tokens = how.usage_prompt_tokens if how.usage_prompt_tokens is not None else len(_words(prompt))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": answer}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application(middlewares=[record])
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_post(MOVED + "/v1/chat/completions", stream)
    if not how.chat_only:
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/detokenize", detokenize)
        app.router.add_post("/v1/completions", stream)
    return app


@contextmanager
def hostile_openai(how: Hostile, tls: ssl.SSLContext | None = None) -> Iterator[Hostile]:
    """Serve ``how`` on 127.0.0.1 (a free port; https with ``tls``) in a daemon thread for the block; sets
    ``how.base_url``."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(_app(how), handle_signals=False)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1]
        how.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1"
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    started.wait(10)
    try:
        yield how
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
