"""Building blocks of the scenarios the tests write: the built-in simulator's engine, the usual AMG-OFF/AMG-ON
arms and the workloads' distributions, each a new dict per call so a test may change what it gets.

A scenario's numbers (contexts, users, rounds, loads) stay in the test that chooses them: these only spell the
parts every simulator test repeats, in the scenario file's own keys.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def off_on_arms(off: str = "off") -> list[dict[str, object]]:
    """AMG-OFF (offload ``off``: "off", or "hbm" for the GPU-only profile) then AMG-ON on the CPU tier."""
    return [{"name": "AMG-OFF", "offload": off}, {"name": "AMG-ON", "offload": "cpu"}]


def stand_in_vllm(model: Path, **fields: object) -> dict[str, object]:
    """A ``vllm`` engine of the model directory ``model`` run by this interpreter, so that the test decides which
    ``vllm`` it imports (a stand-in package, or none), with any other engine ``fields``."""
    return {"kind": "vllm", "model": str(model), "python": sys.executable, **fields}


def sim_scenario(
    name: str,
    workload: Mapping[str, object],
    *,
    arms: list[dict[str, object]] | None = None,
    engine: Mapping[str, object] | None = None,
    **fields: object,
) -> dict[str, object]:
    """The scenario ``name`` on the built-in simulator (llama-3.1-8b on an H100 SXM, plus ``engine``'s keys) with
    ``arms`` (:func:`off_on_arms` unless given), ``workload`` and any other top-level ``fields``."""
    return {
        "name": name,
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", **(engine or {})},
        "arms": off_on_arms() if arms is None else arms,
        "workload": dict(workload),
        **fields,
    }


def multi_round_qa(context_tokens: list[int], conversations: int, **fields: object) -> dict[str, object]:
    """A ``multi_round_qa`` workload: ``conversations`` per context length, with any other workload ``fields``."""
    return {"kind": "multi_round_qa", "context_tokens": context_tokens, "conversations": conversations, **fields}


def multi_user_qa(users: int, rounds: object, context_tokens: object, **fields: object) -> dict[str, object]:
    """A ``multi_user_qa`` workload of ``users`` users, each ``rounds`` rounds over ``context_tokens`` of context
    (numbers or distributions), with any other workload ``fields``."""
    return {"kind": "multi_user_qa", "users": users, "rounds": rounds, "context_tokens": context_tokens, **fields}


def uniform(low: float, high: float) -> dict[str, object]:
    """A workload distribution: uniform between ``low`` and ``high``."""
    return {"dist": "uniform", "low": low, "high": high}


def fixed(value: float) -> dict[str, object]:
    """A workload distribution that is always ``value``."""
    return {"dist": "fixed", "value": value}


def exponential(mean: float) -> dict[str, object]:
    """A workload distribution: exponential with ``mean``."""
    return {"dist": "exponential", "mean": mean}


def squeezed_gpu_ab(name: str, workload: Mapping[str, object], seed: int) -> dict[str, object]:
    """AMG-OFF (the GPU alone, the baseline) against AMG-ON (the CPU tier) on a simulator whose GPU holds only
    1,000 KV blocks, so that the workload's reuse outgrows it."""
    return sim_scenario(
        name,
        workload,
        arms=off_on_arms("hbm"),
        engine={"num_gpu_blocks_override": 1000},
        compare={"baseline": "AMG-OFF"},
        seed=seed,
    )
