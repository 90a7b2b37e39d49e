"""Flags-only ``kvbench replay --base-url URL --trace FILE`` tells the trace's format from its first line, as
``kvbench trace stats`` does (it read every trace as Mooncake before, so a Bailian trace failed on its 16-token
hash ids), and a file of no known format is one line naming the formats allowed.

A real ``kvbench sim serve`` endpoint; a 6-call Bailian trace written here (two sessions of three turns).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import SimulatorLauncher, kvbench

pytestmark = pytest.mark.integration


def bailian_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for turn in range(1, 4):
        for session in range(2):
            ids = [1, 2] + [100 * session + 10 + k for k in range(turn)]
            rows.append(
                {
                    "chat_id": f"s{session}-t{turn}",
                    "parent_chat_id": -1 if turn == 1 else f"s{session}-t{turn - 1}",
                    "timestamp": round(0.2 * len(rows), 3),
                    "input_length": 16 * len(ids) - 3,
                    "output_length": 4,
                    "type": "text",
                    "turn": turn,
                    "hash_ids": ids,
                }
            )
    return rows


def test_a_bailian_trace_replays_from_flags(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    trace = tmp_path / "bailian.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in bailian_rows()))
    with simulator() as base_url:
        done = kvbench("replay", "--base-url", f"{base_url}/v1", "--trace", str(trace), "-o", "runs", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode in (0, 3), output[-3000:]
    assert "Traceback" not in output
    (run_dir,) = (tmp_path / "runs").iterdir()
    stored = json.loads((run_dir / "trace.json").read_text())
    assert stored["format"] == "bailian" and stored["block_tokens"] == 16 and stored["requests"] == 6


def test_a_trace_of_no_known_format_is_one_line(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    trace = tmp_path / "unknown.jsonl"
    trace.write_text(json.dumps({"when": 0, "prompt": "hi"}) + "\n")
    with simulator() as base_url:  # an endpoint that answers, so the trace is what the error is about
        done = kvbench("replay", "--base-url", f"{base_url}/v1", "--trace", str(trace), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [text for text in done.stderr.splitlines() if text.strip()]
    assert f"{trace}:1: cannot tell the trace format" in line
    assert "mooncake, kvbench, bailian, claude-code, tokens, text" in line
