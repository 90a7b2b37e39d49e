"""Which flags each flags-only command takes (``kvbench run|sweep|replay --base-url URL``): one table.

The command line (:mod:`kvbench.cli.runs`) declares one option per field named here and
:mod:`harness.scenario.flags` checks and reads them; this module imports nothing heavy so the command
line can read it at start-up. A field's flag is its name with dashes: ``answer_tokens`` -> ``--answer-tokens``
(Typer's own naming of a parameter).
"""

from __future__ import annotations

from typing import Literal

FlagKind = Literal["probe", "sweep", "replay"]

ENDPOINT_FIELDS = ("base_url", "offload", "baseline", "model", "api_key_env", "tokenizer")
"""The fields every flags-only command takes: which endpoint, what it offloads, how to reach it."""
WORKLOAD_FIELDS: dict[FlagKind, tuple[str, ...]] = {
    "probe": ("contexts", "conversations", "turns", "answer_tokens", "gpu_kv_tokens"),
    "sweep": ("concurrency", "duration", "warmup", "contexts", "conversations", "turns", "answer_tokens"),
    "replay": ("trace",),
}
"""The workload fields each command takes, in the order its help lists them."""
ALL_WORKLOAD_FIELDS = tuple(dict.fromkeys(field for fields in WORKLOAD_FIELDS.values() for field in fields))


def flag_of(field: str) -> str:
    """The flag of a field: ``api_key_env`` -> ``--api-key-env``."""
    return "--" + field.replace("_", "-")
