"""The API key is scrubbed in every encoding a server may echo it in, before anything is stored.

A real local server answers every completion with a 401 whose body echoes the key kvbench sent
JSON-escaped (``\\"`` and ``\\/``), percent-encoded, base64-encoded and inside an
``Authorization: Basic`` header; ``kvbench run`` against it must leave none of those forms in the
run directory (records.jsonl, manifest, logs) or on the console.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
import yaml

from harness.engines.process import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEY = 'Zq9/plain+Key"4242abc'  # '/', '+' and '"' change under JSON escaping and percent-encoding

SERVER = """
import base64, json, sys
from urllib.parse import quote
from aiohttp import web

async def ok(request):
    return web.json_response({"status": "ok", "version": "echo-1"})

async def echo(request):
    key = request.headers.get("Authorization", "").split(" ", 1)[-1]
    basic = base64.b64encode(("user:" + key).encode()).decode()
    text = " ".join([
        "credential rejected:", json.dumps({"sent": key}), json.dumps(key).replace("/", "\\\\/"),
        "q=" + quote(key, safe=""), "b64=" + base64.b64encode(key.encode()).decode(), "Authorization: Basic " + basic,
    ])
    return web.Response(status=401, text=text)

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


def key_forms() -> list[bytes]:
    """Every form of the key the server echoes, computed here independently of kvbench's redaction."""
    escaped = json.dumps(KEY)[1:-1]
    forms = [KEY, escaped, escaped.replace("/", "\\/"), quote(KEY, safe=""), quote_plus(KEY)]
    forms += [base64.b64encode(KEY.encode()).decode(), base64.b64encode(f"user:{KEY}".encode()).decode()]
    return [form.encode() for form in forms]


def test_an_echoed_key_is_scrubbed_in_every_encoding(tmp_path: Path) -> None:
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
        engine = {"kind": "openai", "model": "m", "base_url": f"http://127.0.0.1:{port}", "api_key_env": "ECHO_KEY"}
        workload = {"kind": "multi_round_qa", "context_tokens": [64], "conversations": 1, "warmup_requests": 1}
        scenario = {
            "name": "key-echo-encoded",
            "engine": engine,
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {**workload, "between_turns": {"mode": "none"}},
        }
        source = tmp_path / "s.yaml"
        source.write_text(yaml.safe_dump(scenario), encoding="utf-8")
        out = tmp_path / "runs"
        argv = [sys.executable, "-m", "kvbench", "run", str(source), "-o", str(out)]
        env = {**os.environ, "ECHO_KEY": KEY}
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, env=env, check=False)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert done.returncode != 0
    assert "credential rejected" in done.stderr
    (run_dir,) = out.iterdir()
    records = (run_dir / "records.jsonl").read_text(encoding="utf-8")
    assert "credential rejected" in records and "Basic ***" in records  # the server's words stay, its echo goes
    stored = [path for path in run_dir.rglob("*") if path.is_file()]
    for form in key_forms():
        assert form not in (done.stdout + done.stderr).encode(), form
        for path in stored:
            assert form not in path.read_bytes(), (path, form)
