"""A trace is read as a stream: memory grows with what the trace keeps, not with the file's text and parsed JSON.

Before, the whole file was read, split, decoded and parsed into dicts before any request was made (a 1,000,000-line
agent trace of 188 MB peaked at 2.75 GB in ``kvbench trace stats``, about 2,500 bytes of Python heap per line); now
each line is parsed, turned into its call and dropped, block ids are shared objects, and the ceilings replay one
call's blocks at a time. The bound below is per line, measured with ``tracemalloc`` on a generated Bailian trace
(``benchmarks/trace_memory.py`` measures the 1,000,000-line case end to end).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from workloads.trace import load_trace, trace_stats

LINES = 4000
TURNS = 8
MAX_BYTES_PER_LINE = 1200
"""Peak heap per trace line while loading and while computing the statistics (about 770 measured; 2,500 before)."""


def bailian_trace(path: Path) -> Path:
    """Sessions of 8 turns, a session every 80 ms, each turn's prompt its parent's plus one block."""
    calls = sorted(
        (session * 0.08 + (turn - 1) * 5.0, session, turn)
        for session in range(LINES // TURNS)
        for turn in range(1, TURNS + 1)
    )
    with path.open("w") as out:
        for stamp, session, turn in calls:
            ids = [1, 2, 3, 4] + [9 * session + 1000 + k for k in range(turn + 1)]
            row = {
                "chat_id": f"{session}-{turn}",
                "parent_chat_id": -1 if turn == 1 else f"{session}-{turn - 1}",
                "timestamp": round(stamp, 3),
                "input_length": len(ids) * 16 - 5,
                "output_length": 60,
                "type": "text",
                "turn": turn,
                "hash_ids": ids,
            }
            out.write(json.dumps(row) + "\n")
    return path


def test_loading_and_statistics_stay_within_a_bound_per_line(tmp_path: Path) -> None:
    path = bailian_trace(tmp_path / "bailian.jsonl")
    tracemalloc.start()
    try:
        trace = load_trace(path, "auto")
        loaded = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        stats = trace_stats(trace)
        computed = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert trace.format == "bailian" and len(trace.requests) == LINES
    assert stats.shape is not None and stats.shape.depth_max == TURNS  # parents resolved from the stream
    assert loaded / LINES < MAX_BYTES_PER_LINE, f"load: {loaded / LINES:.0f} bytes per line"
    assert computed / LINES < MAX_BYTES_PER_LINE, f"stats: {computed / LINES:.0f} bytes per line"


def test_equal_block_ids_are_one_object(tmp_path: Path) -> None:
    trace = load_trace(bailian_trace(tmp_path / "bailian.jsonl"), "auto")
    mentions = [block for request in trace.requests for block in request.hash_ids or ()]
    assert all(isinstance(block, int) for block in mentions)
    first: dict[object, object] = {}  # the first object of each id value (ints over 256 are not cached by Python)
    assert all(first.setdefault(block, block) is block for block in mentions)
    assert len(first) < len(mentions) / 3  # every turn repeats its parent's ids
