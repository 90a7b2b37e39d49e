"""The simulator's fixed-latency mode: every request gets exactly the TTFT and ITL it is configured with.

The physics simulator's latencies depend on load; to measure a *client* (does kvbench, or ``vllm
bench serve``, report the latency the server really produced?) the server must instead produce a
known latency at any load. This server answers ``POST /v1/chat/completions`` and
``POST /v1/completions`` (streaming or not), ``GET /v1/models``, ``GET /health`` and
``GET /metrics`` (request counters) with:

* the first token due ``ttft`` after the request body has been read, then one token every
  ``itl``, ``max_tokens`` tokens in all (EOS is never produced early), each token the word
  `` tok``;
* a usage block (prompt tokens counted with the simulator's tokenizer), so clients that ask for
  ``stream_options.include_usage`` get one; with ``count_prompt_tokens`` off (``--no-usage``) none: counting a
  32k-token prompt costs the server about 20 ms of CPU, so a client test at long prompts and many streams would
  otherwise measure the server's tokenizer.

Every event is scheduled on absolute deadlines (``received + ttft + i·itl``), so a late wake-up
does not push later tokens back. With ``stats_dir`` each worker appends one JSON line per request
to ``stats_dir/fixed-<pid>.jsonl``: ``received_ns``, ``first_due_ns`` and ``first_sent_ns``
(``time.monotonic_ns()``, the same clock as the client's on the same host), so a benchmark can
tell server lateness (``first_sent − first_due``) from client error. ``workers > 1`` runs several
processes on one port (``SO_REUSEPORT``) so the server is not the bottleneck.

Run it: ``python -m harness.sim.fixed --port 8000 --ttft-ms 200 --itl-ms 50``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from .tokenizer import SimTokenizer, apply_chat_template

NS = 1_000_000_000
MODEL_NAME = "fixed-latency"


@dataclass(frozen=True)
class FixedLatency:
    """The latencies every request gets."""

    ttft_s: float
    itl_s: float
    default_max_tokens: int = 16
    model: str = MODEL_NAME
    count_prompt_tokens: bool = True
    """Count each prompt's tokens for a usage block; off: no usage block, no tokenizing."""

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.itl_s < 0:
            raise ValueError("ttft_s and itl_s must be >= 0")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")


class FixedServer:
    """Handlers of one fixed-latency server process."""

    def __init__(self, latency: FixedLatency, stats_dir: Path | None = None) -> None:
        self.latency = latency
        self.tokenizer = SimTokenizer()
        self.requests = 0
        self.tokens = 0
        self._stats: IO[str] | None = None
        if stats_dir is not None:
            stats_dir.mkdir(parents=True, exist_ok=True)
            # line-buffered: a reader sees each request's line as soon as the request ends
            self._stats = (stats_dir / f"fixed-{os.getpid()}.jsonl").open("a", encoding="utf-8", buffering=1)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._stats is not None:
            self._stats.close()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.latency.model, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE kvbench_fixed_requests_total counter\n"
            f"kvbench_fixed_requests_total {self.requests}\n"
            "# TYPE kvbench_fixed_tokens_total counter\n"
            f"kvbench_fixed_tokens_total {self.tokens}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic_ns()
        body = await _body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            return _error(400, "'messages' must be a list of message objects")
        prompt_tokens: int | None = None
        if self.latency.count_prompt_tokens:
            try:
                prompt_tokens = len(self.tokenizer.encode_sync(apply_chat_template(messages)))
            except ValueError as error:
                return _error(400, str(error))
        return await self._answer(request, body, received, prompt_tokens, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic_ns()
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        prompt_tokens: int | None = None
        if isinstance(prompt, str):
            if self.latency.count_prompt_tokens:
                prompt_tokens = len(self.tokenizer.encode_sync(prompt))
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_tokens = len(prompt)
        else:
            return _error(400, "'prompt' must be a string or a list of token ids")
        return await self._answer(request, body, received, prompt_tokens, chat=False)

    async def _answer(
        self, request: web.Request, body: Mapping[str, Any], received: int, prompt_tokens: int | None, *, chat: bool
    ) -> web.StreamResponse:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or self.latency.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _error(400, f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
        self.requests += 1
        first_due = received + int(self.latency.ttft_s * NS)
        itl_ns = int(self.latency.itl_s * NS)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        usage = (
            None
            if prompt_tokens is None
            else {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            }
        )
        if not body.get("stream"):
            await _sleep_until(first_due + (max_tokens - 1) * itl_ns)
            self.tokens += max_tokens
            text = " tok" * max_tokens
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            self._log(received, first_due, first_due)
            return web.json_response(
                {
                    "id": request_id,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": self.latency.model,
                    "choices": [choice],
                    **({"usage": usage} if usage is not None else {}),
                }
            )
        options = body.get("stream_options")
        include_usage = isinstance(options, Mapping) and bool(options.get("include_usage")) and usage is not None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = f'{{"id":"{request_id}","object":"{kind}","model":"{self.latency.model}","choices":['.encode()
        if chat:
            token = b'{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}'
            last = b'{"index":0,"delta":{},"finish_reason":"length"}]}'
        else:
            token = b'{"index":0,"text":" tok","finish_reason":null}]}'
            last = b'{"index":0,"text":"","finish_reason":"length"}]}'
        first_sent = 0
        try:
            for index in range(max_tokens):
                await _sleep_until(first_due + index * itl_ns)
                await response.write(b"data: " + head + token + b"\n\n")
                if index == 0:
                    first_sent = time.monotonic_ns()
                self.tokens += 1
            tail = b"data: " + head + last + b"\n\n"
            if include_usage:
                payload: dict[str, object] = {
                    "id": request_id,
                    "object": kind,
                    "model": self.latency.model,
                    "choices": [],
                    "usage": usage,
                }
                tail += b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
            await response.write(tail + b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            return response
        self._log(received, first_due, first_sent)
        return response

    def _log(self, received: int, first_due: int, first_sent: int) -> None:
        if self._stats is not None:
            self._stats.write(f'{{"received_ns":{received},"first_due_ns":{first_due},"first_sent_ns":{first_sent}}}\n')


async def _sleep_until(when_ns: int) -> None:
    delay = (when_ns - time.monotonic_ns()) / NS
    if delay > 0:
        await asyncio.sleep(delay)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise web.HTTPBadRequest(text=f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the request body must be a JSON object")
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": status}}, status=status)


def _serve_one(latency: FixedLatency, host: str, port: int, stats_dir: Path | None, use_uvloop: bool) -> None:
    if use_uvloop:
        import uvloop

        uvloop.install()
    web.run_app(
        FixedServer(latency, stats_dir).app(),
        host=host,
        port=port,
        reuse_port=True,
        access_log=None,
        print=None,
        backlog=4096,
    )


def serve(
    latency: FixedLatency,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    stats_dir: Path | None = None,
    use_uvloop: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM; ``workers`` processes share the port (SO_REUSEPORT)."""
    if workers <= 1:
        _serve_one(latency, host, port, stats_dir, use_uvloop)
        return
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_serve_one, args=(latency, host, port, stats_dir, use_uvloop), daemon=True)
        for _ in range(workers)
    ]
    for process in processes:
        process.start()

    def stop(signum: int, frame: object) -> None:
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for process in processes:
        process.join()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.sim.fixed", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttft-ms", type=float, required=True, help="Time to first token of every request.")
    parser.add_argument("--itl-ms", type=float, required=True, help="Gap between tokens.")
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument("--model", default=MODEL_NAME, help="Model name in /v1/models (requests may name any).")
    parser.add_argument("--workers", type=int, default=1, help="Server processes sharing the port.")
    parser.add_argument("--stats-dir", type=Path, default=None, help="Write per-request server timings here.")
    parser.add_argument("--uvloop", action="store_true", help="Run each worker on uvloop.")
    parser.add_argument("--no-usage", action="store_true", help="Count no prompt tokens; send no usage block.")
    args = parser.parse_args(argv)
    latency = FixedLatency(
        args.ttft_ms / 1e3,
        args.itl_ms / 1e3,
        args.default_max_tokens,
        args.model,
        count_prompt_tokens=not args.no_usage,
    )
    serve(
        latency, host=args.host, port=args.port, workers=args.workers, stats_dir=args.stats_dir, use_uvloop=args.uvloop
    )


if __name__ == "__main__":
    main()
