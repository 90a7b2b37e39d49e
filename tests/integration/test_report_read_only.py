"""``kvbench report``, ``report --html -o FILE`` and ``compare`` leave a run directory as it is; ``report --rewrite``
rewrites it, and ``report --rewrite --compress`` packs it for keeping, into the very bytes committed, without
changing what it reports.

Each command runs as a user runs it (a subprocess) on a copy of a kept run directory; every file and folder in the
copy keeps its bytes and its modification time (nanoseconds), and no file appears or goes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kept_runs import PRODUCT_RUNS, plain_copy
from tests.support import kvbench

pytestmark = pytest.mark.integration

KEPT = PRODUCT_RUNS / "quickstart-sim"


def snapshot(directory: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under ``directory`` (and itself): its bytes (None for a folder) and its mtime in ns."""
    paths = [directory, *sorted(directory.rglob("*"))]
    return {
        str(path.relative_to(directory)): (path.read_bytes() if path.is_file() else None, path.stat().st_mtime_ns)
        for path in paths
    }


@pytest.fixture
def kept_copy(tmp_path: Path) -> Path:
    return plain_copy(KEPT, tmp_path / KEPT.name)


def test_report_html_and_compare_change_nothing_in_the_run_dir(kept_copy: Path, tmp_path: Path) -> None:
    before = snapshot(kept_copy)

    shown = kvbench("report", str(kept_copy), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "AMG-OFF" in shown.stdout  # the table is on stdout
    written = [Path(line.removeprefix("wrote ")) for line in shown.stdout.splitlines() if line.startswith("wrote ")]
    assert written and all(path.is_file() and kept_copy not in path.parents for path in written)
    table = next(path for path in written if path.name == "ttft_table.md")
    assert table.read_bytes() == (kept_copy / "report" / "ttft_table.md").read_bytes()

    html = tmp_path / "case.html"
    page = kvbench("report", "--html", str(kept_copy), "-o", str(html), cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert html.stat().st_size > 0

    folder = tmp_path / "tables"
    into = kvbench("report", str(kept_copy), "-o", str(folder), "--json", cwd=tmp_path)
    assert into.returncode == 0, into.stderr
    assert json.loads(into.stdout) == json.loads((kept_copy / "summary.json").read_text(encoding="utf-8"))
    assert (folder / "ttft.csv").read_bytes() == (kept_copy / "report" / "ttft.csv").read_bytes()

    gate = kvbench("compare", str(kept_copy), str(kept_copy), cwd=tmp_path)
    assert gate.returncode in (0, 3), gate.stderr

    assert snapshot(kept_copy) == before


def test_rewrite_writes_the_run_dir_and_compress_packs_it(kept_copy: Path, tmp_path: Path) -> None:
    (kept_copy / "summary.json").unlink()
    rewritten = kvbench("report", "--rewrite", str(kept_copy), cwd=tmp_path)
    assert rewritten.returncode == 0, rewritten.stderr
    assert (kept_copy / "summary.json").read_bytes() == (KEPT / "summary.json").read_bytes()

    records = (kept_copy / "records.jsonl").read_bytes()
    packed = kvbench("report", "--rewrite", "--compress", str(kept_copy), cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    assert not (kept_copy / "records.jsonl").exists()
    assert (kept_copy / "records.jsonl.xz").stat().st_size < len(records)
    assert (kept_copy / "records.jsonl.xz").read_bytes() == (KEPT / "records.jsonl.xz").read_bytes()
    assert (kept_copy / "summary.json").read_bytes() == (KEPT / "summary.json").read_bytes()
    again = kvbench("report", str(kept_copy), "--json", cwd=tmp_path)
    assert json.loads(again.stdout) == json.loads((KEPT / "summary.json").read_text(encoding="utf-8"))

    refused = kvbench("report", "--compress", str(kept_copy), cwd=tmp_path)
    assert refused.returncode == 2 and "--compress goes with --rewrite" in refused.stderr
    refused = kvbench("report", "--rewrite", "--compress-results", str(kept_copy), cwd=tmp_path)
    assert refused.returncode == 2 and "--compress-results goes with --compress" in refused.stderr
