"""Every run attempt on a GPU engine records its host link in the manifest before any engine starts.

Real processes: the spine (:func:`harness.runs.spine.execute`) runs a probe scenario of kind vLLM
whose python is this interpreter (no torch), on a host whose ``nvidia-smi`` (a script on PATH
printing what a 1-GPU host prints) lists a GPU or none. The engine cannot start (its model
directory does not exist), so the attempt fails; the host link is in its manifest entry anyway,
measured first, with the reason naming torch. A manifest's host links round-trip through the file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from common.errors import RunDirError
from harness.engines.host_link import GpuLink, HostLink
from harness.runs.probe import ProbeRunner
from harness.runs.spine import execute
from harness.scenario.spec import Scenario, parse_scenario
from harness.store.manifest import Manifest, attempt_host_links, read_manifest
from harness.store.rundir import RunDir
from tests.scenarios import stand_in_vllm

ONE_GPU = "printf 'NVIDIA H200, 580.159.04, 143771 MiB, GPU-aaaa\\n'"


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prints: str) -> None:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$1" = topo ] && exit 0\n{prints}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def vllm_scenario(tmp_path: Path) -> Scenario:
    return parse_scenario(
        {
            "name": "host link",
            "engine": stand_in_vllm(tmp_path / "no-model", startup_timeout_s=10),
            "arms": [{"name": "off", "offload": "off"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000]},
        },
        "test",
    )


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self, total: int, done: int, unit: str) -> None: ...
    def describe(self, text: str) -> None: ...
    def note(self, text: str) -> None:
        self.lines.append(text)

    def advance(self, detail: str = "") -> None: ...
    def begin_step(self, label: str, seconds: float) -> None: ...
    def tick(self, elapsed_s: float, detail: str) -> None: ...
    def end_step(self) -> None: ...


async def run_attempt(tmp_path: Path) -> tuple[dict[str, object], list[str]]:
    scenario = vllm_scenario(tmp_path)
    notes = Notes()
    runner = ProbeRunner(scenario, RunDir.create(tmp_path / "runs", scenario), progress=notes)
    await execute(runner)  # the engine cannot start (no model directory): a finding, the attempt still ends
    assert ["did not start" in down.reason for down in runner.run_dir.engines_down()] == [True]
    return read_manifest(runner.run_dir.manifest_file), [line for line in notes.lines if "did not start" not in line]


async def test_a_gpu_host_records_the_attempts_host_link_before_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this interpreter has torch: the probe would measure, not name torch")
    fake_smi(tmp_path, monkeypatch, ONE_GPU)
    manifest, notes = await run_attempt(tmp_path)
    attempt = manifest["attempts"][-1]  # type: ignore[index]
    assert attempt["status"] == "failed"
    link = HostLink.model_validate(attempt["host_link"])
    assert link.python == sys.executable and link.requested_gpus == [0]
    assert link.not_measured is not None and "torch" in link.not_measured
    assert notes == [f"host link not measured: {link.not_measured}"]


async def test_a_host_without_gpus_records_no_host_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch, "true")
    manifest, notes = await run_attempt(tmp_path)
    assert "host_link" not in manifest["attempts"][-1]  # type: ignore[index]
    assert notes == []


def test_host_links_round_trip_per_attempt_and_a_bad_one_names_its_field(tmp_path: Path) -> None:
    scenario = vllm_scenario(tmp_path)
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    gpu = {"index": 0, "name": "NVIDIA H100", "h2d_gbps": 24.5, "d2h_gbps": 25.0, "h2d_concurrent_gbps": 24.0}
    measured = HostLink(
        python="p",
        requested_gpus=[0],
        cuda_visible_devices="3",
        seconds=9.5,
        bytes_per_copy=1 << 30,
        repeats=5,
        torch="2.9.0",
        gpus=[GpuLink.model_validate(gpu)],
        concurrent_aggregate_gbps=24.0,
    )
    first = Manifest.start(run_dir.manifest_file, scenario, None, 1)
    first.record_host_link(measured)
    first.finish("interrupted", "stopped")
    failed = HostLink(python="p", requested_gpus=None, cuda_visible_devices=None, seconds=0.1, not_measured="x")
    Manifest.start(run_dir.manifest_file, scenario, None, 2).record_host_link(failed)
    Manifest.start(run_dir.manifest_file, scenario, None, 3)  # an attempt on a host without GPUs
    data = read_manifest(run_dir.manifest_file)
    assert attempt_host_links(data, "manifest.json") == [measured, failed]
    data["attempts"][0]["host_link"]["gpus"][0]["h2d_gbps"] = "fast"
    run_dir.manifest_file.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match=r"manifest.json: attempts\[0\].host_link.gpus.0.h2d_gbps"):
        attempt_host_links(read_manifest(run_dir.manifest_file), "manifest.json")
