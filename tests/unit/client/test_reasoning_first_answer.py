"""Reasoning models: TTFT is the first token of any kind; the first answer token is kept beside it.

A real local server streams reasoning deltas, waits, then content; the record keeps both times, and the
probe's summary and Markdown show the time to first answer token only where reasoning came first.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.results.aggregate import summarize_run_dir
from harness.store.rundir import RunDir
from reports.renderers import answer_markdown
from tests.resultfiles import make_probe_run
from tests.unit.client.test_client import FakeServer, Script, run_chat, server

__all__ = ["server"]  # the local server fixture, shared with the client's other tests

NS = 1_000_000_000


def chunk(delta: dict[str, str]) -> bytes:
    payload = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


async def test_the_first_answer_token_comes_after_the_reasoning(server: FakeServer) -> None:
    script = Script(
        pieces=[
            (0.0, chunk({"role": "assistant"})),
            (0.05, chunk({"reasoning_content": "Let me think."})),
            (0.0, chunk({"reasoning_content": " Still thinking."})),
            (0.25, chunk({"content": "The answer"})),
            (0.0, chunk({"content": " is 4."})),
            (0.0, b"data: [DONE]\n\n"),
        ]
    )
    outcome = await run_chat(server, script)
    assert outcome.ok and outcome.text == "The answer is 4."
    assert outcome.ttft_ns is not None and outcome.first_content_ns is not None
    assert 0.04 * NS <= outcome.ttft_ns < 0.25 * NS  # the first reasoning token
    assert outcome.first_content_ns - outcome.ttft_ns >= 0.2 * NS  # the answer came after the reasoning


async def test_without_reasoning_the_first_answer_token_is_the_first_token(server: FakeServer) -> None:
    script = Script(
        pieces=[(0.0, chunk({"role": "assistant"})), (0.05, chunk({"content": "4"})), (0.0, b"data: [DONE]\n\n")]
    )
    outcome = await run_chat(server, script)
    assert outcome.ok and outcome.first_content_ns == outcome.ttft_ns


def test_the_summary_shows_the_first_answer_token_only_where_reasoning_came_first(tmp_path: Path) -> None:
    run_dir = RunDir.open(make_probe_run(tmp_path))
    assert all(cell.answer is None for cell in summarize_run_dir(run_dir).cells)
    assert answer_markdown(summarize_run_dir(run_dir)) == ""
    lines = []
    for line in run_dir.records_file.read_text().splitlines():
        record = json.loads(line)
        if record["arm"] == "AMG-ON" and record["ttft_ns"] is not None:
            record["first_content_ns"] = record["ttft_ns"] + 300_000_000  # 300 ms of reasoning first
            record["e2e_ns"] += 300_000_000  # the answer, and so the request, ends that much later
        lines.append(json.dumps(record))
    run_dir.records_file.write_text("\n".join(lines) + "\n")
    result = summarize_run_dir(run_dir)
    reasoned = [cell for cell in result.cells if cell.answer is not None]
    assert reasoned and {cell.arm for cell in reasoned} == {"AMG-ON"}
    for cell in reasoned:
        assert cell.ttft is not None and cell.answer is not None
        assert abs(cell.answer.median_ms - cell.ttft.median_ms - 300) < 1
    section = answer_markdown(result)
    assert section.startswith("## Time to first answer token") and "AMG-OFF" not in section
