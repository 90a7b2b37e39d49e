"""A run stopped by SIGTERM leaves a result file and reports that show what it measured, not an earlier attempt's.

``kvbench run`` as a user runs it (a subprocess) against the built-in simulator, which kvbench starts and stops.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from harness.store.records import read_records
from tests.scenarios import multi_round_qa, sim_scenario
from tests.support import kvbench, kvbench_argv, kvbench_env, measured_so_far, wait_for, write_scenario

pytestmark = pytest.mark.integration


def test_a_stopped_run_writes_its_result_and_reports_from_the_records_it_kept(tmp_path: Path) -> None:
    workload = multi_round_qa([1000, 2000, 4000, 8000], 4, warmup_requests=1)
    scenario = write_scenario(tmp_path / "stopped.yaml", sim_scenario("stopped", workload))
    runs = tmp_path / "runs"
    first = subprocess.Popen(
        kvbench_argv("run", str(scenario), "-o", str(runs)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kvbench_env(),
    )
    wait_for(lambda: measured_so_far(runs) >= 3, 120, first, poll_s=0.05)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 2, out + err
    (run_dir,) = runs.iterdir()
    assert f"kvbench run --resume {run_dir}" in out + err

    kept = [r for r in read_records(run_dir / "records.jsonl") if r.phase == "measure" and r.ok]
    assert kept and len(kept) < 2 * 4 * 4 * 2  # stopped part-way
    summary = json.loads((run_dir / "summary.json").read_text())
    cells = {(c["arm"], c["context_tokens"], c["turn"]) for c in summary["cells"]}
    assert {(r.arm, r.context_tokens, r.turn) for r in kept} <= cells
    assert (run_dir / "report" / "ttft_table.md").is_file()

    resumed = kvbench("run", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    done = json.loads((run_dir / "summary.json").read_text())
    assert len(done["cells"]) == 2 * 4 * 2 and len(done["cells"]) > len(summary["cells"])
