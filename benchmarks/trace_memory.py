"""Peak memory and time of ``kvbench trace stats`` over a large synthetic Bailian agent trace.

Writes a Bailian trace of ``--lines`` calls (about 200 bytes a line, as a production trace's lines run: 1,000,000
lines are about 200 MB), then runs ``kvbench trace stats FILE --json`` as a child process and prints its wall
time and peak resident set size (``ru_maxrss`` of the child, MiB). The trace: sessions of 8 turns, a session
starting every 80 ms, turn t of a session t * 5 s after its start; every call's prompt is 4 blocks shared by all
sessions (a system prompt) and the session's own blocks, one more per turn, so a turn's prefix is the turn
before it (its parent):

    hash_ids(session s, turn t) = [1, 2, 3, 4] + [9 * s + 1000 + k for k in 0..t]   (16-token blocks)

    python benchmarks/trace_memory.py --lines 1000000 --trace /tmp/trace-1m.jsonl

An analysis, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

TURNS = 8
SHARED = [1, 2, 3, 4]
BLOCK_TOKENS = 16


def write_trace(path: Path, lines: int) -> int:
    """Write ``lines`` calls to ``path`` in arrival order; return the file's size in bytes."""
    calls: list[tuple[float, int, int]] = []
    sessions = -(-lines // TURNS)
    for session in range(sessions):
        for turn in range(1, TURNS + 1):
            if len(calls) < lines:
                calls.append((session * 0.08 + (turn - 1) * 5.0, session, turn))
    calls.sort()
    with path.open("w", encoding="utf-8") as out:
        for stamp, session, turn in calls:
            ids = SHARED + [9 * session + 1000 + k for k in range(turn + 1)]
            record = {
                "chat_id": f"{session}-{turn}",
                "parent_chat_id": -1 if turn == 1 else f"{session}-{turn - 1}",
                "timestamp": round(stamp, 3),
                "input_length": len(ids) * BLOCK_TOKENS - 5,
                "output_length": 60,
                "type": "text",
                "turn": turn,
                "hash_ids": ids,
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--trace", type=Path, default=Path("/tmp/kvbench-trace-memory.jsonl"))
    parser.add_argument("--keep", action="store_true", help="reuse the trace file when it exists")
    args = parser.parse_args()
    if not (args.keep and args.trace.exists()):
        size = write_trace(args.trace, args.lines)
        print(f"wrote {args.trace}: {args.lines:,} lines, {size / 1e6:.0f} MB")
    argv = [sys.executable, "-m", "kvbench", "trace", "stats", str(args.trace), "--json"]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
    if done.returncode != 0:
        print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    else:
        stats = json.loads(done.stdout)
        print(f"requests {stats['requests']:,}, infinite-cache hit rate {stats['infinite_cache_hit_rate']:.3f}")
    print(f"kvbench trace stats: {wall:.1f} s wall, peak RSS {peak_mib:.0f} MiB (exit {done.returncode})")


if __name__ == "__main__":
    main()
