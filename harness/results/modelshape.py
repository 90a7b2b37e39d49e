"""A run's model architecture from its ``config.json``: layers, KV heads, head size, dtype.

Real engines are pointed at a model directory; kvbench builds ``synth:SHAPE`` directories itself
(:mod:`harness.engines.modeldir`), so for those the config is known without the directory, and
for a user's directory it is read from ``DIR/config.json`` when this machine has it. KV bytes per
token follow as ``2 x layers x kv_heads x head_dim x dtype bytes`` (see
:func:`offload.analytical.kv_bytes_per_token`).
"""

from __future__ import annotations

import json
from pathlib import Path

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
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        return None, f"{path}: cannot read the model shape ({error.strerror})"
    except ValueError as error:
        return None, f"{path}: not JSON ({error})"
    if not isinstance(data, dict):
        return None, f"{path}: not a JSON object"
    return data, str(path)
