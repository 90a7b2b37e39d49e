"""The API key kvbench sends never reaches a stored file or a console line, whatever prefix a server
echoes it with: a real local server that answers every completion with the key in its 401 body."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.engines.process import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEY = "Zq9plainKey4242abc"  # matches no generic token pattern: only the literal rule can catch it

SERVER = """
import sys
from aiohttp import web

async def ok(request):
    return web.json_response({"status": "ok", "version": "echo-1"})

async def echo(request):
    sent = request.headers.get("Authorization", "")
    return web.Response(status=401, text="credential rejected: <" + sent.split()[-1] + "> (again:" + sent + ")")

async def tokenize(request):  # one token per character: exact and prefix-stable
    body = await request.json()
    return web.json_response({"tokens": [ord(c) for c in body["prompt"]]})

async def detokenize(request):
    body = await request.json()
    return web.json_response({"prompt": "".join(chr(t) for t in body["tokens"])})

app = web.Application()
app.router.add_post("/tokenize", tokenize)
app.router.add_post("/detokenize", detokenize)
for path in ("/health", "/v1/models", "/version"):
    app.router.add_get(path, ok)
app.router.add_post("/v1/chat/completions", echo)
app.router.add_post("/v1/completions", echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_echoed_api_key_is_scrubbed_everywhere(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "echo_server.py"
    script.write_text(SERVER, encoding="utf-8")
    server = subprocess.Popen([sys.executable, str(script), str(port)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        scenario = {
            "name": "key-echo",
            "engine": {
                "kind": "openai",
                "model": "m",
                "base_url": f"http://127.0.0.1:{port}",
                "api_key_env": "ECHO_TEST_KEY",
            },
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {
                "kind": "multi_round_qa",
                "context_tokens": [64],
                "conversations": 1,
                "warmup_requests": 1,
                "between_turns": {"mode": "none"},
            },
        }
        source = tmp_path / "s.yaml"
        source.write_text(yaml.safe_dump(scenario), encoding="utf-8")
        out = tmp_path / "runs"
        done = subprocess.run(
            [sys.executable, "-m", "kvbench", "run", str(source), "-o", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "ECHO_TEST_KEY": KEY},
            check=False,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert done.returncode != 0
    assert "credential rejected" in done.stderr  # the server's words are shown ...
    assert KEY not in done.stdout + done.stderr  # ... without the key
    (run_dir,) = out.iterdir()
    records = (run_dir / "records.jsonl").read_text(encoding="utf-8")
    assert "credential rejected" in records
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
