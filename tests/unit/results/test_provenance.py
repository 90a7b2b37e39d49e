"""Every figure says where it came from: measured on a named engine and hardware, or simulated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.results.provenance import measured_on_attached_endpoint, provenance

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


def manifest(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name / "manifest.json").read_text())
    return data


def test_a_gpu_run_names_engine_versions_and_gpus() -> None:
    origin = provenance(manifest("gpu-llama8b-lmcache-h100"))
    assert origin.origin == "measured"
    assert origin.label == "measured: vLLM 0.26.0 + LMCache 0.5.3, 1× NVIDIA H100 80GB HBM3"


def test_a_simulated_run_says_it_is_not_a_measurement() -> None:
    origin = provenance(manifest("sweep-qwen3-14b-sim"))
    assert origin.origin == "simulated"
    assert "kvbench simulator" in origin.label and "qwen3-14b on 1× h100-sxm" in origin.label
    assert origin.label.endswith("not a measurement")


def test_gpu_count_is_the_engines_parallelism() -> None:
    data = manifest("gpu-llama8b-lmcache-h100")
    data["scenario"]["engine"]["parallelism"] = {"tp": 4, "pp": 1, "dp": 1, "replicas": 1}
    assert provenance(data).label.endswith("4× NVIDIA H100 80GB HBM3")


def test_an_attached_endpoint_reports_the_declared_hardware() -> None:
    data = {
        "scenario": {"engine": {"kind": "openai", "model": "m", "hardware": "8x H100 staging"}},
        "engines": {"ON": {"kind": "openai", "version": "0.9.1"}},
        "host": {"gpus": []},
    }
    origin = provenance(data)
    assert origin.origin == "measured" and "hardware declared as 8x H100 staging" in origin.label


def test_an_attached_endpoint_that_is_kvbench_s_simulator_is_simulated() -> None:
    details = {"base_url": "http://127.0.0.1:8000", "served_by": "kvbench-sim"}
    data: dict[str, Any] = {
        "scenario": {"engine": {"kind": "openai", "model": "llama-3.1-8b", "base_url": "http://127.0.0.1:8000"}},
        "engines": {"endpoint": {"kind": "openai", "version": "0.1.0", "details": details}},
        "host": {"gpus": []},
    }
    origin = provenance(data)
    assert origin.origin == "simulated" and origin.label.endswith("not a measurement")
    assert "kvbench simulator attached at http://127.0.0.1:8000, llama-3.1-8b" in origin.label
    assert not measured_on_attached_endpoint(data)
    data["engines"]["endpoint"]["details"] = {"base_url": "http://127.0.0.1:8000"}  # any other server
    assert provenance(data).origin == "measured" and measured_on_attached_endpoint(data)


def test_a_cpu_engine_and_an_unknown_manifest() -> None:
    data = {
        "scenario": {"engine": {"kind": "vllm", "model": "synth:tiny", "device": "cpu"}},
        "engines": {"ON": {"kind": "vllm", "version": "0.32.0"}},
        "host": {"cpu_count": 2, "gpus": []},
    }
    assert provenance(data).label == "measured: vLLM 0.32.0, CPU (2 cores)"
    assert provenance({}).origin == "unknown"


def test_setups_differ_when_model_dtype_hardware_or_engine_differ() -> None:
    gpu = provenance(manifest("gpu-llama8b-lmcache-h100"))
    sim = provenance(manifest("quickstart-sim"))
    assert gpu.setup != sim.setup
    assert provenance(manifest("quickstart-sim")).setup == sim.setup
