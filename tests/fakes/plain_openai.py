"""A plain OpenAI-compatible server in a thread (stdlib ``http.server`` on 127.0.0.1): none of vLLM's extras.

It answers ``GET /v1/models`` (the models it was given) and streamed ``POST /v1/chat/completions`` and
``/v1/completions`` only: no ``/tokenize``, no ``/reset_prefix_cache``, no ``/metrics``, no ``/health`` --
what a hosted endpoint or another server offers. Its "tokenizer" counts a prompt as its whitespace-separated
words plus :data:`TEMPLATE_TOKENS` per chat message (so kvbench's own count differs from ``usage.prompt_tokens``
by a known amount), and it sends the first token ``first_token_s`` after it read the request, so a client's
TTFT can be set beside the delay the server itself applied.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes.serving import serving

TEMPLATE_TOKENS = 4
"""Tokens the fake's chat template adds per message."""


def count_tokens(text: str) -> int:
    """The fake server's own count: whitespace-separated words."""
    return len(re.findall(r"\S+", text))


class PlainOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, models: list[str], first_token_s: float) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.models = models
        self.first_token_s = first_token_s
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: PlainOpenAI
    protocol_version = "HTTP/1.0"  # one request per connection: the body ends when the server closes it

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(f"GET {self.path}")
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]})
            return
        self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with self.server.lock:
            self.server.paths.append(f"POST {self.path}")
        if self.path == "/v1/chat/completions":
            messages = body["messages"]
            prompt = sum(count_tokens(m["content"]) + TEMPLATE_TOKENS for m in messages)
            self._stream(body, prompt, lambda text: {"delta": {"content": text}, "index": 0})
            return
        if self.path == "/v1/completions":
            self._stream(body, count_tokens(body["prompt"]), lambda text: {"text": text, "index": 0})
            return
        self._json(404, {"detail": "Not Found"})

    def _stream(self, body: dict[str, object], prompt_tokens: int, choice: Callable[[str], dict[str, object]]) -> None:
        if body.get("model") not in self.server.models:
            self._json(404, {"error": {"message": f"model {body.get('model')!r} does not exist"}})
            return
        answer = int(str(body.get("max_tokens", 16)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(self.server.first_token_s)
        for index in range(answer):
            chunk = {"object": "chat.completion.chunk", "choices": [choice(f" word{index}")]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": answer, "total_tokens": prompt_tokens + answer}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


@contextmanager
def plain_openai(models: list[str] | None = None, first_token_s: float = 0.02) -> Iterator[PlainOpenAI]:
    """The server, serving in a daemon thread for the block; its ``base_url`` ends in ``/v1``."""
    with serving(PlainOpenAI(models or ["plain-model"], first_token_s)) as server:
        yield server
