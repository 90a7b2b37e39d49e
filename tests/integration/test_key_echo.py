"""The API key kvbench sends never reaches a stored file or a console line, whatever prefix a server
echoes it with: a real local server that answers every completion with the key in its 401 body."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.key_echo import run_against_echo

pytestmark = pytest.mark.integration

KEY = "Zq9plainKey4242abc"  # matches no generic token pattern: only the literal rule can catch it

ECHO = """
async def echo(request):
    sent = request.headers.get("Authorization", "")
    return web.Response(status=401, text="credential rejected: <" + sent.split()[-1] + "> (again:" + sent + ")")
"""


def test_echoed_api_key_is_scrubbed_everywhere(tmp_path: Path) -> None:
    done, run_dir = run_against_echo(tmp_path, ECHO, KEY)
    assert done.returncode != 0
    assert "credential rejected" in done.stderr  # the server's words are shown ...
    assert KEY not in done.stdout + done.stderr  # ... without the key
    records = (run_dir / "records.jsonl").read_text(encoding="utf-8")
    assert "credential rejected" in records
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
