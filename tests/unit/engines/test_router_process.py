"""The router process's python: where it comes from, and the one-line errors when it is unusable."""

from __future__ import annotations

import sys

import pytest

from common.errors import EngineStartError
from harness.engines.router_process import router_python, router_version
from harness.engines.routers import ROUTER_PYTHON_ENV, RouterSpec

SPEC = RouterSpec(kind="vllm-router", policy="round_robin")


def test_python_comes_from_the_scenario_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROUTER_PYTHON_ENV, raising=False)
    with pytest.raises(EngineStartError, match=rf"set routing\.router\.python or \${ROUTER_PYTHON_ENV}"):
        router_python(SPEC)
    monkeypatch.setenv(ROUTER_PYTHON_ENV, "/venv/bin/python")
    assert router_python(SPEC) == "/venv/bin/python"
    assert router_python(SPEC.model_copy(update={"python": "/other/python"})) == "/other/python"


async def test_a_python_without_the_router_is_refused_before_anything_starts() -> None:
    # kvbench's own interpreter: vllm-router lives in its own virtualenv, never beside kvbench
    with pytest.raises(EngineStartError, match=r"cannot run vllm-router \(pip install vllm-router there\)"):
        await router_version(SPEC, sys.executable)
