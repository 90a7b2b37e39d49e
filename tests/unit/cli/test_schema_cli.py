"""``kvbench schema``: lists every stored file's schema name, prints the shipped schema of one, and an unknown name
is a one-line error naming the allowed ones."""

from __future__ import annotations

import json
from pathlib import Path

from harness.results.file_schemas import STORED_FILES, shipped
from tests.support import kvbench


def test_list_print_and_unknown(tmp_path: Path) -> None:
    listed = kvbench("schema", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(STORED_FILES)

    printed = kvbench("schema", "summary", cwd=tmp_path)
    assert printed.returncode == 0 and printed.stdout == shipped("summary")
    assert json.loads(printed.stdout)["title"] == "RunResult"

    unknown = kvbench("schema", "summaries", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""
    (line,) = unknown.stderr.strip().splitlines()
    assert "schema 'summaries': no such stored file; allowed: records, manifest," in line
