"""The API key is scrubbed in every encoding a server may echo it in, before anything is stored.

A real local server answers every completion with a 401 whose body echoes the key kvbench sent
JSON-escaped (``\\"`` and ``\\/``), percent-encoded, base64-encoded and inside an
``Authorization: Basic`` header; ``kvbench run`` against it must leave none of those forms in the
run directory (records.jsonl, manifest, logs) or on the console.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from tests.key_echo import run_against_echo

pytestmark = pytest.mark.integration

KEY = 'Zq9/plain+Key"4242abc'  # '/', '+' and '"' change under JSON escaping and percent-encoding

ECHO = """
async def echo(request):
    key = request.headers.get("Authorization", "").split(" ", 1)[-1]
    basic = base64.b64encode(("user:" + key).encode()).decode()
    text = " ".join([
        "credential rejected:", json.dumps({"sent": key}), json.dumps(key).replace("/", "\\\\/"),
        "q=" + quote(key, safe=""), "b64=" + base64.b64encode(key.encode()).decode(), "Authorization: Basic " + basic,
    ])
    return web.Response(status=401, text=text)
"""


def key_forms() -> list[bytes]:
    """Every form of the key the server echoes, computed here independently of kvbench's redaction."""
    escaped = json.dumps(KEY)[1:-1]
    forms = [KEY, escaped, escaped.replace("/", "\\/"), quote(KEY, safe=""), quote_plus(KEY)]
    forms += [base64.b64encode(KEY.encode()).decode(), base64.b64encode(f"user:{KEY}".encode()).decode()]
    return [form.encode() for form in forms]


def test_an_echoed_key_is_scrubbed_in_every_encoding(tmp_path: Path) -> None:
    done, run_dir = run_against_echo(tmp_path, ECHO, KEY)
    assert done.returncode != 0
    assert "credential rejected" in done.stderr
    records = (run_dir / "records.jsonl").read_text(encoding="utf-8")
    assert "credential rejected" in records and "Basic ***" in records  # the server's words stay, its echo goes
    stored = [path for path in run_dir.rglob("*") if path.is_file()]
    for form in key_forms():
        assert form not in (done.stdout + done.stderr).encode(), form
        for path in stored:
            assert form not in path.read_bytes(), (path, form)
