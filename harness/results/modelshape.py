"""A run's model architecture from its ``config.json``: layers, KV heads, head size, dtype.

Real engines are pointed at a model directory; kvbench builds ``synth:SHAPE`` directories itself
(:mod:`harness.engines.modeldir`), so for those the config is known without the directory, and
for a user's directory it is read from ``DIR/config.json`` when this machine has it. KV bytes per
token follow as ``2 x layers x kv_heads x head_dim x dtype bytes`` (see
:func:`offload.analytical.kv_bytes_per_token`).
"""

from __future__ import annotations

from pathlib import Path

from common.jsonfile import JsonProblem, parse_json
from harness.engines.modeldir import SHAPES, SYNTH_PREFIX, shape_config


def hf_config(ref: str) -> tuple[dict[str, object] | None, str]:
    """(config.json as a mapping, where it came from) -- or (None, why not) for a model reference."""
    if ref.startswith(SYNTH_PREFIX):
        shape = ref.removeprefix(SYNTH_PREFIX)
        if shape not in SHAPES:
            return None, f"unknown model shape {shape!r} in {ref!r}"
        return dict(shape_config(shape)), f"config.json of {ref} (kvbench's synthetic shape)"
    path = Path(ref) / "config.json"
    try:
        data = parse_json(path.read_bytes())
    except OSError as error:
        return None, f"{path}: cannot read the model shape ({error.strerror})"
    except JsonProblem as error:
        return None, f"{path}: not JSON ({error})"
    if not isinstance(data, dict):
        return None, f"{path}: not a JSON object"
    return data, str(path)
