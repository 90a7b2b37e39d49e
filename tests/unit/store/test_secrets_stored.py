"""Secrets written in a scenario never reach the files a run directory stores."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from common.errors import RunDirError
from common.redact import REDACTED, JsonData, redact_argv, redact_data, redact_text, secret_values
from harness.scenario.spec import parse_scenario
from harness.store.manifest import Manifest
from harness.store.rundir import RunDir

HF = "hf_abcdefghijklmnopQRST"
API = "Zq9-plain-looking-key-77"
PASSWORD = "pa55wordWithNoPattern"


def vllm_scenario(model_dir: Path) -> dict[str, object]:
    return {
        "name": "secret-vllm",
        "engine": {
            "kind": "vllm",
            "model": str(model_dir),
            "env": {"HF_TOKEN": HF, "MY_SERVICE_SECRET": PASSWORD, "OMP_NUM_THREADS": "4"},
            "extra_args": ["--api-key", API, f"--hf-token={HF}", "--max-num-seqs", "8"],
        },
        "arms": [{"name": "AMG-OFF", "offload": "off"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [64]},
    }


def test_env_tokens_and_secret_flags_never_reach_scenario_or_manifest(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    scenario = parse_scenario(vllm_scenario(model_dir), "test")
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    Manifest.start(run_dir.manifest_file, scenario, None, 0).finish("completed")
    for path in (run_dir.scenario_file, run_dir.manifest_file):
        text = path.read_text(encoding="utf-8")
        for secret in (HF, API, PASSWORD):
            assert secret not in text, (path.name, secret)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = run_dir.scenario()
    assert stored.engine.env == {"HF_TOKEN": REDACTED, "MY_SERVICE_SECRET": REDACTED, "OMP_NUM_THREADS": "4"}  # type: ignore[union-attr]
    assert stored.engine.extra_args == ["--api-key", REDACTED, f"--hf-token={REDACTED}", "--max-num-seqs", "8"]  # type: ignore[union-attr]
    manifest = json.loads(run_dir.manifest_file.read_text(encoding="utf-8"))
    assert manifest["scenario"]["engine"]["env"]["OMP_NUM_THREADS"] == "4"


def test_resume_without_the_original_file_says_why(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    scenario = parse_scenario(vllm_scenario(model_dir), "test")
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    Manifest.start(run_dir.manifest_file, scenario, tmp_path / "gone.yaml", 0)
    with pytest.raises(RunDirError, match="had its secrets removed"):
        run_dir.resume_scenario()


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (f"http://user:{PASSWORD}@host:8000/v1", PASSWORD),
        (f"postgres://svc:{PASSWORD}@db/x and more", PASSWORD),
        (f"Authorization: Bearer {API}", API),
        (f"token={API}&x=1", API),
    ],
)
def test_text_rules(text: str, hidden: str) -> None:
    assert hidden not in redact_text(text)


def test_literal_secret_is_hidden_whatever_surrounds_it() -> None:
    for echoed in (f"key«{API}»", f"X-Key:{API}", f"{API}{API}", f"got '{API}' from header"):
        assert API not in redact_text(echoed, [API])


def test_secret_values_and_argv() -> None:
    argv = ["vllm", "--api-key", API, f"--hf-token={HF}"]
    assert set(secret_values(argv, {"HF_TOKEN": HF, "PATH": "/bin"})) == {API, HF}
    assert API not in " ".join(redact_argv(argv))


def test_redact_data_keeps_env_variable_names() -> None:
    data: JsonData = {"api_key_env": "OPENAI_API_KEY", "api_key": API, "nested": [{"password": PASSWORD}]}
    out = redact_data(data)
    assert out == {"api_key_env": "OPENAI_API_KEY", "api_key": REDACTED, "nested": [{"password": REDACTED}]}
