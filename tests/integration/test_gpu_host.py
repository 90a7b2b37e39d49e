"""The GPU tier's smoke test: on a GPU machine the manifest's host facts list the GPUs ``nvidia-smi`` sees.

A run directory's manifest is what ``kvbench compare`` reads to refuse a comparison across hardware,
so on a GPU host it must name every GPU. ``nvidia-smi -L`` (one ``GPU i: NAME (UUID: ...)`` line a
GPU) is the independent reference, for the host-link probe's GPUs too. Marker ``gpu``: skipped where
``nvidia-smi -L`` lists none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness.engines.host_link import measure_host_link
from harness.store.manifest import host_facts

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def test_manifest_host_facts_name_every_gpu() -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    names = re.findall(r"^GPU \d+: (.+?) \(UUID", listed, flags=re.MULTILINE)
    assert names, listed
    gpus = host_facts()["gpus"]
    assert [gpu["name"] for gpu in gpus] == names
    assert all(gpu["driver"] and gpu["memory"].endswith("MiB") for gpu in gpus), gpus


def test_the_host_link_probe_measures_every_gpu_that_nvidia_smi_lists() -> None:
    """Needs a python with CUDA torch: $KVBENCH_VLLM_PYTHON (the engine's), else this one."""
    python = os.environ.get("KVBENCH_VLLM_PYTHON") or sys.executable
    has_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120, check=False)
    if has_torch.returncode != 0:
        pytest.skip(f"{python} cannot import torch")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    names = re.findall(r"^GPU \d+: (.+?) \(UUID", listed, flags=re.MULTILINE)
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        pytest.skip("CUDA_VISIBLE_DEVICES hides some of the GPUs nvidia-smi lists")
    link = measure_host_link(python, None, mib=256, repeats=3, timeout_s=300)
    assert link.not_measured is None, link.not_measured
    assert [gpu.name for gpu in link.gpus] == names
    assert all(gpu.h2d_gbps > 0 and gpu.d2h_gbps > 0 and gpu.h2d_concurrent_gbps > 0 for gpu in link.gpus)
