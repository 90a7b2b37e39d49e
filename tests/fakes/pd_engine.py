"""A stand-in for one side of vLLM's prefill/decode deployment, speaking its P/D protocol (a process of its own).

``python tests/fakes/pd_engine.py --role prefill|decode|colocated --port P`` serves on 127.0.0.1 (``colocated``:
a plain server, no P/D connector, which refuses ``kv_transfer_params``):

* ``POST /v1/chat/completions``: the prefill side accepts only ``max_tokens`` 1, ``stream`` false and
  ``kv_transfer_params.do_remote_decode`` true, waits ``--prefill-s`` and answers one token with
  ``kv_transfer_params`` naming where the KV waits; the decode side accepts only the ``kv_transfer_params``
  a prefill side answered (``do_remote_prefill`` true), waits ``--transfer-s`` (the push), then streams
  ``--answer-words`` words as Server-Sent Events, the first after ``--first-token-s`` more, and ``[DONE]``;
* ``GET /metrics``: vLLM's queue and prefill histograms (_sum/_count) and, on the side that records transfers
  (decode), NIXL's transfer time, bytes (``--bytes-per-token`` x the prompt's words) and descriptors, and the
  external prefix-cache hits the transfer supplied;
* ``GET /health``; ``POST /tokenize`` (a token per word), ``/detokenize`` (a word per token),
  ``/reset_prefix_cache``.

A request that breaks the protocol gets HTTP 400 naming what was wrong, so a proxy that sends the wrong thing
fails the test that uses it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web

PREFILL_ANSWER_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "fake-prefill",
    "remote_block_ids": [1, 2, 3],
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}


def prompt_words(body: dict[str, object]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(len(str(message.get("content", "")).split()) for message in messages if isinstance(message, dict))


class Side:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counters: dict[str, float] = {}

    def add(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.args.role == "colocated":
            if "kv_transfer_params" in body:
                return web.json_response({"error": "a colocated server has no KV connector"}, status=400)
            await asyncio.sleep(self.args.prefill_s)
            self.add("prefill_sum", self.args.prefill_s + self.args.first_token_s)
            self.add("prefill_count", 1)
            return await self._stream(request, prompt_words(body))
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict):
            return web.json_response({"error": "no kv_transfer_params"}, status=400)
        words = prompt_words(body)
        if self.args.role == "prefill":
            if params.get("do_remote_decode") is not True or body.get("max_tokens") != 1 or body.get("stream"):
                return web.json_response({"error": "not a P/D prefill request"}, status=400)
            await asyncio.sleep(self.args.prefill_s)
            self.add("queue_sum", 0.0)
            self.add("queue_count", 1)
            self.add("prefill_sum", self.args.prefill_s)
            self.add("prefill_count", 1)
            answer = {
                "id": "p",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": words, "completion_tokens": 1},
                "kv_transfer_params": PREFILL_ANSWER_PARAMS,
            }
            return web.json_response(answer)
        if params != PREFILL_ANSWER_PARAMS:
            return web.json_response({"error": "kv_transfer_params are not the prefill side's"}, status=400)
        await asyncio.sleep(self.args.transfer_s)
        self.add("xfer_sum", self.args.transfer_s)
        self.add("xfer_count", 1)
        self.add("bytes_sum", words * self.args.bytes_per_token)
        self.add("descriptors_sum", 3)
        self.add("external_hits", words)
        self.add("queue_sum", 0.0)
        self.add("queue_count", 1)
        self.add("prefill_sum", self.args.transfer_s + self.args.first_token_s)
        self.add("prefill_count", 1)
        return await self._stream(request, words)

    async def _stream(self, request: web.Request, words: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.args.first_token_s)
        for index in range(self.args.answer_words):
            chunk = {
                "id": "d",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": f"w{index} "}}],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": words, "completion_tokens": self.args.answer_words}
        await response.write(f"data: {json.dumps({'id': 'd', 'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def metrics(self, _request: web.Request) -> web.Response:
        c = self.counters.get
        lines = [
            "# TYPE vllm:request_queue_time_seconds histogram",
            f'vllm:request_queue_time_seconds_sum{{model_name="m"}} {c("queue_sum", 0.0)}',
            f'vllm:request_queue_time_seconds_count{{model_name="m"}} {c("queue_count", 0.0)}',
            "# TYPE vllm:request_prefill_time_seconds histogram",
            f'vllm:request_prefill_time_seconds_sum{{model_name="m"}} {c("prefill_sum", 0.0)}',
            f'vllm:request_prefill_time_seconds_count{{model_name="m"}} {c("prefill_count", 0.0)}',
            "# TYPE vllm:external_prefix_cache_hits counter",
            f'vllm:external_prefix_cache_hits_total{{model_name="m"}} {c("external_hits", 0.0)}',
        ]
        if self.args.role == "decode":
            lines += [
                "# TYPE vllm:nixl_xfer_time_seconds histogram",
                f'vllm:nixl_xfer_time_seconds_sum{{model_name="m"}} {c("xfer_sum", 0.0)}',
                f'vllm:nixl_xfer_time_seconds_count{{model_name="m"}} {c("xfer_count", 0.0)}',
                "# TYPE vllm:nixl_bytes_transferred histogram",
                f'vllm:nixl_bytes_transferred_sum{{model_name="m"}} {c("bytes_sum", 0.0)}',
                f'vllm:nixl_bytes_transferred_count{{model_name="m"}} {c("xfer_count", 0.0)}',
                "# TYPE vllm:nixl_num_descriptors histogram",
                f'vllm:nixl_num_descriptors_sum{{model_name="m"}} {c("descriptors_sum", 0.0)}',
                f'vllm:nixl_num_descriptors_count{{model_name="m"}} {c("xfer_count", 0.0)}',
            ]
        return web.Response(text="\n".join(lines) + "\n")

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body.get("prompt", "")).split()
        return web.json_response({"tokens": list(range(len(words))), "count": len(words)})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": " ".join(f"w{token}" for token in body.get("tokens", []))})

    async def reset(self, _request: web.Request) -> web.Response:
        return web.json_response({"success": True})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("prefill", "decode", "colocated"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill-s", type=float, default=0.05)
    parser.add_argument("--transfer-s", type=float, default=0.02)
    parser.add_argument("--first-token-s", type=float, default=0.01)
    parser.add_argument("--answer-words", type=int, default=5)
    parser.add_argument("--bytes-per-token", type=int, default=1000)
    args = parser.parse_args()
    side = Side(args)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", side.complete)
    app.router.add_get("/metrics", side.metrics)
    app.router.add_get("/health", side.health)
    app.router.add_post("/tokenize", side.tokenize)
    app.router.add_post("/detokenize", side.detokenize)
    app.router.add_post("/reset_prefix_cache", side.reset)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
