"""Flags-only runs (``kvbench run --base-url URL``) against misbehaving endpoints (:mod:`tests.fakes.hostile_openai`):
one line and one exit code per kind of error, the same with and without ``--model``, and no run directory for an
error in the configuration; what a run cannot trust stops it with a line naming the cause.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fakes.hostile_openai import MODEL, MOVED, Hostile, hostile_openai
from tests.support import kvbench

pytestmark = pytest.mark.integration

SMALL = ("--contexts", "100", "--conversations", "1", "--answer-tokens", "2")


def one_line_error(done: subprocess.CompletedProcess[str], tmp_path: Path) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert not (tmp_path / "runs").exists()  # nothing made for a run that could not start
    return lines[0]


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_exit_2_with_or_without_model_and_are_asked_once(tmp_path: Path, status: int) -> None:
    with hostile_openai(Hostile(status=status)) as endpoint:
        out = str(tmp_path / "runs")
        without = kvbench("run", "--base-url", endpoint.base_url, "-o", out, cwd=tmp_path)
        asked = len(endpoint.seen)
        named = kvbench("run", "--base-url", endpoint.base_url, "--model", MODEL, "-o", out, *SMALL, cwd=tmp_path)
    assert f"HTTP {status}" in one_line_error(without, tmp_path)
    line = one_line_error(named, tmp_path)
    assert f"HTTP {status}" in line and "refused kvbench's credentials" in line
    assert asked == 1 and len(endpoint.seen) == 2  # one GET /v1/models each: no retry


def test_a_url_with_a_query_and_an_arm_without_equals_are_named(tmp_path: Path) -> None:
    query = kvbench("run", "--base-url", "http://127.0.0.1:9/v1?api-version=2", "--model", "m", cwd=tmp_path)
    assert "--base-url 'http://127.0.0.1:9/v1?api-version=2': give the server's root URL without ?query" in (
        one_line_error(query, tmp_path)
    )
    arm = kvbench("run", "--arm", "OFF", "--model", "m", cwd=tmp_path)
    expected = "--arm 'OFF': give NAME=URL to measure an endpoint, or a scenario whose arm it names"
    assert one_line_error(arm, tmp_path).endswith(expected)


def test_two_arms_on_one_url_with_one_profile_are_refused(tmp_path: Path) -> None:
    with hostile_openai(Hostile()) as endpoint:
        done = kvbench("run", "--arm", f"A={endpoint.base_url}", "--arm", f"B={endpoint.base_url}/", cwd=tmp_path)
    assert "arms A, B measure the same URL" in one_line_error(done, tmp_path)


def test_a_redirect_to_another_host_stops_the_run_naming_both(tmp_path: Path) -> None:
    with hostile_openai(Hostile()) as elsewhere, hostile_openai(Hostile()) as endpoint:
        endpoint.redirect_to = elsewhere.root
        done = kvbench("run", "--base-url", endpoint.base_url, "-o", str(tmp_path / "runs"), *SMALL, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in output
    assert "another try cannot help" in output
    assert f"{endpoint.root}/v1/chat/completions redirected (HTTP 307) to {elsewhere.root}/v1/chat/completions" in (
        output
    )
    assert elsewhere.seen == [] and endpoint.seen.count("POST /v1/chat/completions") == 1


def test_a_chat_only_endpoint_is_measured_when_the_model_is_given(tmp_path: Path) -> None:
    """Behind a redirect within its origin, which the manifest names."""
    with hostile_openai(Hostile(chat_only=True)) as endpoint:
        endpoint.redirect_to = endpoint.root + MOVED
        flags = ("--base-url", endpoint.base_url, "--model", MODEL, "-o", str(tmp_path / "runs"), *SMALL)
        done = kvbench("run", *flags, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]  # measured; no reset between turns, so INCONCLUSIVE, never PASS
    assert "Traceback" not in output
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {cell["context_tokens"] for cell in summary["cells"]} == {100}
    assert all(cell["ttft"]["median_ms"] is not None for cell in summary["cells"])
    details = json.loads((run_dir / "manifest.json").read_text())["engines"]["endpoint"]["details"]
    assert details["redirected"] == f"{endpoint.root}/v1/chat/completions -> {endpoint.root}{MOVED}/v1/chat/completions"
    assert endpoint.seen.count(f"POST {MOVED}/v1/chat/completions") == endpoint.seen.count("POST /v1/chat/completions")
