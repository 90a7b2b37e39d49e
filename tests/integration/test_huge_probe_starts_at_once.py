"""The allowed maximum of conversations starts sending at once, with bounded memory.

``kvbench run`` as a user runs it (a subprocess) on the simulator with 1,000,000 conversations per length (the
maximum a scenario may ask for): the first requests must go out within seconds, and the process must not grow
with the conversation count (each document is built when its conversation is sent, and not kept when a group
is that large).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support import kvbench_argv, kvbench_env
from workloads.config import MAX_COUNT

pytestmark = pytest.mark.integration


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_million_conversations_start_sending_at_once(tmp_path: Path) -> None:
    scenario = tmp_path / "huge.yaml"
    data = {
        "name": "huge",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "AMG-ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [2000],
            "conversations": MAX_COUNT,
            "answer_tokens": 4,
            "warmup_requests": 1,
        },
    }
    scenario.write_text(yaml.safe_dump(data), encoding="utf-8")
    runs = tmp_path / "runs"
    run = subprocess.Popen(
        kvbench_argv("run", str(scenario), "-o", str(runs)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kvbench_env(),
    )
    try:
        deadline = time.monotonic() + 90  # the engine's start is most of it
        sent = 0
        while time.monotonic() < deadline and run.poll() is None and sent < 20:
            records = list(runs.glob("*/records.jsonl"))
            sent = records[0].read_text().count('"measure"') if records else 0
            time.sleep(0.2)
        assert sent >= 20, f"only {sent} requests in 90 s"
        assert rss_mib(run.pid) < 1024
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=120)
