"""``between_turns: auto`` asks for no reset an engine kind cannot do alone (SGLang's flush empties HiCache's host
pool, TensorRT-LLM has none) and resets where it can: the kinds table decides, never the endpoint's luck."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from harness.runs.probe import ProbeRunner
from harness.runs.spine import ArmSession
from harness.scenario.spec import parse_scenario
from harness.store.rundir import RunDir


class Session:
    """The part of an :class:`ArmSession` the reset uses: its arm, and a reset that counts its calls."""

    def __init__(self, arm: object) -> None:
        self.arm = arm
        self.resets = 0

    async def reset_prefix_cache(self, *, required: bool) -> bool:
        self.resets += 1
        return True


def runner(tmp_path: Path, engine: dict[str, Any]) -> ProbeRunner:
    scenario = parse_scenario(
        {
            "name": "auto",
            "engine": engine,
            "arms": [{"name": "OFF", "offload": "hbm"}, {"name": "ON", "offload": "cpu"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [4000]},
        },
        "s.yaml",
    )
    return ProbeRunner(scenario, RunDir.create(tmp_path, scenario))


@pytest.mark.parametrize(
    ("engine", "refused", "why"),
    [
        ({"kind": "sglang", "model": "/m/qwen", "load_format": "dummy"}, {"ON"}, "flush_cache also empties HiCache"),
        ({"kind": "trtllm", "model": "/m/llama"}, {"OFF", "ON"}, "no endpoint that drops its GPU prefix cache"),
        ({"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, set(), ""),
    ],
)
async def test_auto_resets_only_where_the_engine_kind_drops_the_gpu_cache_alone(
    tmp_path: Path, engine: dict[str, Any], refused: set[str], why: str
) -> None:
    probe = runner(tmp_path, engine)
    for arm in probe.scenario.arms:
        session = Session(arm)
        answer = await probe._reset_refused(cast(ArmSession, session))
        if arm.name in refused:
            assert answer is not None and why in answer and session.resets == 0
        else:
            assert answer is None and session.resets == 1
