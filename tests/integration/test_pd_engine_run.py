"""``kvbench run`` on engine kind ``vllm-pd`` end to end, with a stand-in vLLM python (:mod:`tests.fakes.pd_vllm`)
whose servers are :mod:`tests.fakes.pd_engine` processes speaking vLLM's P/D protocol.

Everything else is kvbench's own: the engine starts both sides with the command lines and kv-transfer-configs it
renders (a side whose command line has no P/D connector, or the wrong role, exits at once), then its proxy; the
probe's client, resets and /metrics scrapes go through the proxy; ``pd-breakdown.json`` and the report's
``pd-breakdown.md`` take each cell's TTFT apart, and the parts sum to the client's TTFT with nothing flagged
(the stand-in transfers ``tokens x 131072`` bytes, the KV of a Llama-3.1-8B token in bf16).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from harness.results.pd_breakdown import PdBreakdownResult
from reports.outputs import report_html
from tests.fakes.pd_vllm import PREFILL_S
from tests.scenarios import exponential, multi_user_qa, uniform
from tests.support import REPO, kvbench_scenario

pytestmark = pytest.mark.integration

FAKE_VLLM = REPO / "tests" / "fakes" / "pd_vllm.py"
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def fake_python(tmp_path: Path) -> Path:
    wrapper = tmp_path / "venv" / "bin" / "python"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n', encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def engine(tmp_path: Path, colocated: list[str]) -> dict[str, object]:
    return {
        "kind": "vllm-pd",
        "model": "synth:llama-3.1-8b",
        "python": str(fake_python(tmp_path)),
        "max_model_len": 4096,
        "prefill": {"gpus": [0]},
        "decode": {"gpus": [1]},
        "colocated_arms": colocated,
        "env": {"FAKE_PD_KV_BYTES": str(KV_BYTES_PER_TOKEN)},
        "startup_timeout_s": 120,
    }


def test_a_pd_probe_runs_through_the_proxy_and_takes_its_ttft_apart(tmp_path: Path) -> None:
    scenario = {
        "name": "pd-fake",
        "engine": engine(tmp_path, ["COLO-OFF"]),
        "arms": [
            {"name": "COLO-OFF", "offload": "hbm"},
            {"name": "PD-OFF", "offload": "hbm"},
            {
                "name": "PD-CPU",
                "offload": {"name": "native-1g", "backend": "native", "tiers": [{"kind": "cpu", "capacity_gb": 1}]},
            },
        ],
        "compare": {"baseline": "COLO-OFF"},
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [300],
            "conversations": 2,
            "turns": 2,
            "question_tokens": 8,
            "answer_tokens": 4,
            "warmup_requests": 0,
            "between_turns": {"mode": "reset_prefix_cache"},
        },
        "repetitions": 1,
        "seed": 3,
    }
    done, run_dir = kvbench_scenario("run", scenario, tmp_path, timeout=600)

    manifest = json.loads((run_dir / "manifest.json").read_text())
    details = manifest["engines"]["PD-CPU"]["details"]
    assert details["kv_bytes_per_tok"] == str(KV_BYTES_PER_TOKEN) and details["kv_link_gbps"] == "900"
    assert "MultiConnector" in manifest["engines"]["PD-CPU"]["command"][-1] or "MultiConnector" in " ".join(
        manifest["engines"]["PD-CPU"]["command"]
    )
    assert "OffloadingConnector" in details["decode_command"] or "NixlPushConnector" in details["decode_command"]
    assert "MultiConnector" not in details["decode_command"]  # the tier is the prefill side's only

    result = PdBreakdownResult.read_file(run_dir / PdBreakdownResult.FILE_NAME)
    assert {row.arm for row in result.rows} == {"PD-OFF", "PD-CPU"}
    assert {row.group for row in result.rows} == {"300 tok, turn 1", "300 tok, turn 2"}
    for row in result.rows:
        assert row.matched == row.requests == 2, row
        assert row.parts.total_ms() == pytest.approx(row.client_ttft_ms)
        assert row.parts.prefill_ms == pytest.approx(1000 * PREFILL_S)  # the stand-in prefill side's histogram
        assert row.transfer is not None and row.transfer.expected_bytes == pytest.approx(row.transfer.bytes)
        assert row.flags == [], row.flags
    assert (run_dir / "report" / "pd-breakdown.md").is_file()
    page = report_html([run_dir], out=tmp_path / "case.html").read_text(encoding="utf-8")
    assert "Decode admission" in page and "biased low when transfers overlap" in page  # the table and its note
    assert "P/D: where TTFT goes" in done.stdout
    assert "vLLM P/D 0.26.0+fake, 2× GPU" in done.stdout  # both sides' GPUs
    colocated = manifest["engines"]["COLO-OFF"]
    assert "--kv-transfer-config" not in colocated["command"] and "kv_bytes_per_tok" not in colocated["details"]


def test_a_pd_sweep_takes_each_load_points_ttft_apart(tmp_path: Path) -> None:
    scenario = {
        "name": "pd-fake-sweep",
        "engine": engine(tmp_path, []),
        "arms": [{"name": "PD-OFF", "offload": "hbm"}],
        "workload": multi_user_qa(
            4, uniform(2, 3), uniform(200, 400), answer_tokens=4, think_time_s=exponential(0.2), warmup_requests=0
        ),
        "sweep": {"mode": "concurrency", "values": [2], "warmup": 1, "duration": 5, "ramp_up": 0.2},
        "seed": 5,
    }
    _, run_dir = kvbench_scenario("sweep", scenario, tmp_path, timeout=600)
    result = PdBreakdownResult.read_file(run_dir / PdBreakdownResult.FILE_NAME)
    (row,) = result.rows
    assert (row.arm, row.group) == ("PD-OFF", "load 2")
    assert row.matched == row.requests > 0
    assert row.parts.total_ms() == pytest.approx(row.client_ttft_ms)
    assert row.transfer is not None and row.transfer.expected_bytes == pytest.approx(row.transfer.bytes)
    assert row.flags == [], row.flags
