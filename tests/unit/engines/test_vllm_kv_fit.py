"""A vLLM engine whose ``max_model_len`` is longer than its fixed KV cache (``num_gpu_blocks_override`` x block
size) is refused when the scenario is read: by ``kvbench validate`` and by ``kvbench run`` before any engine starts,
naming the file, the field and the longest length allowed (vLLM itself refuses it only after loading the
model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.errors import ScenarioError
from harness.engines.configs import VLLM_DEFAULT_BLOCK_SIZE
from harness.scenario.spec import bundled_scenarios, load_scenario
from tests.support import kvbench


def vllm_scenario(tmp_path: Path, **engine: object) -> Path:
    """The bundled GPU agentic scenario (vLLM, 6,000 blocks) with ``engine`` fields replaced."""
    data = yaml.safe_load(bundled_scenarios()["gpu-agentic-llama8b"].read_text(encoding="utf-8"))
    data["engine"].update(engine)
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("engine", "tokens"),
    [
        ({"num_gpu_blocks_override": 3000, "max_model_len": 65536}, 3000 * VLLM_DEFAULT_BLOCK_SIZE["cuda"]),
        ({"num_gpu_blocks_override": 100, "block_size": 64, "max_model_len": 8192}, 100 * 64),
        ({"device": "cpu", "num_gpu_blocks_override": 10, "max_model_len": 2048}, 10 * VLLM_DEFAULT_BLOCK_SIZE["cpu"]),
    ],
)
def test_a_max_model_len_over_the_kv_cache_names_file_field_and_maximum(
    tmp_path: Path, engine: dict[str, object], tokens: int
) -> None:
    path = vllm_scenario(tmp_path, **engine)
    with pytest.raises(ScenarioError) as error:
        load_scenario(str(path))
    header, problem = str(error.value).splitlines()  # the scenario's usual form: the file, then the field
    assert header.startswith(f"{path}: invalid scenario")
    assert problem.startswith("  - engine.max_model_len: longer than the KV cache")
    assert f"= {tokens} tokens); allowed: at most {tokens}" in problem and f"(got {engine['max_model_len']})" in problem


def test_an_unset_max_model_len_is_the_synth_shapes_positions(tmp_path: Path) -> None:
    data = yaml.safe_load(vllm_scenario(tmp_path).read_text(encoding="utf-8"))
    del data["engine"]["max_model_len"]  # synth:llama-3.1-8b: 131,072 positions > 6,000 x 16 = 96,000 tokens
    path = tmp_path / "unset.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ScenarioError) as error:
        load_scenario(str(path))
    (problem,) = [line for line in str(error.value).splitlines() if "engine.max_model_len" in line]
    assert "unset, and the model's 131072 positions are longer than the KV cache" in problem
    assert "allowed: at most 96000" in problem


def test_a_max_model_len_that_fits_exactly_is_accepted(tmp_path: Path) -> None:
    scenario, _ = load_scenario(str(vllm_scenario(tmp_path, num_gpu_blocks_override=4096, max_model_len=65536)))
    assert scenario.engine.kind == "vllm" and scenario.engine.max_model_len == 65536


def test_every_bundled_vllm_scenario_still_validates() -> None:
    checked = 0
    for path in bundled_scenarios().values():
        scenario, _ = load_scenario(path)
        checked += scenario.engine.kind == "vllm"
    assert checked >= 5


def test_validate_and_run_refuse_it_before_any_engine_starts(tmp_path: Path) -> None:
    path = vllm_scenario(tmp_path, num_gpu_blocks_override=3000)  # 48,000 tokens for a 65,536-token max_model_len
    checked = kvbench("validate", str(path), cwd=tmp_path)
    assert checked.returncode == 2
    header, problem = checked.stderr.strip().splitlines()
    assert str(path) in header and "engine.max_model_len" in problem and "allowed: at most 48000" in problem
    ran = kvbench("run", str(path), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    assert ran.returncode == 2 and "allowed: at most 48000" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and not (tmp_path / "runs").exists()
