"""The GPU tier's smoke test: on a GPU machine the manifest's host facts list the GPUs ``nvidia-smi`` sees.

A run directory's manifest is what ``kvbench compare`` reads to refuse a comparison across hardware,
so on a GPU host it must name every GPU. ``nvidia-smi -L`` (one ``GPU i: NAME (UUID: ...)`` line a
GPU) is the independent reference. Marker ``gpu``: skipped where ``nvidia-smi -L`` lists none.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from harness.store.manifest import host_facts

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def test_manifest_host_facts_name_every_gpu() -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    names = re.findall(r"^GPU \d+: (.+?) \(UUID", listed, flags=re.MULTILINE)
    assert names, listed
    gpus = host_facts()["gpus"]
    assert [gpu["name"] for gpu in gpus] == names
    assert all(gpu["driver"] and gpu["memory"].endswith("MiB") for gpu in gpus), gpus
