"""Two shards of one sweep against one ``kvbench sim serve``, started together by ``--start-at``, then merged.

The shards are two ``kvbench sweep --shard I/2`` processes, as two pods would run them. The merge must give a run
whose records are the union of the shards' (each keeping its shard), whose load points are the whole load (3 and
4 users, split 2+1 and 2+2), and whose percentiles equal the ones computed in one pass over the shards' own
records; the shards' directories stay as they were. A merge of shards that did not run together is INCONCLUSIVE
(exit 3) naming them; a set of shards that is not one run is refused (exit 2).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from harness.results.sweep_metrics import quantiles
from harness.store.records import read_records
from tests.support import SimulatorLauncher, kvbench, kvbench_argv, kvbench_env, wait_for

pytestmark = pytest.mark.integration

MERGE_JOB = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "shards" / "merge" / "job.yaml"

SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1", "--offload", "off")
LOADS = (3, 4)
START_IN_S = 25
"""--start-at this far ahead: both shards must have started, confirmed the endpoint and warmed up by then (on a
loaded 2-core machine that takes over 10 s); a shard that is late starts at once and the merge judges it."""


def shard_argv(base_url: str, index: int, out: Path, start_at: float | None) -> list[str]:
    argv = kvbench_argv(
        "sweep",
        "--base-url",
        f"{base_url}/v1",
        "--offload",
        "off",
        "--concurrency",
        ",".join(map(str, LOADS)),
        "--duration",
        "3s",
        "--warmup",
        "1s",
        "--contexts",
        "1000",
        "--turns",
        "2",
        "--answer-tokens",
        "4",
        "--set",
        "sweep.drain_timeout=2s",
        # what these tests prove is the merge; on a loaded 2-core CI machine two shard clients beside a simulator
        # fall tens of ms behind their schedule, which the client gate (tested in test_client_limited.py) judges
        "--set",
        "validity.max_client_send_lag_ms=2000",
        "--set",
        "validity.max_client_loop_delay_ms=2000",
        "--shard",
        f"{index}/2",
        "-o",
        str(out),
    )
    return argv + (["--start-at", f"{start_at:.3f}"] if start_at is not None else [])


def run_shards(base_url: str, tmp_path: Path, start_at: float | None, name: str) -> list[Path]:
    """Both shards at once (``start_at`` given) or one after the other (None); their run directories."""
    outs = [tmp_path / f"{name}-{index}" for index in range(2)]
    if start_at is None:
        for index, out in enumerate(outs):
            done = subprocess.run(
                shard_argv(base_url, index, out, None), env=kvbench_env(), capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    else:
        processes = [
            subprocess.Popen(
                shard_argv(base_url, index, out, start_at),
                env=kvbench_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index, out in enumerate(outs)
        ]
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, (stdout + stderr)[-3000:]
    return [next(out.iterdir()) for out in outs]


def digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_two_shards_merge_into_the_whole_sweep(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    with simulator(*SERVE) as base_url:
        shards = run_shards(base_url, tmp_path, time.time() + START_IN_S, "shard")
    before = [digest(shard) for shard in shards]
    merged = tmp_path / "merged-cli"
    done = kvbench("merge", *map(str, shards), "-o", str(merged), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [digest(shard) for shard in shards] == before  # the merge only reads the shards

    # each shard: its part of each load point recorded, its clock, disjoint sessions
    manifests = [json.loads((shard / "manifest.json").read_text()) for shard in shards]
    assert [m["manifest_version"] for m in manifests] == [3, 3]
    shares = [[(s["load"], s["share"]) for s in m["shard"]["shares"]] for m in manifests]
    assert shares == [[(3.0, 2.0), (4.0, 2.0)], [(3.0, 1.0), (4.0, 2.0)]]
    assert all(m["attempts"][-1]["clock"]["server_offset_s"] is not None for m in manifests)
    assert manifests[0]["prompt_salt"] == manifests[1]["prompt_salt"]
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards]
    for index, records in enumerate(raw):
        assert records and {record.shard for record in records} == {index}
    conversations = [{r.conversation for r in records if r.point is not None} for records in raw]
    assert conversations[0] and conversations[1] and not conversations[0] & conversations[1]

    # records: the union of the shards' (same requests, each with its shard)
    united = list(read_records(merged / "records.jsonl"))
    assert sorted(r.request_id for r in united) == sorted(r.request_id for records in raw for r in records)
    origin = {r.request_id: r.shard for records in raw for r in records}
    assert all(r.shard == origin[r.request_id] for r in united)

    # load points: the whole load, every request of both shards counted
    result = json.loads((merged / "sweep.json").read_text())
    assert [p["load"] for p in result["points"]] == [float(load) for load in LOADS]
    for point in result["points"]:
        measured = [r for records in raw for r in records if r.point == point["point"] and r.phase == "measure"]
        assert point["measured"] == len(measured) > 0
        # the percentiles of one pass over both shards' raw records, exactly
        ok = pd.Series([r.ttft_ns for r in measured if r.ok], dtype="float64")
        one_pass = quantiles(ok)
        assert one_pass is not None
        assert (point["ttft"]["n"], point["ttft"]["p50_ms"], point["ttft"]["p90_ms"], point["ttft"]["p99_ms"]) == (
            one_pass.n,
            one_pass.p50_ms,
            one_pass.p90_ms,
            one_pass.p99_ms,
        )
    manifest = json.loads((merged / "manifest.json").read_text())
    assert manifest["merged"]["verdict"] == "valid", manifest["merged"]["findings"]
    assert [s["records"] for s in manifest["merged"]["shards"]] == [len(records) for records in raw]

    # a read of the merged run gives the same figures and leaves the shards alone
    report = kvbench("report", str(merged), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads(report.stdout)["points"] == result["points"]
    assert [digest(shard) for shard in shards] == before

    # the Kubernetes merge Job's command line finds the shards where the Indexed Job's pods write them
    # (RESULTS/RUN/shard-I/RUN_DIR) and makes the same run
    (container,) = yaml.safe_load(MERGE_JOB.read_text())["spec"]["template"]["spec"]["containers"]
    shell, flag, script = container["command"]
    local = script.replace("exec kvbench", f"exec {shlex.join(kvbench_argv())}", 1).replace("/results", str(tmp_path))
    job = subprocess.run(
        [shell, flag, local], env=kvbench_env(KVBENCH_RUN="."), capture_output=True, text=True, timeout=300
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert json.loads((tmp_path / "merged.json").read_text())["points"] == result["points"]

    # not one run: a shard twice, or one alone
    twice = kvbench("merge", str(shards[0]), str(shards[0]), "-o", str(tmp_path / "twice"), cwd=tmp_path)
    assert twice.returncode == 2 and "given twice" in twice.stderr
    alone = kvbench("merge", str(shards[1]), "-o", str(tmp_path / "alone"), cwd=tmp_path)
    assert alone.returncode == 2 and "shards 0 of 0..1 missing" in alone.stderr


def test_shards_that_did_not_run_together_are_inconclusive(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    with simulator(*SERVE) as base_url:
        shards = run_shards(base_url, tmp_path, None, "apart")
    done = kvbench("merge", *map(str, shards), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 3, (done.stdout + done.stderr)[-3000:]
    assert "shard 0 (ends first) and shard 1 (starts last)" in done.stderr + done.stdout


def test_a_shard_that_stopped_is_named_and_the_merge_inconclusive(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    outs = [tmp_path / f"part-{index}" for index in range(2)]
    with simulator(*SERVE) as base_url:
        start = time.time() + START_IN_S
        whole, cut = (
            subprocess.Popen(
                shard_argv(base_url, index, out, start),
                env=kvbench_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index, out in enumerate(outs)
        )

        def first_point_done() -> bool:
            return any(path.read_text().strip() for path in outs[1].glob("*/points.jsonl"))

        # shard 1 finishes the first load point, then is stopped (Ctrl-C) in the second
        assert wait_for(first_point_done, 120, cut), cut.communicate()[1][-3000:]
        cut.send_signal(signal.SIGINT)
        cut.communicate(timeout=120)
        stdout, stderr = whole.communicate(timeout=300)
        assert whole.returncode == 0, (stdout + stderr)[-3000:]
        shards = [next(out.iterdir()) for out in outs]
        done = kvbench("merge", *map(str, shards), "-o", str(tmp_path / "merged"), cwd=tmp_path)
        said = done.stdout + done.stderr
        assert done.returncode == 3, said[-3000:]
        assert "INCONCLUSIVE" in said and f"shard 1 ({shards[1]}) ended interrupted" in said
        assert "point 1: shards 1 did not finish it" in said
        result = json.loads((tmp_path / "merged" / "sweep.json").read_text())
        assert [p["load"] for p in result["points"]] == [float(LOADS[0])]  # the point both shards ran, whole

        # the stopped shard resumes as the same shard (its manifest says which), but alone, so its second point
        # does not overlap the other shard's: the merge says so
        again = kvbench("sweep", "--resume", str(shards[1]), "--shard", "1/2", cwd=tmp_path)
        assert again.returncode == 2 and "--resume keeps the shard" in again.stderr
        resumed = kvbench("sweep", "--resume", str(shards[1]), cwd=tmp_path)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    later = [r for r in read_records(shards[1] / "records.jsonl") if r.attempt == 1 and r.point is not None]
    assert later and all(r.shard == 1 and r.conversation % 2 == 1 for r in later)
    done = kvbench("merge", *map(str, shards), "-o", str(tmp_path / "merged-again"), cwd=tmp_path)
    assert done.returncode == 3 and "point 1: the measured windows of shard" in done.stdout + done.stderr


def test_two_shards_of_a_replay_merge_into_the_whole_trace(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    rows = [
        {
            "chat_id": f"s{session}-t{turn}",
            "parent_chat_id": -1 if turn == 1 else f"s{session}-t{turn - 1}",
            "timestamp": round(0.1 * (4 * (turn - 1) + session), 3),
            "input_length": 16 * (turn + 2) - 3,
            "output_length": 4,
            "type": "text",
            "turn": turn,
            "hash_ids": [1, 2] + [100 * session + 10 + k for k in range(turn)],
        }
        for turn in range(1, 4)
        for session in range(4)
    ]
    trace = tmp_path / "bailian.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    outs = [tmp_path / f"replay-{index}" for index in range(2)]
    with simulator(*SERVE) as base_url:
        start = time.time() + START_IN_S
        argv = [
            [
                *kvbench_argv("replay", "--base-url", f"{base_url}/v1", "--trace", str(trace), "-o", str(out)),
                "--shard",
                f"{index}/2",
                "--start-at",
                f"{start:.3f}",
            ]
            for index, out in enumerate(outs)
        ]
        processes = [
            subprocess.Popen(a, env=kvbench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for a in argv
        ]
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, (stdout + stderr)[-3000:]
    shards = [next(out.iterdir()) for out in outs]
    merged = tmp_path / "merged"
    done = kvbench("merge", *map(str, shards), "-o", str(merged), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards]
    lines = [sorted(r.trace_line for r in records if r.trace_line is not None) for records in raw]
    assert sorted(lines[0] + lines[1]) == list(range(1, len(rows) + 1))  # every trace request once
    sessions = [{r.call_id.split("-")[0] for r in records if r.call_id} for records in raw]
    assert sessions == [{"s0", "s2"}, {"s1", "s3"}]  # whole conversations, dealt round-robin
    result = json.loads((merged / "replay.json").read_text())
    (arm,) = result["results"]
    ok = pd.Series([r.ttft_ns for records in raw for r in records if r.ok and r.phase == "measure"], dtype="float64")
    one_pass = quantiles(ok)
    assert one_pass is not None and arm["ttft"]["n"] == one_pass.n == len(rows)
    assert (arm["ttft"]["p50_ms"], arm["ttft"]["p99_ms"]) == (one_pass.p50_ms, one_pass.p99_ms)


def test_two_shards_of_an_agentic_sweep_split_the_agents(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    outs = [tmp_path / f"agents-{index}" for index in range(2)]
    with simulator(*SERVE) as base_url:
        scenario = {
            "name": "agents-sharded",
            "engine": {"kind": "openai", "base_url": f"{base_url}/v1", "model": "llama-3.1-8b"},
            "arms": [{"name": "ON", "offload": "hbm"}],
            "workload": {
                "kind": "agentic",
                "agents": [3],
                "system_prompt_tokens": 200,
                "task_tokens": 100,
                "calls": {"dist": "uniform", "low": 2, "high": 3},
                "tool_result_tokens": 100,
                "output_tokens": 4,
                "tool_time_s": 0.1,
                "tiers": [{"name": "any", "ttft_s": 10, "min_output_tokens_per_s": 1, "percentile": 90}],
                "warmup_s": 1,
                "window_s": 3,
                "drain_timeout_s": 3,
                "warmup_requests": 1,
            },
            "seed": 3,
        }
        path = tmp_path / "agents.yaml"
        path.write_text(yaml.safe_dump(scenario))
        start = time.time() + START_IN_S
        processes = [
            subprocess.Popen(
                kvbench_argv("sweep", str(path), "-o", str(out), "--shard", f"{index}/2", "--start-at", f"{start:.3f}"),
                env=kvbench_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index, out in enumerate(outs)
        ]
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, (stdout + stderr)[-3000:]
    shards = [next(out.iterdir()) for out in outs]
    shares = [json.loads((shard / "manifest.json").read_text())["shard"]["shares"] for shard in shards]
    assert [s[0]["share"] for s in shares] == [2.0, 1.0]  # 3 agents: slots 0 and 2, slot 1
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards]
    sessions = [{r.conversation for r in records if r.point == 0} for records in raw]
    assert all(c % 2 == index for index, part in enumerate(sessions) for c in part) and all(sessions)
    done = kvbench("merge", *map(str, shards), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    merged = list(read_records(tmp_path / "merged" / "records.jsonl"))
    assert len(merged) == sum(map(len, raw)) and (tmp_path / "merged" / "agentic.json").is_file()


def test_bad_shard_flags_are_one_line_errors(tmp_path: Path) -> None:
    for flags, expected in (
        (("--shard", "2/2"), "--shard 2/2: I must be in 0..N-1"),
        (("--shard", "1"), "--shard '1': give I/N"),
        (("--start-at", "noon"), "--start-at 'noon': give an ISO 8601 UTC time"),
        (("--start-at", "2026-12-02T06:00:00"), "give the time zone"),
    ):
        done = kvbench("sweep", "quickstart", *flags, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert expected in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
