"""A stand-in OpenAI-compatible engine server that replays golden streams and /metrics pages.

kvbench's engine tests run this as a real process (``python tests/fakes/fake_engine.py ...``), in
place of vLLM, SGLang or TensorRT-LLM, so that start-up, health checks, streaming, error mapping,
metrics scraping and shutdown go through real sockets, signals and process groups in well under a
second. What it answers is taken from the engine family's golden files
(``tests/golden/sse/contract.json`` names them):

* ``POST /v1/chat/completions`` and ``/v1/completions`` (``stream: true`` only): the family's golden
  SSE stream, frame by frame, the first token-carrying frame after ``--first-token-delay-ms``.
  Checks like the engines: an unknown ``model`` is HTTP 404, ``max_tokens < 1`` is HTTP 400, a
  wrong ``Authorization`` (with ``--api-key``) is HTTP 401, each in the family's error shape. A
  prompt containing ``[[fake:http_500]]``, ``[[fake:stream_error]]`` or ``[[fake:drop]]`` gets an
  HTTP 500, an error frame after the first token, or a connection closed after the first token.
* the family's Prometheus page: vLLM and SGLang on ``/metrics`` (SGLang only with
  ``--enable-metrics``), TensorRT-LLM on ``/prometheus/metrics`` when the ``--extra_llm_api_options``
  YAML sets ``return_perf_metrics: true`` (its ``/metrics`` is JSON iteration stats). The page is
  the golden "before" page until a generation request completes, then the "after" page.
* the family's helpers: vLLM ``/tokenize``, ``/detokenize``, ``/reset_prefix_cache``; SGLang
  ``/tokenize``, ``/detokenize`` (not with ``--no-tokenize``) and ``/flush_cache`` (refused with
  HTTP 400 ``--flush-refusals`` times, as SGLang does while requests run); TensorRT-LLM none.
  Tokens are the UTF-8 bytes of the text (256 = BOS when special tokens are asked for).
* test hooks: ``GET /fake/state`` (requests seen, flushes, options) and ``POST /fake/reset_counters``
  (back to the "before" page).

Modes (``--mode``): ``normal``; ``crash-at-start`` (a traceback on stderr, exit code 3, before
binding); ``never-healthy`` (``/health`` answers 503 forever); ``ignore-sigterm`` (the server and a
worker child it starts ignore SIGTERM, so only SIGKILL of the process group stops them).
``--pid-file`` records the pids, ``--leftover PATH`` creates files an engine would leave behind
(``{pid}`` is replaced). Engine-style arguments (``--model``/``--model-path``, positional MODEL,
``--served-model-name``, ``--host``, ``--port``, ``--extra_llm_api_options``) are understood and
anything else is ignored, so the stand-in ``sglang.launch_server`` and ``trtllm-serve`` the tests
write can hand over their command line unchanged; ``$KVBENCH_FAKE_ENGINE_ARGS`` (a JSON list) adds
more arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
CONTRACT: dict[str, Any] = json.loads((GOLDEN / "sse" / "contract.json").read_text(encoding="utf-8"))
FAMILIES = sorted(name for name in CONTRACT if not name.startswith("_"))
MODES = ("normal", "crash-at-start", "never-healthy", "ignore-sigterm")
EXTRA_ARGS_ENV = "KVBENCH_FAKE_ENGINE_ARGS"
RECORD_ENV = "KVBENCH_FAKE_ENGINE_RECORD"

TRIGGER_HTTP_500 = "[[fake:http_500]]"
TRIGGER_STREAM_ERROR = "[[fake:stream_error]]"
TRIGGER_DROP = "[[fake:drop]]"
BOS = 256
WORKER_CODE = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="kvbench's stand-in engine server (tests only)")
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("model_positional", nargs="?", default=None, help="trtllm-serve style MODEL")
    parser.add_argument("--model", "--model-path", dest="model", default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--extra_llm_api_options", "--config", dest="llm_api_options", default=None)
    parser.add_argument("--enable-metrics", action="store_true", help="SGLang serves /metrics only with it")
    parser.add_argument("--mode", choices=MODES, default="normal")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--first-token-delay-ms", type=float, default=30.0)
    parser.add_argument("--token-delay-ms", type=float, default=2.0)
    parser.add_argument("--startup-delay-s", type=float, default=0.0)
    parser.add_argument("--no-tokenize", action="store_true", help="SGLang without /tokenize (older versions)")
    parser.add_argument("--flush-refusals", type=int, default=0)
    parser.add_argument("--pid-file", default=None)
    parser.add_argument("--leftover", action="append", default=[])
    parser.add_argument("--record", default=os.environ.get(RECORD_ENV))
    args, _unknown = parser.parse_known_args(list(argv))
    return args


def split_frames(payload: bytes) -> list[bytes]:
    """The events of a golden stream (``\\n\\n``-separated), each with its terminator."""
    text = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return [chunk + b"\n\n" for chunk in text.split(b"\n\n") if chunk.strip()]


def carries_tokens(frame: bytes) -> bool:
    data = frame.decode("utf-8").removeprefix("data:").strip()
    if not data.startswith("{"):
        return False
    choices = json.loads(data).get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content"))


@dataclass(frozen=True)
class Family:
    name: str
    streams: dict[str, list[bytes]]
    before: str
    after: str
    metrics_path: str
    json_metrics: str | None

    @classmethod
    def load(cls, name: str) -> Family:
        spec = CONTRACT[name]
        streams = {
            api: split_frames((GOLDEN / "sse" / spec[api]["file"]).read_bytes()) for api in ("chat", "completions")
        }
        metrics = spec["metrics"]
        json_file = metrics.get("json_metrics")
        return cls(
            name=name,
            streams=streams,
            before=(GOLDEN / "metrics" / metrics["before"]).read_text(encoding="utf-8"),
            after=(GOLDEN / "metrics" / metrics["after"]).read_text(encoding="utf-8"),
            metrics_path=metrics["path"],
            json_metrics=(GOLDEN / "metrics" / json_file).read_text(encoding="utf-8") if json_file else None,
        )


class FakeEngine:
    def __init__(self, args: argparse.Namespace, family: Family, options: dict[str, Any]) -> None:
        self.args = args
        self.family = family
        self.options = options
        self.model = args.model or args.model_positional or "fake-model"
        self.served = self._served_name()
        self.started = time.monotonic()
        self.completed = 0
        self.flushes = 0
        self.flush_refusals = args.flush_refusals
        self.requests: list[dict[str, Any]] = []

    def _served_name(self) -> str:
        if self.args.served_model_name:
            return str(self.args.served_model_name)
        if self.family.name == "trtllm":  # trtllm-serve names a local checkpoint by its directory
            path = Path(self.model)
            return path.name if path.is_dir() else self.model
        return Path(self.model).name if self.family.name == "vllm" else self.model

    # ------------------------------------------------------------------ application

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/fake/state", self.state)
        app.router.add_post("/fake/reset_counters", self.reset_counters)
        if self.family.name == "vllm":
            app.router.add_post("/tokenize", self.tokenize)
            app.router.add_post("/detokenize", self.detokenize)
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        elif self.family.name == "sglang":
            if not self.args.no_tokenize:
                for prefix in ("", "/v1"):
                    app.router.add_post(prefix + "/tokenize", self.tokenize)
                    app.router.add_post(prefix + "/detokenize", self.detokenize)
            app.router.add_route("GET", "/flush_cache", self.flush_cache)
            app.router.add_route("POST", "/flush_cache", self.flush_cache)
        elif self.family.name == "trtllm":
            app.router.add_get("/prometheus/metrics", self.prometheus_metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.args.api_key
        if key and request.path.startswith("/v1/") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def error(self, status: int, message: str, kind: str) -> web.Response:
        """An error in the family's shape (vLLM nests it under "error"; SGLang and TensorRT-LLM do not)."""
        if self.family.name == "vllm":
            body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        else:
            body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return web.json_response(body, status=status)

    def error_frame(self, message: str) -> bytes:
        if self.family.name == "vllm":
            body: dict[str, Any] = {"error": {"message": message, "type": "InternalServerError", "code": 500}}
        else:
            body = {"object": "error", "message": message, "type": "InternalServerError", "param": None, "code": 500}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    # ------------------------------------------------------------------ routes

    async def health(self, request: web.Request) -> web.Response:
        loading = time.monotonic() - self.started < self.args.startup_delay_s
        if self.args.mode == "never-healthy" or loading:
            return web.Response(status=503, text="engine is loading")
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": f"0.0.0-fake-{self.family.name}"})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.served, "object": "model", "created": 0, "owned_by": self.family.name}
        return web.json_response({"object": "list", "data": [card]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _generate(self, request: web.Request, api: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return self.error(400, "the request body is not valid JSON", "BadRequestError")
        if not isinstance(body, dict):
            return self.error(400, "the request body must be a JSON object", "BadRequestError")
        self.requests.append({"path": request.path, "body": body})
        model = body.get("model")
        if model != self.served:
            return self.error(404, f"The model `{model}` does not exist.", "NotFoundError")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return self.error(400, f"max_tokens must be at least 1, got {max_tokens!r}.", "BadRequestError")
        if body.get("stream") is not True:
            return self.error(400, "the fake engine answers streaming requests only", "BadRequestError")
        if api == "chat":
            prompt = " ".join(str(message.get("content", "")) for message in body.get("messages") or [])
        else:
            prompt = str(body.get("prompt", ""))
        if TRIGGER_HTTP_500 in prompt:
            return self.error(500, "fake internal error (as asked)", "InternalServerError")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        first = True
        for frame in self.family.streams[api]:
            tokens = carries_tokens(frame)
            if tokens:
                delay = self.args.first_token_delay_ms if first else self.args.token_delay_ms
                await asyncio.sleep(delay / 1000)
            await response.write(frame)
            if tokens and first:
                first = False
                if TRIGGER_STREAM_ERROR in prompt:
                    await response.write(self.error_frame("fake engine error mid-stream (as asked)"))
                    await response.write(b"data: [DONE]\n\n")
                    await response.write_eof()
                    return response
                if TRIGGER_DROP in prompt:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
        await response.write_eof()
        self.completed += 1
        return response

    def _page(self) -> str:
        return self.family.before if self.completed == 0 else self.family.after

    async def metrics(self, request: web.Request) -> web.Response:
        if self.family.name == "trtllm":
            return web.Response(text=self.family.json_metrics or "[]", content_type="application/json")
        if self.family.name == "sglang" and not self.args.enable_metrics:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self._page(), content_type="text/plain", charset="utf-8")

    async def prometheus_metrics(self, request: web.Request) -> web.Response:
        if self.options.get("return_perf_metrics") is not True:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self._page(), content_type="text/plain", charset="utf-8")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return self.error(400, "prompt must be a string", "BadRequestError")
        tokens = list(prompt.encode("utf-8"))
        if body.get("add_special_tokens", True):
            tokens.insert(0, BOS)
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 8192})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = bytes(t for t in body.get("tokens", []) if 0 <= t < BOS).decode("utf-8", errors="replace")
        key = "text" if self.family.name == "sglang" else "prompt"
        return web.json_response({key: text})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.json_response({"success": True})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.flush_refusals > 0:
            self.flush_refusals -= 1
            return web.Response(
                status=400,
                text="Cache not flushed.\nReason: there are running or waiting requests (fake).\n",
            )
        self.flushes += 1
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.\n")

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "family": self.family.name,
                "model": self.model,
                "served_model_name": self.served,
                "completed": self.completed,
                "flushes": self.flushes,
                "requests": self.requests,
                "llm_api_options": self.options,
                "pid": os.getpid(),
            }
        )

    async def reset_counters(self, request: web.Request) -> web.Response:
        self.completed = 0
        return web.json_response({"completed": 0})


def _record(args: argparse.Namespace, argv: Sequence[str], options: dict[str, Any]) -> None:
    if not args.record:
        return
    prefixes = ("SGLANG", "VLLM", "LMCACHE", "PYTHONUNBUFFERED", "KVBENCH_FAKE", "TRTLLM")
    env = {key: value for key, value in os.environ.items() if key.startswith(prefixes)}
    payload = {"argv": list(argv), "env": env, "llm_api_options": options, "family": args.family}
    Path(args.record).write_text(json.dumps(payload, indent=1), encoding="utf-8")


async def serve(engine: FakeEngine) -> None:
    runner = web.AppRunner(engine.app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, engine.args.host, engine.args.port)
    await site.start()
    print(
        f"INFO fake {engine.family.name} engine serving {engine.model!r} as {engine.served!r} "
        f"on http://{engine.args.host}:{engine.args.port} (mode {engine.args.mode})",
        flush=True,
    )
    stop = asyncio.Event()
    if engine.args.mode != "ignore-sigterm":
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print("INFO fake engine: SIGTERM, shutting down", flush=True)
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = os.environ.get(EXTRA_ARGS_ENV)
    if extra:
        argv += [str(item) for item in json.loads(extra)]
    args = parse_args(argv)
    options: dict[str, Any] = {}
    if args.llm_api_options:
        loaded = yaml.safe_load(Path(args.llm_api_options).read_text(encoding="utf-8"))
        options = loaded if isinstance(loaded, dict) else {}
    _record(args, argv, options)
    print(f"INFO fake {args.family} engine: loading model {args.model or args.model_positional}", flush=True)
    if args.mode == "crash-at-start":
        print(
            "Traceback (most recent call last):\n"
            '  File "fake_engine.py", line 1, in <module>\n'
            f"RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB (fake {args.family} engine)",
            file=sys.stderr,
            flush=True,
        )
        return 3
    children: list[int] = []
    if args.mode == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker = subprocess.Popen([sys.executable, "-c", WORKER_CODE], stdin=subprocess.DEVNULL)
        children.append(worker.pid)
    for pattern in args.leftover:
        leftover = Path(pattern.replace("{pid}", str(os.getpid())))
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_text("left behind by the fake engine\n", encoding="utf-8")
    if args.pid_file:
        Path(args.pid_file).write_text(json.dumps({"pid": os.getpid(), "children": children}), encoding="utf-8")
    engine = FakeEngine(args, Family.load(args.family), options)
    asyncio.run(serve(engine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
