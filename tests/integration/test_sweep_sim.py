"""A real, short ``kvbench sweep`` on the simulator: two arms, two loads, curves, SLO and GPUs saved.

The engine is the simulator process (Llama-3.1-8B on one H100) with its HBM squeezed to ~22k tokens
of KV (gpu_memory_utilization 0.25), so that at 8 active users the users' histories no longer fit:
AMG-OFF (GPU prefix cache only) must recompute returning users, AMG-ON finds them in its CPU tier.
Each window's energy comes from the simulator's power model, labelled simulated. About 45 s on 2 cores.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from harness.results.sweep_result import SweepResult
from harness.sim.power import POWER
from harness.store.records import read_records
from tests.support import kvbench, kvbench_scenario

pytestmark = pytest.mark.integration

SCENARIO = {
    "name": "it-sweep",
    "engine": {
        "kind": "sim",
        "model": "llama-3.1-8b",
        "hardware": "h100-sxm",
        "gpu_memory_utilization": 0.25,
    },
    "arms": [{"name": "AMG-OFF", "offload": "hbm"}, {"name": "AMG-ON", "offload": "cpu"}],
    "compare": {"baseline": "AMG-OFF"},
    "workload": {
        "kind": "multi_user_qa",
        "users": 16,
        "rounds": {"dist": "uniform", "low": 3, "high": 6},
        "system_prompt_tokens": 300,
        "context_tokens": {"dist": "uniform", "low": 2500, "high": 3500},
        "question_tokens": 30,
        "answer_tokens": 16,
        "think_time_s": {"dist": "exponential", "mean": 0.3},
        "warmup_requests": 1,
    },
    "sweep": {"mode": "concurrency", "values": [2, 8], "warmup": 2, "duration": 5, "ramp_up": 1},
    "slo": {"ttft_ms": 300, "tpot_ms": 40, "percentile": 90},
    "cost": {"target_rps": 50, "usd_per_gpu_hour": 2.0},
    "seed": 4,
}


def test_sweep_on_the_simulator_draws_both_arms_with_slo_and_gpus_saved(tmp_path: Path) -> None:
    done, run_dir = kvbench_scenario("sweep", SCENARIO, tmp_path)
    assert "GPUs saved by AMG-ON vs AMG-OFF" in done.stdout
    result = SweepResult.read_file(run_dir / "sweep.json")
    assert result.complete and result.requests.errors == 0
    assert [(p.arm, p.load) for p in result.points] == [("AMG-OFF", 2), ("AMG-OFF", 8), ("AMG-ON", 2), ("AMG-ON", 8)]
    for p in result.points:
        assert p.measured >= 10 and p.rps > 0 and p.tps_user_mean is not None and p.ttft_round1 is not None
        assert 4.5 < p.window_s < 5.5 and p.max_in_flight <= p.load

    off, on = result.point("AMG-OFF", 8), result.point("AMG-ON", 8)
    assert off is not None and on is not None and off.ttft_later is not None and on.ttft_later is not None
    # 8 users' histories overflow the squeezed HBM: OFF recomputes them, ON loads them from its CPU tier
    assert on.hit_rate is not None and off.hit_rate is not None and on.hit_rate > off.hit_rate + 0.3
    assert on.external_hit_rate is not None and on.external_hit_rate > 0.2
    assert not off.external_hit_rate
    assert on.ttft_later.p50_ms < 0.7 * off.ttft_later.p50_ms
    # the prefill model sits beside every common load, for the arm with a tier
    assert [(c.arm, c.load) for c in result.analytical] == [("AMG-ON", 2), ("AMG-ON", 8)]
    high = result.analytical[1]
    assert high.inputs.a_tier > 0.3 and high.measured_speedup is not None and high.measured_speedup > 1.3
    assert high.regime in ("compute-bound", "io-bound", "write-bound")
    assert result.savings and result.savings[0].target_rps == 50

    # every window's GPU energy, from the simulator's power model and labelled so (harness/sim/power.py)
    for p in result.points:
        e = p.energy
        assert e is not None and e.source == "simulated" and e.method == "model" and e.label == "simulated"
        assert e.avg_watts is not None and POWER["h100-sxm"].idle_w < e.avg_watts <= POWER["h100-sxm"].tdp_w
        assert e.generated_tokens is not None and e.prompt_tokens is not None and e.joules is not None
        assert e.joules_per_generated_token == pytest.approx(e.joules / e.generated_tokens)
        assert e.agents_per_kw == pytest.approx(p.load / (e.avg_watts / 1000))
    few, many = result.point("AMG-OFF", 2), result.point("AMG-OFF", 8)
    assert few is not None and many is not None and few.energy is not None and many.energy is not None
    assert many.energy.avg_watts is not None and few.energy.avg_watts is not None
    assert many.energy.avg_watts > few.energy.avg_watts  # four times the users keep the GPU busier
    table = (run_dir / "report" / "capacity.md").read_text()
    # Markdown escapes the headers' parentheses
    assert r"J/gen tok \(simulated\)" in table and r"users/kW \(simulated\)" in table and "Energy (simulated)" in table

    # every request is on disk with its point, load, user and round
    records = list(read_records(run_dir / "records.jsonl"))
    measured = [r for r in records if r.phase == "measure"]
    assert len(measured) == sum(p.measured for p in result.points)
    assert all(r.point is not None and r.load in (2, 8) and r.user is not None for r in measured)
    assert {r.turn for r in measured} >= {1, 2, 3}
    points = [json.loads(line) for line in (run_dir / "points.jsonl").read_text().splitlines()]
    assert len(points) == 4 and all(p["metrics"] for p in points)

    # the curves come back from the stored files alone
    report = run_dir / "report"
    for name in ("capacity.svg", "ttft_p99.svg", "sweep.csv", "capacity.md"):
        assert (report / name).stat().st_size > 0
    before = (report / "sweep.csv").read_text()
    (run_dir / "sweep.json").unlink()
    rebuilt = kvbench("sweep", "--report", str(run_dir), cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (report / "sweep.csv").read_text() == before
    with (report / "sweep.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 4
