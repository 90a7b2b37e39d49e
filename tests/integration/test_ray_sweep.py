"""``kvbench sweep --ray ADDRESS --workers 2`` on a local Ray cluster against one ``kvbench sim serve``.

One cluster for the module (``ray start --head --block``, stopped by SIGTERM to that one process): starting Ray
takes several seconds on 2 cores. The sweep's shards run as two Ray actors, each its own ``kvbench sweep --shard
I/2`` streamed back to the driver, and the driver writes one run directory: its records must be the union of the
shards' streamed records, each keeping its shard, and its percentiles the ones computed in one pass over those
records; ``workers.json`` names the worker of each shard. A worker killed mid-run is a finding of a complete run
directory (INCONCLUSIVE, exit 3), not a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from harness.engines.process import free_port
from harness.results.sweep_metrics import quantiles
from harness.store.records import read_records
from tests.support import (
    LOADED_CLIENT_LIMITS,
    SimulatorLauncher,
    attached_sweep_args,
    kvbench_argv,
    kvbench_env,
    wait_for,
)

# a Ray cluster's own processes (GCS, raylet, workers) take about half a core of the 2-core CI machine: beside the
# simulator's timed tests they starved them (a 10 s probe start took over 120 s), so scripts/test.sh runs this module
# beside the unit tier, which times nothing that would fail for it
pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1", "--offload", "off")
RAY_START_S = 90.0
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
"""The test cluster and its drivers skip Ray's token authentication (2.60 needs RAY_AUTH_MODE=token on a driver that
connects by address to a cluster with tokens): nothing but this machine's loopback reaches them."""


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray head with 2 CPUs, this checkout on its workers' PYTHONPATH; its address."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'kvbench[ray]')")
    ray_cli = shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the ray command is not on PATH")
    port = free_port()
    while 10002 <= port <= 19999:  # Ray's worker ports
        port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="kvray"))  # short: Ray's socket paths must fit in 107 bytes
    log = (folder / "ray.log").open("wb")
    argv = [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=2", f"--temp-dir={folder}"]
    argv += ["--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats"]
    head = subprocess.Popen(
        argv,
        env=kvbench_env(**RAY_ENV, RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper="true"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + RAY_START_S
        while b"will now block" not in (folder / "ray.log").read_bytes():
            assert head.poll() is None, (folder / "ray.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (folder / "ray.log").read_text()[-3000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def ray_argv(base_url: str, address: str, out: Path, loads: str) -> list[str]:
    return kvbench_argv(
        *attached_sweep_args(
            base_url,
            loads,
            "--set",
            "sweep.drain_timeout=2s",
            *LOADED_CLIENT_LIMITS,
            "--ray",
            address,
            "--workers",
            "2",
            "-o",
            str(out),
        )
    )


def test_two_ray_workers_make_one_run(tmp_path: Path, simulator: SimulatorLauncher, ray_address: str) -> None:
    with simulator(*SERVE) as base_url:
        done = subprocess.run(
            ray_argv(base_url, ray_address, tmp_path / "out", "2,3"),
            env=kvbench_env(**RAY_ENV),
            capture_output=True,
            text=True,
            timeout=400,
        )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr
    (run,) = (tmp_path / "out").iterdir()

    # every shard's streamed run directory, each a shard of 2 with only its own records
    shards = [run / "shards" / str(index) for index in range(2)]
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards]
    for index, records in enumerate(raw):
        assert records and {record.shard for record in records} == {index}
        assert json.loads((shards[index] / "manifest.json").read_text())["shard"]["count"] == 2

    # the run directory: the union of the shards' records, each keeping its shard
    united = list(read_records(run / "records.jsonl"))
    assert sorted(r.request_id for r in united) == sorted(r.request_id for records in raw for r in records)
    origin = {r.request_id: r.shard for records in raw for r in records}
    assert all(r.shard == origin[r.request_id] for r in united)

    # its load points are the whole load, their percentiles one pass over both shards' raw records
    result = json.loads((run / "sweep.json").read_text())
    assert [p["load"] for p in result["points"]] == [2.0, 3.0]
    for point in result["points"]:
        measured = [r for records in raw for r in records if r.point == point["point"] and r.phase == "measure"]
        assert point["measured"] == len(measured) > 0
        one_pass = quantiles(pd.Series([r.ttft_ns for r in measured if r.ok], dtype="float64"))
        assert one_pass is not None
        assert (point["ttft"]["n"], point["ttft"]["p50_ms"], point["ttft"]["p99_ms"]) == (
            one_pass.n,
            one_pass.p50_ms,
            one_pass.p99_ms,
        )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["merged"]["verdict"] == "valid", manifest["merged"]["findings"]
    assert [s["records"] for s in manifest["merged"]["shards"]] == [len(records) for records in raw]

    # the provenance: which worker ran each shard, its clock against the driver's
    workers = json.loads((run / "workers.json").read_text())
    assert workers["schema_version"] == 1 and workers["address"] == ray_address
    assert [w["shard"] for w in workers["workers"]] == [0, 1]
    for worker in workers["workers"]:
        assert worker["end"] == "completed" and worker["exit_code"] == 0 and worker["error"] is None
        assert worker["hostname"] and worker["node_id"] and worker["actor_id"] and worker["pid"] > 0
        assert abs(worker["clock_offset_s"]) <= worker["clock_rtt_s"] + 0.5  # one host: one clock
        assert worker["bytes_streamed"] > 0
    assert len({w["actor_id"] for w in workers["workers"]}) == 2


def test_a_worker_that_dies_is_a_finding(tmp_path: Path, simulator: SimulatorLauncher, ray_address: str) -> None:
    out = tmp_path / "out"
    with simulator(*SERVE) as base_url:
        driver = subprocess.Popen(
            ray_argv(base_url, ray_address, out, "2,3"),
            env=kvbench_env(**RAY_ENV),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines = []
        assert driver.stdout is not None
        for line in driver.stdout:  # "worker 1: on HOST (actor ID, pid PID), clock ..."
            lines.append(line)
            if line.startswith("worker 1: on "):
                pid = int(line.split("pid ")[1].split(")")[0])
                break
        else:
            pytest.fail("".join(lines)[-3000:])
        # a load generator on a schedule: not at the nice 15 Ray gives its workers by default
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0
        # once shard 1 has streamed its first finished point, kill its Ray actor's process, as the OOM killer would
        assert wait_for(lambda: any(out.glob("*/shards/1/points.jsonl")), 180, driver), "".join(lines)[-3000:]
        os.kill(pid, signal.SIGKILL)
        rest, _ = driver.communicate(timeout=300)
    output = "".join(lines) + rest
    assert driver.returncode == 3, output[-3000:]
    assert "Traceback" not in output
    (run,) = out.iterdir()
    manifest = json.loads((run / "manifest.json").read_text())
    findings = manifest["merged"]["findings"]
    assert manifest["merged"]["verdict"] == "inconclusive"
    assert any(f.startswith("shard 1: its Ray worker on ") and " died " in f for f in findings), findings
    assert any("point 1: shards 1 did not finish it" in f for f in findings), findings
    workers = json.loads((run / "workers.json").read_text())["workers"]
    assert [(w["shard"], w["end"]) for w in workers] == [(0, "completed"), (1, "died")]
    # a complete run directory: the point both shards finished, with every record either streamed
    result = json.loads((run / "sweep.json").read_text())
    assert [p["load"] for p in result["points"]] == [2.0]
    kept = list(read_records(run / "records.jsonl"))
    assert {r.shard for r in kept} == {0, 1}
    streamed = [list(read_records(run / "shards" / str(index) / "records.jsonl")) for index in range(2)]
    assert sorted(r.request_id for r in kept) == sorted(r.request_id for records in streamed for r in records)
    assert "INCONCLUSIVE" in output
