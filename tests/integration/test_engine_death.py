"""An engine killed mid-run is a finding in a complete run directory, never a traceback.

``kvbench run`` as a user runs it (a subprocess) on the built-in simulator, which kvbench starts; the test
kill -9's the first arm's simulator process while that arm is measuring. The run must go on to the next arm,
write its summary and reports, say FAILED with the dead engine as the reason, and exit 1.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.scenarios import exponential, multi_round_qa, multi_user_qa, sim_scenario, uniform
from tests.support import kvbench_process, measured_so_far, wait_for, write_scenario

pytestmark = [pytest.mark.integration, pytest.mark.long]


def simulators(pid: int) -> list[int]:
    """The ``kvbench sim serve`` processes that ``pid`` started (its engines)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == pid and b"serve" in argv:
            found.append(int(stat.parent.name))
    return found


def kill_the_first_engine(verb: str, data: dict[str, object], tmp_path: Path, measured: int) -> Path:
    """``kvbench VERB`` of the scenario ``data`` kill -9'd in its first arm's engine once ``measured`` requests are
    recorded; the run must end with exit 1 and no traceback. Its run directory."""
    scenario = write_scenario(tmp_path / f"{verb}.yaml", data)
    runs = tmp_path / "runs"
    run = kvbench_process(verb, str(scenario), "-o", str(runs))
    assert wait_for(lambda: measured_so_far(runs) >= measured and bool(simulators(run.pid)), 120, run), (
        "nothing measured"
    )
    os.kill(simulators(run.pid)[0], signal.SIGKILL)
    out, err = run.communicate(timeout=300)
    assert "Traceback" not in out + err, out + err
    assert run.returncode == 1, out + err
    (run_dir,) = runs.iterdir()
    return run_dir


def test_a_killed_engine_ends_its_arm_as_a_finding_and_the_run_still_reports(tmp_path: Path) -> None:
    workload = multi_round_qa([1000, 2000, 4000, 8000], 3, warmup_requests=1)
    run_dir = kill_the_first_engine("run", sim_scenario("dies", workload), tmp_path, measured=2)
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


def test_an_engine_that_does_not_start_is_a_finding_and_the_run_still_reports(tmp_path: Path) -> None:
    data = {
        "name": "never-starts",
        "engine": {"kind": "vllm", "model": str(tmp_path / "model"), "python": str(tmp_path / "no-such-python")},
        "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 1},
    }
    scenario = write_scenario(tmp_path / "never.yaml", data)
    runs = tmp_path / "runs"
    run = kvbench_process("run", str(scenario), "-o", str(runs))
    out, err = run.communicate(timeout=120)
    assert "Traceback" not in out + err, out + err
    assert run.returncode == 1, out + err
    (run_dir,) = runs.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    died = [f for f in summary["validity"]["findings"] if f["gate"] == "engine_died"]
    assert [f["arm"] for f in died] == ["AMG-OFF", "AMG-ON"], summary["validity"]
    assert all("did not start" in f["message"] for f in died) and "no-such-python" in died[0]["message"], died
    assert summary["validity"]["verdict"] == "failed"
    assert (run_dir / "report" / "ttft_table.md").is_file()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["attempts"][-1]["status"] == "failed"


def load_scenario_data(kind: str) -> dict[str, object]:
    """A two-arm simulator scenario for ``kvbench sweep`` or ``soak`` whose first arm runs long enough to be killed."""
    workload = multi_user_qa(8, uniform(2, 4), uniform(1000, 2000), answer_tokens=8, think_time_s=exponential(0.2))
    data = sim_scenario(
        f"dies-{kind}",
        {**workload, "warmup_requests": 1},
        sweep={"mode": "concurrency", "values": [2, 4], "warmup": 1, "duration": 4, "ramp_up": 1},
        slo={"ttft_ms": 1000, "tpot_ms": 50},
        seed=5,
    )
    if kind == "soak":
        data["sweep"] = {"mode": "concurrency", "values": [2], "ramp_up": 1}
        data["soak"] = {"window": "20s", "interval": "4s", "warmup_intervals": 1}
    return data


@pytest.mark.parametrize("kind", ["sweep", "soak"])
def test_a_killed_engine_under_load_is_a_finding(tmp_path: Path, kind: str) -> None:
    """kill -9 the first arm's simulator while it is under load: the point or window stops at once, FAILED with
    engine_died, and the other arm still runs."""
    run_dir = kill_the_first_engine(kind, load_scenario_data(kind), tmp_path, measured=5)
    events = [json.loads(line) for line in (run_dir / "engine_events.jsonl").read_text().splitlines()]
    assert len(events) == 1 and "exited" in events[0]["reason"], events  # the arm killed first, whichever runs first
    result = json.loads((run_dir / f"{kind}.json").read_text())
    if kind == "sweep":
        assert "engine_died" in json.dumps(result["validity"]), result["validity"]
        records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
        assert {"AMG-OFF", "AMG-ON"} <= {record["arm"] for record in records}  # the other arm measured too
    else:  # a soak measures one arm: the window fails on the death, whatever else it measured
        assert result["verdict"]["verdict"] == "FAIL", result["verdict"]
        assert "the engine died under the window" in " ".join(result["verdict"]["reasons"]), result["verdict"]


def test_a_killed_engine_mid_replay_is_a_finding(tmp_path: Path) -> None:
    """kill -9 the first arm's simulator mid-replay: the arm stops at once (not after the rest of the trace was
    refused), replay.json says FAILED with engine_died, the other arm replays the trace, exit 1."""
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": i * 100, "input_length": 1024, "output_length": 8, "hash_ids": [i, i + 1]} for i in range(80)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    workload = {"kind": "trace", "path": str(trace), "format": "mooncake", "warmup_requests": 1}
    run_dir = kill_the_first_engine("replay", sim_scenario("dies-replay", workload, seed=5), tmp_path, measured=5)
    result = json.loads((run_dir / "replay.json").read_text())
    died = [f for f in result["validity"]["findings"] if f["gate"] == "engine_died"]
    assert result["validity"]["verdict"] == "failed" and [f["arm"] for f in died] == ["AMG-OFF"], result["validity"]
    by_arm = {arm["arm"]: arm for arm in result["results"]}
    assert by_arm["AMG-ON"]["requests"] == len(rows) and by_arm["AMG-ON"]["complete"]
    assert not by_arm["AMG-OFF"]["complete"] and by_arm["AMG-OFF"]["requests"] < len(rows)
    assert "FAILED" in (run_dir / "report" / "replay.md").read_text()
