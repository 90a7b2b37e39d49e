"""Run directories under hostile conditions, with real processes: a tmpfs that fills mid-run, an output
path that is a file or read-only, and secrets written in the scenario.

Each test runs ``python -m kvbench`` as a subprocess (the CLI a user runs) against the built-in
simulator (started by kvbench, or as a separate ``kvbench sim serve`` endpoint).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from harness.store.records import read_records
from tests import support
from tests.support import simulator, write_scenario

pytestmark = [pytest.mark.integration, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]


def probe_scenario(conversations: int = 2, name: str = "hostile") -> dict[str, object]:
    return {
        "name": name,
        "engine": {"kind": "sim", "model": "tiny", "hardware": "h100-sxm"},
        "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [64, 256],
            "conversations": conversations,
            "warmup_requests": 1,
        },
    }


kvbench = partial(support.kvbench, cwd=ROOT)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write zeros until the filesystem is full; return the filler file."""
    filler = directory / "filler.bin"
    with filler.open("wb", buffering=0) as handle:
        block = b"\0" * 4096
        try:
            while True:
                handle.write(block)
        except OSError:
            pass
    return filler


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error:"), stderr
    return lines[-1]


def test_disk_fills_mid_run(tmp_path: Path, tmpfs: Path) -> None:
    source = write_scenario(tmp_path / "s.yaml", probe_scenario(conversations=12))
    out = tmpfs / "runs"
    out.mkdir()
    filled: list[int] = []

    def fill_when_measuring() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for records in out.glob("*/records.jsonl"):
                lines = records.read_bytes().count(b"\n")
                if lines >= 8:
                    filled.append(lines)
                    fill(tmpfs)
                    return
            time.sleep(0.02)

    watcher = threading.Thread(target=fill_when_measuring)
    watcher.start()
    done = kvbench("run", str(source), "-o", str(out))
    watcher.join()
    assert filled, "the run ended before records.jsonl had 8 lines"
    assert done.returncode != 0
    line = one_error_line(done.stderr)
    assert "No space left on device" in line, line
    (run_dir,) = out.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    attempt = manifest["attempts"][-1]
    assert attempt["status"] == "failed"
    assert "No space left on device" in attempt["reason"]
    assert not list(run_dir.rglob("*.tmp"))
    kept = list(read_records(run_dir / "records.jsonl"))
    assert len(kept) >= filled[0]  # what was measured before the disk filled stays readable

    (tmpfs / "filler.bin").unlink()
    resumed = kvbench("run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    records = list(read_records(run_dir / "records.jsonl"))  # every line valid: nothing glued to a torn one
    assert (run_dir / "records.jsonl").read_bytes().endswith(b"\n")
    measured = {(r.arm, r.context_tokens, r.conversation, r.turn) for r in records if r.phase == "measure"}
    assert len(measured) == 2 * 2 * 12 * 2
    assert json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))["attempts"][-1]["status"] == "completed"
    assert kvbench("report", str(run_dir)).returncode == 0


def test_output_directory_is_a_file(tmp_path: Path) -> None:
    source = write_scenario(tmp_path / "s.yaml", probe_scenario())
    target = tmp_path / "not-a-dir"
    target.write_text("x", encoding="utf-8")
    done = kvbench("run", str(source), "-o", str(target))
    assert done.returncode != 0
    assert "is a file" in one_error_line(done.stderr)


def test_output_directory_is_read_only(tmp_path: Path, tmpfs: Path) -> None:
    source = write_scenario(tmp_path / "s.yaml", probe_scenario())
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    done = kvbench("run", str(source), "-o", str(tmpfs / "runs"))
    assert done.returncode != 0
    assert "Read-only file system" in one_error_line(done.stderr)


def test_secrets_in_the_scenario_never_reach_the_run_directory(tmp_path: Path) -> None:
    password = "s3cretPassw0rdXYZ"
    settings = {
        "model": "llama-3.1-8b",
        "hardware": "h100-sxm",
        "offload": {"name": "cpu", "tiers": [{"kind": "cpu", "capacity_gb": 64}]},
    }
    config = tmp_path / "sim.json"
    config.write_text(json.dumps(settings))
    with simulator(tmp_path, "--config", str(config)) as url:
        port = int(url.rsplit(":", 1)[1])
        data: dict[str, object] = {
            "name": "secret [bold]names[/]",
            "engine": {
                "kind": "openai",
                "model": "llama-3.1-8b",
                "base_url": f"http://bench:{password}@127.0.0.1:{port}",
            },
            "arms": [{"name": "AMG-ON", "offload": "cpu"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [64], "conversations": 1, "warmup_requests": 1},
        }
        source = write_scenario(tmp_path / "secret.yaml", data)
        out = tmp_path / "runs"
        done = kvbench("run", str(source), "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert password not in done.stdout + done.stderr
        assert "secret [bold]names[/]" in done.stdout  # printed literally, not as markup
        (run_dir,) = out.iterdir()
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        for path in run_dir.rglob("*"):
            if path.is_file():
                assert password.encode() not in path.read_bytes(), path
        for name in ("manifest.json", "scenario.yaml", "records.jsonl"):
            assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
        assert "bench:***@127.0.0.1" in (run_dir / "scenario.yaml").read_text(encoding="utf-8")

        # resuming takes the secret back from the unchanged original file ...
        resumed = kvbench("run", "--resume", str(run_dir))
        assert resumed.returncode == 0, resumed.stderr
        # ... and refuses one that changed since
        data["seed"] = 99
        write_scenario(source, data)
        refused = kvbench("run", "--resume", str(run_dir))
        assert refused.returncode != 0
        assert "has changed since the run started" in one_error_line(refused.stderr)
    assert os.path.exists(run_dir / "summary.json")


def test_manifest_records_failure_on_a_full_disk(tmp_path: Path, tmpfs: Path) -> None:
    from harness.scenario.spec import parse_scenario
    from harness.store.manifest import Manifest

    scenario = parse_scenario(probe_scenario(), "test")
    manifest = Manifest.start(tmpfs / "manifest.json", scenario, None, 0)
    fill(tmpfs)
    with pytest.raises(OSError):  # the disk really is full: not even a small new file fits
        (tmpfs / "probe.tmp").write_bytes(b"x" * 8192)
    (tmpfs / "probe.tmp").unlink(missing_ok=True)
    manifest.finish("failed", "cannot write to RUN_DIR: No space left on device " + "x" * 400)
    stored = json.loads((tmpfs / "manifest.json").read_text(encoding="utf-8"))
    assert stored["attempts"][-1]["status"] == "failed"
    assert stored["attempts"][-1]["reason"].startswith("cannot write to RUN_DIR: No space left on device")
    assert len(stored["attempts"][-1]["reason"]) <= 300
    assert not list(tmpfs.glob("*.tmp"))
