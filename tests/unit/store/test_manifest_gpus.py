"""The manifest names every GPU (name, driver, memory, UUID), their topology and the GPU variables in force.

``nvidia-smi`` is replaced by a script on PATH that prints what a 2-GPU host prints, so the parsing
of its real output format is what is tested.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.store.manifest import gpu_environment, gpu_facts, gpu_topology

FAKE_SMI = """#!/bin/sh
if [ "$1" = "topo" ]; then
  printf '\\033[4m\\tGPU0\\tGPU1\\033[0m\\nGPU0\\t X \\tNV18\\nGPU1\\tNV18\\t X \\n'
  exit 0
fi
printf 'NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, GPU-aaaa\\n'
printf 'NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, GPU-bbbb\\n'
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE_SMI)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")


def test_every_gpu_with_its_uuid_and_the_topology(fake_smi: None) -> None:
    gpus = gpu_facts()
    assert [gpu["uuid"] for gpu in gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert gpus[0] == {
        "name": "NVIDIA H100 80GB HBM3",
        "driver": "580.159.04",
        "memory": "81559 MiB",
        "uuid": "GPU-aaaa",
    }
    topology = gpu_topology()
    assert topology is not None and "NV18" in topology
    assert "\x1b" not in topology and topology.startswith("\tGPU0\tGPU1\n")  # nvidia-smi's underline escapes dropped


def test_the_multicast_switches_are_recorded_as_in_force() -> None:
    environ = {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HOME": "/root",
    }
    assert gpu_environment(environ) == {k: v for k, v in environ.items() if k != "HOME"}
