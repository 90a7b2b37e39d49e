"""An engine killed mid-run is a finding in a complete run directory, never a traceback.

``kvbench run`` as a user runs it (a subprocess) on the built-in simulator, which kvbench starts; the test
kill -9's the first arm's simulator process while that arm is measuring. The run must go on to the next arm,
write its summary and reports, say FAILED with the dead engine as the reason, and exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support import kvbench_argv, kvbench_env

pytestmark = pytest.mark.integration


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_engine_ends_its_arm_as_a_finding_and_the_run_still_reports(tmp_path: Path) -> None:
    scenario = tmp_path / "dies.yaml"
    data = {
        "name": "dies",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [1000, 2000, 4000, 8000],
            "conversations": 3,
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
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and run.poll() is None:
        records = list(runs.glob("*/records.jsonl"))
        if records and records[0].read_text().count('"measure"') >= 2:
            engines = children(run.pid)
            if engines:
                killed = engines[0]
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    assert killed is not None, "the first arm never measured"
    out, err = run.communicate(timeout=300)
    assert "Traceback" not in out + err, out + err
    assert run.returncode == 1, out + err
    (run_dir,) = runs.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    died = [f for f in summary["validity"]["findings"] if f["gate"] == "engine_died"]
    assert summary["validity"]["verdict"] == "failed" and [f["arm"] for f in died] == ["AMG-OFF"], summary["validity"]
    assert "exited" in died[0]["message"]
    assert {cell["arm"] for cell in summary["cells"]} >= {"AMG-ON"}  # the next arm still measured
    assert (run_dir / "report" / "ttft_table.md").is_file()
    events = [json.loads(line) for line in (run_dir / "engine_events.jsonl").read_text().splitlines()]
    assert [event["arm"] for event in events] == ["AMG-OFF"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["attempts"][-1]["status"] == "failed"
