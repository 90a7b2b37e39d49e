"""The allowed maximum of conversations starts sending at once, with bounded memory.

``kvbench run`` as a user runs it (a subprocess) on the simulator with 1,000,000 conversations per length (the
maximum a scenario may ask for): the first requests must go out within seconds, and the process must not grow
with the conversation count (each document is built when its conversation is sent, and not kept when a group
is that large).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.scenarios import multi_round_qa, sim_scenario
from tests.support import kvbench_process, measured_so_far, wait_for, write_scenario
from workloads.config import MAX_COUNT

pytestmark = pytest.mark.integration


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_million_conversations_start_sending_at_once(tmp_path: Path) -> None:
    workload = multi_round_qa([2000], MAX_COUNT, answer_tokens=4, warmup_requests=1)
    data = sim_scenario("huge", workload, arms=[{"name": "AMG-ON", "offload": "cpu"}])
    scenario = write_scenario(tmp_path / "huge.yaml", data)
    runs = tmp_path / "runs"
    run = kvbench_process("run", str(scenario), "-o", str(runs))
    try:  # 90 s: the engine's start is most of it
        assert wait_for(lambda: measured_so_far(runs) >= 20, 90, run), f"only {measured_so_far(runs)} requests"
        assert rss_mib(run.pid) < 1024
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=120)
