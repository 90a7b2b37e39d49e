"""A router that cannot run stops the arm before any replica starts (no engine start-up is wasted)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support import probe_in_process


def test_a_python_without_the_router_fails_before_the_replicas_start(tmp_path: Path) -> None:
    expected = r"cannot run vllm-router \(pip install vllm-router there\): a version look-up failed"
    run_dir = probe_in_process(  # the arm ends as a finding (engine_died), not a traceback
        {
            "name": "router-check",
            "seed": 1,
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2},
            # kvbench's own interpreter has no vllm_router: the router lives in its own virtualenv
            "routing": {
                "policy": "external",
                "router": {"kind": "vllm-router", "policy": "round_robin", "python": sys.executable},
            },
            "arms": [{"name": "A", "offload": "cpu"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 1, "turns": 2},
        },
        tmp_path,
    )
    (down,) = run_dir.engines_down()
    assert down.arm == "A" and "did not start" in down.reason and re.search(expected, down.reason), down
    assert not list(run_dir.log_dir("A").glob("replica-*"))  # no replica was started
