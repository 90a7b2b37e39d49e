"""A real local server that answers every completion with a 401 echoing the API key kvbench sent, and a
``kvbench run`` against it: the key-scrubbing tests differ only in how the server echoes the key.

The server (an aiohttp script started as its own process on 127.0.0.1) serves ``/health``, ``/v1/models``,
``/version``, ``/tokenize`` and ``/detokenize`` (one token per character: exact and prefix-stable) and takes
its completion handler, ``async def echo(request)``, from the test.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.engines.process import free_port
from tests.support import REPO, kvbench, kvbench_env, write_scenario

SERVER = """
import base64, json, sys
from urllib.parse import quote
from aiohttp import web

async def ok(request):
    return web.json_response({"status": "ok", "version": "echo-1"})

async def tokenize(request):
    body = await request.json()
    return web.json_response({"tokens": [ord(c) for c in body["prompt"]]})

async def detokenize(request):
    body = await request.json()
    return web.json_response({"prompt": "".join(chr(t) for t in body["tokens"])})

ECHO

app = web.Application()
app.router.add_post("/tokenize", tokenize)
app.router.add_post("/detokenize", detokenize)
for path in ("/health", "/v1/models", "/version"):
    app.router.add_get(path, ok)
app.router.add_post("/v1/chat/completions", echo)
app.router.add_post("/v1/completions", echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def run_against_echo(tmp_path: Path, echo: str, key: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``kvbench run`` (one arm, one conversation) sending ``key`` to a server whose completions ``echo``
    (the source of ``async def echo(request)``) answers; the finished process and its run directory."""
    port = free_port()
    script = tmp_path / "echo_server.py"
    script.write_text(SERVER.replace("ECHO", echo), encoding="utf-8")
    server = subprocess.Popen([sys.executable, str(script), str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        engine = {"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}", "api_key_env": "ECHO_KEY"}
        workload = {"kind": "multi_round_qa", "context_tokens": [64], "conversations": 1, "warmup_requests": 1}
        scenario = {
            "name": "key-echo",
            "engine": engine,
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {**workload, "between_turns": {"mode": "none"}},
        }
        source = write_scenario(tmp_path / "s.yaml", scenario)
        out = tmp_path / "runs"
        done = kvbench("run", str(source), "-o", str(out), cwd=REPO, timeout=180, env=kvbench_env(ECHO_KEY=key))
    finally:
        server.terminate()
        server.wait(timeout=10)
    (run_dir,) = out.iterdir()
    return done, run_dir
