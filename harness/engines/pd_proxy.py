"""kvbench's prefill/decode proxy: one OpenAI-compatible endpoint in front of a prefill and a decode vLLM.

Run by :mod:`harness.engines.vllm_pd` as ``python pd_proxy.py --port P --prefill URL --decode URL --log FILE``
(argv list, never a shell; it imports only the standard library and aiohttp, so it runs by path in any python
with aiohttp). It binds 127.0.0.1 unless told otherwise. A completion request (``POST /v1/chat/completions``,
``/v1/completions``) goes through vLLM's disaggregated-serving protocol (vLLM's own toy proxy's, 0.26 and 0.32):

1. to the prefill server, with ``max_tokens`` (and ``max_completion_tokens``) 1, ``stream`` false and
   ``kv_transfer_params = {"do_remote_decode": true, "do_remote_prefill": false, remote_* null}``;
2. its JSON answer's ``kv_transfer_params`` (where the KV waits) go with the original request to the decode
   server, whose answer (a stream or not) is passed back unchanged, byte for byte.

Both legs carry one ``X-Request-Id``. Every request writes one JSON line to the phase log, its times in
``time.monotonic_ns()`` (CLOCK_MONOTONIC: the clock kvbench's client stamps its records with, system-wide on
Linux, so the two join): ``received_ns``, ``prefill_sent_ns``, ``prefill_answered_ns``, ``decode_sent_ns``,
``decode_first_byte_ns``, ``done_ns`` (null where the request never got there), the two legs' HTTP statuses and
an ``error`` (null when it went through). ``/metrics`` is both servers' Prometheus pages in one, every sample
labelled ``kvbench_pd_role="prefill"`` or ``"decode"``; ``/health`` is 200 only while both servers answer theirs
(and echoes ``$KVBENCH_LAUNCH_TOKEN``); ``/tokenize``, ``/detokenize``, ``/v1/models`` and ``/version`` go to the
prefill server, ``/reset_prefix_cache`` to both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

ROLE_LABEL = "kvbench_pd_role"
"""The label the proxy's ``/metrics`` puts on every sample: which server it came from."""
PREFILL = "prefill"
DECODE = "decode"
LAUNCH_TOKEN_ENV = "KVBENCH_LAUNCH_TOKEN"
LAUNCH_TOKEN_HEADER = "X-Kvbench-Launch-Token"
COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
PHASES = ("received_ns", "prefill_sent_ns", "prefill_answered_ns", "decode_sent_ns", "decode_first_byte_ns", "done_ns")
"""The phase log's time fields, in the order a request passes them."""
PREFILL_TRANSFER_PARAMS: dict[str, object] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"})
HEALTH_TIMEOUT_S = 5.0


def prefill_request(body: dict[str, object]) -> dict[str, object]:
    """The request the prefill server gets: one token, no stream, asking to keep the KV for a remote decode."""
    # a min_tokens above the one token asked for would be refused (vLLM checks min_tokens <= max_tokens)
    out = {key: value for key, value in body.items() if key not in ("stream_options", "min_tokens")}
    out.update({"stream": False, "max_tokens": 1, "kv_transfer_params": dict(PREFILL_TRANSFER_PARAMS)})
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    return out


def relabel(page: str, role: str) -> dict[str, tuple[list[str], list[str]]]:
    """A Prometheus text page as family -> (its # HELP/# TYPE lines, its samples labelled ``role``), in page order."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    current: tuple[list[str], list[str]] | None = None
    label = f'{ROLE_LABEL}="{role}"'
    for line in page.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = families.setdefault(parts[2], ([], []))
                current[0].append(line)
            continue
        cut = min((index for index in (line.find("{"), line.find(" ")) if index >= 0), default=len(line))
        name, rest = line[:cut], line[cut:]
        if rest.startswith("{"):
            inner = rest[1:]
            sample = f"{name}{{{label}{'' if inner.startswith('}') else ','}{inner}"
        else:
            sample = f"{name}{{{label}}}{rest}"
        if current is None:
            current = families.setdefault(name, ([], []))
        current[1].append(sample)
    return families


def merge_pages(pages: Sequence[tuple[str, str]]) -> str:
    """(role, page) pairs as one page: each family's header once (the first page's), then every role's samples."""
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for role, page in pages:
        for family, (headers, samples) in relabel(page, role).items():
            into = merged.setdefault(family, (headers, []))
            into[1].extend(samples)
    return "".join("\n".join([*headers, *samples]) + "\n" for headers, samples in merged.values())


class PdProxy:
    """The proxy's handlers, over one client session and the open phase log."""

    def __init__(self, prefill: str, decode: str, log: TextIO, request_timeout_s: float) -> None:
        self.prefill = prefill.rstrip("/")
        self.decode = decode.rstrip("/")
        self.log = log
        self.timeout = ClientTimeout(total=request_timeout_s)
        self._session: ClientSession | None = None

    @property
    def session(self) -> ClientSession:
        if self._session is None:
            # no connection limit (aiohttp's default is 100): the proxy must not queue requests the engines would take
            self._session = ClientSession(timeout=self.timeout, connector=TCPConnector(limit=0))
        return self._session

    async def close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        for path in COMPLETION_PATHS:
            app.router.add_post(path, self.complete)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/reset_prefix_cache", self.reset)
        for path in ("/tokenize", "/detokenize"):
            app.router.add_post(path, self.forward)
        for path in ("/v1/models", "/version"):
            app.router.add_get(path, self.forward)
        app.on_cleanup.append(self.close)
        return app

    def _write(self, line: dict[str, object]) -> None:
        self.log.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.log.flush()

    async def complete(self, request: web.Request) -> web.StreamResponse:
        times: dict[str, int | None] = dict.fromkeys(PHASES)
        times["received_ns"] = time.monotonic_ns()
        line: dict[str, object] = {"path": request.path, "request_id": uuid.uuid4().hex}
        try:
            return await self._complete(request, times, line)
        finally:
            self._write({**line, **times})

    async def _complete(
        self, request: web.Request, times: dict[str, int | None], line: dict[str, object]
    ) -> web.StreamResponse:
        line.update(prefill_status=None, decode_status=None, error=None)
        try:
            body = await request.json()
        except ValueError:
            line["error"] = "request body is not JSON"
            return web.json_response({"error": line["error"]}, status=400)
        if not isinstance(body, dict):
            line["error"] = "request body is not a JSON object"
            return web.json_response({"error": line["error"]}, status=400)
        headers = {"X-Request-Id": str(line["request_id"])}
        if auth := request.headers.get("Authorization"):
            headers["Authorization"] = auth
        times["prefill_sent_ns"] = time.monotonic_ns()
        try:
            async with self.session.post(
                self.prefill + request.path, json=prefill_request(body), headers=headers
            ) as answer:
                text = await answer.text()
                times["prefill_answered_ns"] = time.monotonic_ns()
                line["prefill_status"] = answer.status
        except (ClientError, TimeoutError) as error:
            line["error"] = f"prefill server: {type(error).__name__}: {error}"
            return web.json_response({"error": line["error"]}, status=502)
        if answer.status != 200:
            line["error"] = f"prefill server answered HTTP {answer.status}"
            return web.Response(status=answer.status, text=text, content_type="application/json")
        try:
            params = json.loads(text).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict):
            line["error"] = "prefill server answered without kv_transfer_params (is it a kv_producer?)"
            return web.json_response({"error": line["error"]}, status=502)
        times["decode_sent_ns"] = time.monotonic_ns()
        response: web.StreamResponse | None = None
        try:
            async with self.session.post(
                self.decode + request.path, json={**body, "kv_transfer_params": params}, headers=headers
            ) as answer:
                line["decode_status"] = answer.status
                response = web.StreamResponse(
                    status=answer.status,
                    headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS},
                )
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    if times["decode_first_byte_ns"] is None:
                        times["decode_first_byte_ns"] = time.monotonic_ns()
                    await response.write(chunk)
                await response.write_eof()
                times["done_ns"] = time.monotonic_ns()
                if answer.status != 200:
                    line["error"] = f"decode server answered HTTP {answer.status}"
        except (ClientError, TimeoutError) as error:
            line["error"] = f"decode server: {type(error).__name__}: {error}"
            if response is None:
                return web.json_response({"error": line["error"]}, status=502)
            raise  # a stream cut mid-way: the client sees it cut, as it would from the engine itself
        return response

    async def _get(self, url: str) -> tuple[int, str]:
        try:
            async with self.session.get(url, timeout=ClientTimeout(total=HEALTH_TIMEOUT_S)) as answer:
                return answer.status, await answer.text()
        except (ClientError, TimeoutError) as error:
            return 599, f"{type(error).__name__}: {error}"

    async def health(self, _request: web.Request) -> web.Response:
        (prefill, _), (decode, _) = await asyncio.gather(
            self._get(self.prefill + "/health"), self._get(self.decode + "/health")
        )
        headers = {LAUNCH_TOKEN_HEADER: token} if (token := os.environ.get(LAUNCH_TOKEN_ENV)) else {}
        status = 200 if prefill == 200 and decode == 200 else 503
        return web.json_response({PREFILL: prefill, DECODE: decode}, status=status, headers=headers)

    async def metrics(self, _request: web.Request) -> web.Response:
        (prefill, prefill_page), (decode, decode_page) = await asyncio.gather(
            self._get(self.prefill + "/metrics"), self._get(self.decode + "/metrics")
        )
        if prefill != 200 or decode != 200:
            return web.Response(status=502, text=f"prefill /metrics: {prefill}; decode /metrics: {decode}\n")
        return web.Response(text=merge_pages([(PREFILL, prefill_page), (DECODE, decode_page)]))

    async def forward(self, request: web.Request) -> web.Response:
        data = await request.read()
        try:
            async with self.session.request(
                request.method, self.prefill + request.path, data=data or None, headers=_content_type(request)
            ) as answer:
                return web.Response(status=answer.status, body=await answer.read(), content_type=answer.content_type)
        except (ClientError, TimeoutError) as error:
            return web.json_response({"error": f"prefill server: {type(error).__name__}"}, status=502)

    async def reset(self, _request: web.Request) -> web.Response:
        """Both servers' GPU prefix caches; vLLM's ``{"success": false}`` (blocks in use) from either is passed on."""
        answers: list[tuple[int, str]] = []
        for base in (self.prefill, self.decode):
            try:
                async with self.session.post(base + "/reset_prefix_cache") as answer:
                    answers.append((answer.status, await answer.text()))
            except (ClientError, TimeoutError) as error:
                return web.json_response({"error": f"{base}: {type(error).__name__}"}, status=502)
        for status, text in answers:
            if status != 200 or '"success":false' in text.replace(" ", ""):
                return web.Response(status=status, text=text, content_type="application/json")
        return web.Response(status=200, text=answers[-1][1], content_type="application/json")


def _content_type(request: web.Request) -> dict[str, str]:
    return {"Content-Type": request.content_type} if request.body_exists else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kvbench's prefill/decode proxy (vLLM's P/D protocol)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", required=True, help="the prefill server's base URL")
    parser.add_argument("--decode", required=True, help="the decode server's base URL")
    parser.add_argument("--log", type=Path, required=True, help="the phase log (JSON Lines, appended)")
    parser.add_argument("--request-timeout-s", type=float, default=3600.0)
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a", encoding="utf-8") as log:
        proxy = PdProxy(args.prefill, args.decode, log, args.request_timeout_s)
        web.run_app(proxy.app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
