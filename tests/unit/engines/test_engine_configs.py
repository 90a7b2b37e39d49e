"""What the launched engines' configs (vLLM, SGLang, TensorRT-LLM) share, tested once for each kind: the fleet
alias ``parallelism.replicas``, and which python an engine runs (the config's, else ``$KVBENCH_<KIND>_PYTHON``,
else this interpreter). Each kind's config is its render test's (``tests/unit/engines/test_render_<kind>.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from harness.engines import sglang, vllm
from harness.engines.replicas import ReplicaFields
from tests.unit.engines.test_render_sglang import sglang_config
from tests.unit.engines.test_render_trtllm import trtllm_config
from tests.unit.engines.test_render_vllm import vllm_config


@pytest.mark.parametrize("config", [vllm_config, sglang_config, trtllm_config], ids=["vllm", "sglang", "trtllm"])
def test_parallelism_replicas_is_the_alias_of_replicas(config: Callable[..., ReplicaFields]) -> None:
    # parallelism.replicas is the alias of engine.replicas: a fleet of two, not an error
    assert config(parallelism={"replicas": 2}).fleet_size == 2
    with pytest.raises(ValidationError, match="disagree"):
        config(parallelism={"replicas": 2}, replicas=3)


@pytest.mark.parametrize(
    ("env_var", "python_of", "installed"),
    [
        (vllm.PYTHON_ENV_VAR, lambda python: vllm.resolve_python(vllm_config(python=python)), "/opt/vllm/bin/python"),
        (
            sglang.PYTHON_ENV_VAR,
            lambda python: sglang.resolve_python(sglang_config(python=python)),
            "/opt/sglang/bin/python",
        ),
    ],
    ids=["vllm", "sglang"],
)
def test_the_engine_runs_the_configs_python_else_the_environments_else_this_one(
    env_var: str, python_of: Callable[[str | None], str], installed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(env_var, raising=False)
    assert python_of(None) == sys.executable
    monkeypatch.setenv(env_var, installed)
    assert python_of(None) == installed
    assert python_of("/explicit/python") == "/explicit/python"
