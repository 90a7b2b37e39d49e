"""Flags-only runs (``kvbench run --base-url URL`` / ``--arm NAME=URL``, no YAML) against attached endpoints.

* a plain OpenAI-compatible server (:mod:`tests.fakes.plain_openai`: no ``/tokenize``, no prefix-cache
  reset, no ``/metrics``), two of them as two arms: the model comes from ``GET /v1/models``, prompts are built
  with kvbench's word tokenizer and the server's ``usage.prompt_tokens`` is set beside it, the missing reset is
  said once per arm and judged INCONCLUSIVE (exit 3, never a traceback), both arms land in one table, and the
  TTFT includes the delay the server applied before its first token;
* the same server behind a YAML scenario of engine kind ``openai``: the same, no traceback;
* the simulator (``/tokenize`` and reset there): exact counts, the reset happens, the run is valid;
* bad flags: one line, exit 2, before anything starts (one case as a process, the rest in this process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kvbench.cli import app
from tests.fakes.plain_openai import plain_openai
from tests.support import SimulatorLauncher, kvbench

pytestmark = pytest.mark.integration

SAID_ONCE = "so kvbench cannot drop its GPU prefix cache between turns"


def only_run_dir(parent: Path) -> Path:
    (run_dir,) = parent.iterdir()
    return run_dir


def test_two_plain_endpoints_compared_from_flags(tmp_path: Path) -> None:
    with plain_openai(first_token_s=0.08) as off, plain_openai(first_token_s=0.02) as on:
        done = kvbench(
            "run",
            "--arm",
            f"OFF={off.base_url}",
            "--arm",
            f"ON={on.base_url}",
            "--contexts",
            "500,2000",
            "--conversations",
            "2",
            "--answer-tokens",
            "4",
            "-o",
            str(tmp_path / "runs"),
            cwd=tmp_path,
        )
        paths = {"OFF": list(off.paths), "ON": list(on.paths)}
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert "Traceback" not in output
    for arm, seen in paths.items():
        assert seen.count("GET /v1/models") >= 1  # the model was discovered, not given
        assert seen.count("POST /tokenize") == 1  # asked once at attach time
        assert seen.count("POST /reset_prefix_cache") == 1  # said once, not retried every turn
        assert output.count(f"{arm}: http://127.0.0.1:") >= 1
    assert output.count(SAID_ONCE) == 2  # once per arm

    run_dir = only_run_dir(tmp_path / "runs")
    stored = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    assert stored["engine"]["model"] == "plain-model" and stored["compare"]["baseline"] is None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["arms"] == ["OFF", "ON"] and summary["baseline_arm"] == "OFF"
    medians = {(c["arm"], c["context_tokens"], c["turn"]): c["ttft"]["median_ms"] for c in summary["cells"]}
    assert len(medians) == 8
    for (arm, _, _), median in medians.items():
        assert median >= (80.0 if arm == "OFF" else 20.0)  # the server's own delay is inside every TTFT
    assert all(medians[("OFF", c, t)] > medians[("ON", c, t)] for c in (500, 2000) for t in (1, 2))
    assert sorted(summary["reset_unavailable"]) == ["OFF", "ON"]
    assert {f["gate"] for f in summary["validity"]["findings"]} == {"reset_unavailable"}
    lengths = {entry["arm"]: entry for entry in summary["prompt_lengths"]}
    assert sorted(lengths) == ["OFF", "ON"]
    for entry in lengths.values():
        assert "word tokenizer" in entry["built_with"] and "no POST /tokenize" in entry["built_with"]
        assert entry["requests"] == 8
        # the fake counts whitespace-separated words (+4 per chat message); kvbench counts punctuation apart
        assert entry["median_diff"] is not None and -0.5 < entry["median_diff"] < 0
        assert entry["max_abs_diff"] >= abs(entry["median_diff"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for arm in ("OFF", "ON"):
        details = manifest["engines"][arm]["details"]
        assert "has no POST /reset_prefix_cache" in details["prefix_cache_reset"]
        assert details["counts_exact"] == "false"
    table = (run_dir / "report" / "ttft_table.md").read_text()
    assert "OFF t2" in table and "ON t2" in table
    assert "Prompts of ON built with kvbench's word tokenizer" in table
    assert "ON: no prefix-cache reset between turns" in table

    rebuilt = kvbench("report", str(run_dir), cwd=tmp_path)
    assert rebuilt.returncode == 3 and "Traceback" not in rebuilt.stdout + rebuilt.stderr


def test_a_yaml_scenario_against_a_server_without_reset_runs_on(tmp_path: Path) -> None:
    with plain_openai(first_token_s=0.0) as server:
        scenario = {
            "name": "plain-yaml",
            "engine": {"kind": "openai", "model": "plain-model", "base_url": server.base_url},
            "arms": [{"name": "A", "offload": "hbm"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [300], "conversations": 1, "answer_tokens": 2},
        }
        path = tmp_path / "plain.yaml"
        path.write_text(yaml.safe_dump(scenario))
        done = kvbench("run", str(path), "-o", str(tmp_path / "runs"), cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "PrefixCacheResetUnsupported" not in output
    assert output.count(SAID_ONCE) == 1
    summary = json.loads((only_run_dir(tmp_path / "runs") / "summary.json").read_text())
    assert list(summary["reset_unavailable"]) == ["A"]


def test_the_simulator_from_flags_is_exact_and_resets(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    with simulator() as base_url:
        done = kvbench(
            "run",
            "--base-url",
            f"{base_url}/v1",
            "--contexts",
            "1000",
            "--conversations",
            "1",
            "-o",
            str(tmp_path / "runs"),
            cwd=tmp_path,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reset_unavailable"] == {} and summary["prompt_lengths"] == []
    assert summary["validity"]["verdict"] == "valid"
    details = json.loads((run_dir / "manifest.json").read_text())["engines"]["endpoint"]["details"]
    assert details["prompts_built_with"] == "the server's POST /tokenize" and details["counts_exact"] == "true"
    assert summary["cells"][1]["prompt_tokens_median"] > 1000  # the length the server saw


def one_line_error(stderr: str, message: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], stderr


def test_several_models_is_a_one_line_error(tmp_path: Path) -> None:
    # as a user meets it: a kvbench process attached to a real server, exit 2, one line on its stderr
    with plain_openai(models=["model-a", "model-b"]) as server:
        done = kvbench("run", "--base-url", server.base_url, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    one_line_error(done.stderr, "serves 2 models (model-a, model-b); choose one with --model NAME")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--arm", "foo"], "--arm 'foo': give NAME=URL"),
        (["run", "--base-url", "ftp://127.0.0.1/v1"], "give an http:// or https:// URL"),
        (["run", "--arm", "A=http://127.0.0.1:9/v1", "--baseline", "Z"], "--baseline 'Z': no such arm; arms: A"),
        (["run", "quickstart", "--base-url", "http://127.0.0.1:9"], "one of them"),
        (["run", "quickstart", "--contexts", "1000"], "--contexts goes with --base-url"),
        (["sweep", "--base-url", "http://127.0.0.1:9"], "needs --concurrency"),
    ],
)
def test_bad_flags_are_one_line_errors(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the message is what these prove, so the CLI runs in this process (the test above pays a process's start-up);
    # a traceback would surface as an exception other than the exit
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, args)
    assert isinstance(done.exception, SystemExit) and done.exit_code == 2, done.output
    one_line_error(done.stderr, message)
    assert not (tmp_path / "runs").exists()
