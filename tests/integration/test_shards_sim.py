"""Two shards of one sweep against one ``kvbench sim serve``, started together by ``--start-at``, then merged.

The shards are two ``kvbench sweep --shard I/2`` processes, as two pods would run them. The merge must give a run
whose records are the union of the shards' (each keeping its shard), whose load points are the whole load (3 and
4 users, split 2+1 and 2+2), and whose percentiles equal the ones computed in one pass over the shards' own
records; the shards' directories stay as they were. A merge of shards that did not run together is INCONCLUSIVE
(exit 3) naming them; a set of shards that is not one run is refused (exit 2).

Every shard run that waits for a ``--start-at`` is one module fixture's (:func:`shards`), so the module waits for
a common start once: the sweep's shard 0 and shard 1 and a second shard 1 stopped in its second load point
(three processes, one ``--start-at``), then a replay's and an agentic sweep's shard pairs, each pair at its own
``--start-at`` after the sweep's last point (so no measured windows overlap: the client gate of one run never sees
another's load). The later pairs start once the sweep's shards wait at their countdown, so their start-up does
not make the sweep's shards late. The simulator stays up for the module: the stopped shard resumes against it,
and the two shards run without ``--start-at`` use it.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from harness.results.sweep_metrics import quantiles
from harness.runs.shard import SETUP_ALLOWANCE_S
from harness.store.records import read_records
from kvbench.cli import app
from tests.support import (
    LOADED_CLIENT_LIMITS,
    attached_sweep_args,
    kvbench,
    kvbench_argv,
    kvbench_env,
    simulator,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]

MERGE_JOB = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "shards" / "merge" / "job.yaml"

SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1", "--offload", "off")
LOADS = (3, 4)
WARMUP_S, DURATION_S, DRAIN_S = 1, 3, 2
"""The sweep shards' --warmup, --duration and sweep.drain_timeout: a load point lasts at most their sum."""
START_IN_S = 30
"""--start-at this far ahead: the sweep's three shards must have started, confirmed the endpoint and warmed up by
then (on a loaded 2-core machine two took over 10 s); a shard that is late starts at once and the merge judges it,
so the fixture fails at once when one is not waiting at its countdown by then."""
SWEEP_SPAN_S = (
    (len(LOADS) - 1) * (WARMUP_S + DURATION_S + DRAIN_S + SETUP_ALLOWANCE_S) + WARMUP_S + DURATION_S + DRAIN_S
)
"""From the sweep's --start-at to the end of its last point at the latest (the period of :mod:`harness.runs.shard`)."""
REPLAY_SPAN_S = 6
"""The replay pair's time from its --start-at (a 1.1 s trace of 12 short requests, and their answers), rounded up."""
GAP_S = 2
"""Between one pair's last request and the next pair's start, so no two pairs' measured windows overlap."""
RUN_TIMEOUT_S = 300


def shard_argv(base_url: str, index: int, out: Path, start_at: float | None, loads: Sequence[int] = LOADS) -> list[str]:
    argv = kvbench_argv(
        *attached_sweep_args(
            base_url,
            ",".join(map(str, loads)),
            "--set",
            f"sweep.drain_timeout={DRAIN_S}s",
            *LOADED_CLIENT_LIMITS,
            "--shard",
            f"{index}/2",
            "-o",
            str(out),
            duration_s=DURATION_S,
            warmup_s=WARMUP_S,
        )
    )
    return argv + (["--start-at", f"{start_at:.3f}"] if start_at is not None else [])


def replay_trace(path: Path) -> int:
    """A Bailian-format trace of 4 sessions of 3 turns at path; its number of requests."""
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
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)


def agentic_scenario(base_url: str) -> dict[str, object]:
    return {
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


class Launched:
    """``kvbench`` processes started with their output in a log file each; :meth:`finish` waits for them."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[str]:
        # a log file, not a pipe: a process waiting a minute for its --start-at must never block on a full pipe
        with (self.logs / f"{name}.log").open("w") as log:
            process = subprocess.Popen(argv, env=kvbench_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        self.processes[name] = process
        return process

    def output(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()[-3000:]

    def finish(self, name: str) -> int:
        return self.processes[name].wait(timeout=RUN_TIMEOUT_S)

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def waiting_at_countdown(out: Path) -> bool:
    """Whether the shard run under ``out`` waits for its common start: a shard records its clocks then."""
    for manifest in out.glob("*/manifest.json"):
        try:
            return json.loads(manifest.read_text())["attempts"][-1].get("clock") is not None
        except (ValueError, KeyError, IndexError):
            return False  # being written
    return False


@dataclass(frozen=True)
class Shards:
    """The module's shard runs: each a run directory."""

    root: Path
    base_url: str
    sweep: tuple[Path, Path]
    stopped: Path
    """A second shard 1 of the same sweep, stopped (Ctrl-C) in its second load point."""
    replay: tuple[Path, Path]
    replay_requests: int
    agentic: tuple[Path, Path]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shards]:
    root = tmp_path_factory.mktemp("shards")
    logs = root / "logs"
    logs.mkdir()
    outs = {name: root / name for name in ("shard-0", "shard-1", "stopped-1")}
    replay_outs = [root / f"replay-{index}" for index in range(2)]
    agentic_outs = [root / f"agents-{index}" for index in range(2)]
    launched = Launched(logs)
    with simulator(logs, *SERVE) as base_url:
        try:
            sweep_start = time.time() + START_IN_S
            for name, out in outs.items():
                launched.start(name, shard_argv(base_url, int(name[-1]), out, sweep_start))
            for name, out in outs.items():
                ready = wait_for(
                    partial(waiting_at_countdown, out), sweep_start - time.time(), launched.processes[name]
                )
                assert ready, f"{name} was not waiting for its --start-at in time:\n{launched.output(name)}"

            trace = root / "bailian.jsonl"
            requests = replay_trace(trace)
            replay_start = sweep_start + SWEEP_SPAN_S + GAP_S
            for index, out in enumerate(replay_outs):
                argv = kvbench_argv("replay", "--base-url", f"{base_url}/v1", "--trace", str(trace), "-o", str(out))
                launched.start(f"replay-{index}", [*argv, "--shard", f"{index}/2", "--start-at", f"{replay_start:.3f}"])
            scenario = root / "agents.yaml"
            scenario.write_text(yaml.safe_dump(agentic_scenario(base_url)))
            agentic_start = replay_start + REPLAY_SPAN_S + GAP_S
            for index, out in enumerate(agentic_outs):
                argv = kvbench_argv("sweep", str(scenario), "-o", str(out), "--shard", f"{index}/2")
                launched.start(f"agents-{index}", [*argv, "--start-at", f"{agentic_start:.3f}"])

            # the second shard 1 finishes the first load point, then is stopped (Ctrl-C) in the second
            stopped = launched.processes["stopped-1"]

            def first_point_done() -> bool:
                return any(path.read_text().strip() for path in outs["stopped-1"].glob("*/points.jsonl"))

            assert wait_for(first_point_done, START_IN_S + 120, stopped), launched.output("stopped-1")
            stopped.send_signal(signal.SIGINT)
            launched.finish("stopped-1")
            for name in ("shard-0", "shard-1", "replay-0", "replay-1", "agents-0", "agents-1"):
                assert launched.finish(name) == 0, launched.output(name)
        finally:
            launched.stop_all()
        yield Shards(
            root=root,
            base_url=base_url,
            sweep=(next(outs["shard-0"].iterdir()), next(outs["shard-1"].iterdir())),
            stopped=next(outs["stopped-1"].iterdir()),
            replay=(next(replay_outs[0].iterdir()), next(replay_outs[1].iterdir())),
            replay_requests=requests,
            agentic=(next(agentic_outs[0].iterdir()), next(agentic_outs[1].iterdir())),
        )


def digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_two_shards_merge_into_the_whole_sweep(tmp_path: Path, shards: Shards) -> None:
    before = [digest(shard) for shard in shards.sweep]
    merged = tmp_path / "merged-cli"
    done = kvbench("merge", *map(str, shards.sweep), "-o", str(merged), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [digest(shard) for shard in shards.sweep] == before  # the merge only reads the shards

    # each shard: its part of each load point recorded, its clock, disjoint sessions
    manifests = [json.loads((shard / "manifest.json").read_text()) for shard in shards.sweep]
    assert [m["manifest_version"] for m in manifests] == [3, 3]
    shares = [[(s["load"], s["share"]) for s in m["shard"]["shares"]] for m in manifests]
    assert shares == [[(3.0, 2.0), (4.0, 2.0)], [(3.0, 1.0), (4.0, 2.0)]]
    assert all(m["attempts"][-1]["clock"]["server_offset_s"] is not None for m in manifests)
    assert manifests[0]["prompt_salt"] == manifests[1]["prompt_salt"]
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards.sweep]
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
    assert [digest(shard) for shard in shards.sweep] == before

    # the Kubernetes merge Job's command line finds the shards where the Indexed Job's pods write them
    # (RESULTS/RUN/shard-I/RUN_DIR) and makes the same run
    (container,) = yaml.safe_load(MERGE_JOB.read_text())["spec"]["template"]["spec"]["containers"]
    shell, flag, script = container["command"]
    local = script.replace("exec kvbench", f"exec {shlex.join(kvbench_argv())}", 1).replace(
        "/results", str(shards.root)
    )
    job = subprocess.run(
        [shell, flag, local], env=kvbench_env(KVBENCH_RUN="."), capture_output=True, text=True, timeout=300
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert json.loads((shards.root / "merged.json").read_text())["points"] == result["points"]

    # not one run: a shard twice, or one alone (one-line refusals, so in this process: a process start proves nothing)
    twice = CliRunner().invoke(
        app, ["merge", str(shards.sweep[0]), str(shards.sweep[0]), "-o", str(tmp_path / "twice")]
    )
    assert twice.exit_code == 2 and "given twice" in twice.stderr, twice.output
    alone = CliRunner().invoke(app, ["merge", str(shards.sweep[1]), "-o", str(tmp_path / "alone")])
    assert alone.exit_code == 2 and "shards 0 of 0..1 missing" in alone.stderr, alone.output


def test_shards_that_did_not_run_together_are_inconclusive(tmp_path: Path, shards: Shards) -> None:
    # one load point: the finding is per point; without --start-at the shards run one after the other (on the
    # module's simulator, idle now)
    for index in range(2):
        argv = shard_argv(shards.base_url, index, tmp_path / f"apart-{index}", None, loads=LOADS[:1])
        done = subprocess.run(argv, env=kvbench_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    apart = [next((tmp_path / f"apart-{index}").iterdir()) for index in range(2)]
    done = kvbench("merge", *map(str, apart), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 3, (done.stdout + done.stderr)[-3000:]
    assert "shard 0 (ends first) and shard 1 (starts last)" in done.stderr + done.stdout


def test_a_shard_that_stopped_is_named_and_the_merge_inconclusive(tmp_path: Path, shards: Shards) -> None:
    parts = [shards.sweep[0], shards.stopped]
    done = kvbench("merge", *map(str, parts), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 3, said[-3000:]
    assert "INCONCLUSIVE" in said and f"shard 1 ({shards.stopped}) ended interrupted" in said
    assert "point 1: shards 1 did not finish it" in said
    result = json.loads((tmp_path / "merged" / "sweep.json").read_text())
    assert [p["load"] for p in result["points"]] == [float(LOADS[0])]  # the point both shards ran, whole

    # the stopped shard resumes as the same shard (its manifest says which), but alone, so its second point
    # does not overlap the other shard's: the merge says so
    again = CliRunner().invoke(app, ["sweep", "--resume", str(shards.stopped), "--shard", "1/2"])
    assert again.exit_code == 2 and "--resume keeps the shard" in again.stderr, again.output
    resumed = kvbench("sweep", "--resume", str(shards.stopped), cwd=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    later = [r for r in read_records(shards.stopped / "records.jsonl") if r.attempt == 1 and r.point is not None]
    assert later and all(r.shard == 1 and r.conversation % 2 == 1 for r in later)
    done = kvbench("merge", *map(str, parts), "-o", str(tmp_path / "merged-again"), cwd=tmp_path)
    assert done.returncode == 3 and "point 1: the measured windows of shard" in done.stdout + done.stderr


def test_two_shards_of_a_replay_merge_into_the_whole_trace(tmp_path: Path, shards: Shards) -> None:
    merged = tmp_path / "merged"
    done = kvbench("merge", *map(str, shards.replay), "-o", str(merged), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards.replay]
    lines = [sorted(r.trace_line for r in records if r.trace_line is not None) for records in raw]
    assert sorted(lines[0] + lines[1]) == list(range(1, shards.replay_requests + 1))  # every trace request once
    sessions = [{r.call_id.split("-")[0] for r in records if r.call_id} for records in raw]
    assert sessions == [{"s0", "s2"}, {"s1", "s3"}]  # whole conversations, dealt round-robin
    result = json.loads((merged / "replay.json").read_text())
    (arm,) = result["results"]
    ok = pd.Series([r.ttft_ns for records in raw for r in records if r.ok and r.phase == "measure"], dtype="float64")
    one_pass = quantiles(ok)
    assert one_pass is not None and arm["ttft"]["n"] == one_pass.n == shards.replay_requests
    assert (arm["ttft"]["p50_ms"], arm["ttft"]["p99_ms"]) == (one_pass.p50_ms, one_pass.p99_ms)


def test_two_shards_of_an_agentic_sweep_split_the_agents(tmp_path: Path, shards: Shards) -> None:
    shares = [json.loads((shard / "manifest.json").read_text())["shard"]["shares"] for shard in shards.agentic]
    assert [s[0]["share"] for s in shares] == [2.0, 1.0]  # 3 agents: slots 0 and 2, slot 1
    raw = [list(read_records(shard / "records.jsonl")) for shard in shards.agentic]
    sessions = [{r.conversation for r in records if r.point == 0} for records in raw]
    assert all(c % 2 == index for index, part in enumerate(sessions) for c in part) and all(sessions)
    done = kvbench("merge", *map(str, shards.agentic), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    merged = list(read_records(tmp_path / "merged" / "records.jsonl"))
    assert len(merged) == sum(map(len, raw)) and (tmp_path / "merged" / "agentic.json").is_file()


def one_line_error(stderr: str, message: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in stderr, stderr


def test_a_bad_shard_flag_is_a_one_line_error(tmp_path: Path) -> None:
    # as a user meets it: a kvbench process, exit 2, one line on its stderr
    done = kvbench("sweep", "quickstart", "--shard", "2/2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    one_line_error(done.stderr, "--shard 2/2: I must be in 0..N-1")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard", "1"], "--shard '1': give I/N"),
        (["--start-at", "noon"], "--start-at 'noon': give an ISO 8601 UTC time"),
        (["--start-at", "2026-12-02T06:00:00"], "give the time zone"),
    ],
)
def test_bad_shard_flags_are_one_line_errors(
    flags: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the message is what these prove, so the CLI runs in this process (the test above pays a process's start-up);
    # a traceback would surface as an exception other than the exit
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["sweep", "quickstart", *flags])
    assert isinstance(done.exception, SystemExit) and done.exit_code == 2, done.output
    one_line_error(done.stderr, message)
