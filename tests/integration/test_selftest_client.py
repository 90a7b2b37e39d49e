"""``kvbench selftest client`` against the real fixed-latency server: what the client adds is measured, never
negative (the server starts its clock only once it has read the request), the request rate follows from the known
service time, and the CPU per stream comes from the client's own processes. Bad flags fail in one line.
About 20 s on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import kvbench

pytestmark = pytest.mark.integration

TTFT_MS = 100.0
ITL_MS = 20.0
OUTPUT_TOKENS = 6


def test_selftest_reports_what_the_client_adds_from_one_and_two_workers(tmp_path: Path) -> None:
    out = tmp_path / "selftest.json"
    done = kvbench(
        "selftest",
        "client",
        "--streams",
        "8",
        "--workers",
        "1,2",
        "--prompt-tokens",
        "500",
        "--output-tokens",
        str(OUTPUT_TOKENS),
        "--ttft-ms",
        str(TTFT_MS),
        "--itl-ms",
        str(ITL_MS),
        "--warmup",
        "1",
        "--duration",
        "2",
        "--json",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # off a terminal, progress is plain lines, one per level
    assert "done: 8 streams × 1 worker(s): added TTFT p99" in done.stdout
    assert "done: 8 streams × 2 worker(s): added TTFT p99" in done.stdout
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert "CPUs" in figures["machine"]
    one, two = figures["levels"]
    assert (one["workers"], two["workers"]) == (1, 2)
    service_s = (TTFT_MS + (OUTPUT_TOKENS - 1) * ITL_MS) / 1000
    for level in (one, two):
        assert level["errors"] == 0 and level["measured"] >= 8
        ttft, itl = level["added_ttft"], level["added_itl"]
        assert ttft["n"] == level["measured"] and ttft["p50"] >= 0 and ttft["p99"] >= ttft["p50"]
        assert itl["n"] == level["measured"] * (OUTPUT_TOKENS - 1)
        # 8 streams, each a request per service time at most
        assert 0 < level["requests_per_s"] <= 8 / service_s * 1.05
        assert level["client_cores"] > 0 and level["streams_per_core"] == pytest.approx(8 / level["client_cores"])
    assert two["client_cores"] > 0  # the runner and both workers counted


def test_selftest_refuses_a_bad_flag_in_one_line(tmp_path: Path) -> None:
    done = kvbench("selftest", "client", "--streams", "many", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--streams" in line and "whole numbers >= 1" in line
