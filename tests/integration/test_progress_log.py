"""``kvbench run`` with its stdout on a pipe (a CI log): plain progress lines arrive while the run goes on.

The run is a real subprocess against the built-in simulator; the test reads its lines as they come and checks
that the first unit's line is there while the run still has most of its requests (and its second arm) ahead.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from pathlib import Path

import pytest

from tests.support import kvbench_process, measured_so_far, write_scenario

pytestmark = pytest.mark.integration

LINE = re.compile(r"^\[\d+:\d\d elapsed, (starting|\d+/\d+ requests), ETA (unknown|\d+:\d\d)\] \S")
TOTAL = 2 * 2 * 3 * 2  # arms x lengths x conversations x turns


def test_progress_lines_reach_a_pipe_while_the_run_goes_on(tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path / "progress.yaml",
        {
            "name": "progress-log",
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
            "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
            "workload": {
                "kind": "multi_round_qa",
                "context_tokens": [1000, 8000],
                "conversations": 3,
                "turns": 2,
                "answer_tokens": 4,
            },
        },
    )
    runs = tmp_path / "runs"
    process = kvbench_process("run", str(scenario), "-o", str(runs))
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    errors: list[str] = []

    def read_errors() -> None:  # stderr drained apart, so neither pipe fills and no stdout line is read elsewhere
        assert process.stderr is not None
        errors.extend(process.stderr)

    threading.Thread(target=read, daemon=True).start()
    error_reader = threading.Thread(target=read_errors, daemon=True)
    error_reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, "the run ended before any unit's line:\n" + "".join(seen)
            seen.append(line)
            if "done: AMG-OFF" in line:
                # read while the run is still going: most requests and the second arm are still to come
                assert process.poll() is None
                assert measured_so_far(runs) < TOTAL // 2
                break
        process.wait(timeout=120)  # not communicate(): it would read stdout too and take lines from the reader
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    while (rest := lines.get(timeout=10)) is not None:
        seen.append(rest)
    error_reader.join(timeout=10)
    err = "".join(errors)
    assert process.returncode in (0, 3), err
    text = "".join(seen)
    assert "\x1b" not in text
    progress = [line.rstrip("\n") for line in seen if line.startswith("[")]
    assert progress and all(LINE.match(line) for line in progress), "\n".join(progress)
    assert "ETA unknown" in progress[0]
    assert any(re.search(r"ETA \d+:\d\d\] done: AMG-OFF 1000 tok t1", line) for line in progress)
    for arm in ("AMG-OFF", "AMG-ON"):
        assert any(line.endswith(f"] {arm}: starting sim engine") for line in progress)
    assert f"{TOTAL}/{TOTAL} requests, ETA 0:00] done: AMG-ON" in progress[-1]
