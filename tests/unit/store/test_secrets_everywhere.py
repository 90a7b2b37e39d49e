"""Secrets are scrubbed in every form and wherever argv is stored (R11, R12).

* R11: a literal secret is scrubbed as is, JSON-escaped, percent-encoded and base64-encoded, and an
  ``Authorization: Basic`` header loses its credentials whatever they are.
* R12: every flag whose name has a secret word (``--ssl-keyfile-password``, ``--db-secret=X``) has its
  value hidden in scenario.yaml, manifest.json and the engine.log header of a real engine process;
  ``--tokenizer`` and ``--max-num-batched-tokens`` are not secrets and stay.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from common.errors import EngineStartError
from common.redact import REDACTED, is_secret_flag, redact_argv, redact_text, secret_values
from harness.engines.process import ManagedProcess
from harness.scenario.spec import parse_scenario
from harness.store.manifest import Manifest
from harness.store.rundir import RunDir
from tests.support import fake_engine_spec

KEY = 'Zq9/plain+Key"4242abc'
PASSWORD = "hunter2-keyfile-pw"


def forms(secret: str) -> list[str]:
    escaped = json.dumps(secret)[1:-1]
    raw = secret.encode()
    return [
        secret,
        escaped,
        escaped.replace("/", "\\/"),
        json.dumps(escaped)[1:-1],
        quote(secret, safe=""),
        re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(secret, safe="")),
        quote_plus(secret),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode(),
    ]


@pytest.mark.parametrize("form", forms(KEY))
def test_every_encoding_of_a_known_secret_is_scrubbed(form: str) -> None:
    text = f"upstream said: you sent <{form}>, rejected"
    assert redact_text(text, [KEY]) == f"upstream said: you sent <{REDACTED}>, rejected"


def test_basic_credentials_are_scrubbed_whatever_the_user() -> None:
    header = "Authorization: Basic " + base64.b64encode(f"alice:{KEY}".encode()).decode()
    assert redact_text(header) == f"Authorization: Basic {REDACTED}"


def test_secret_flags_by_their_words() -> None:
    for flag in ("--ssl-keyfile-password", "--api-key", "--hf_token", "--db-secret=x", "--passwd", "--aws-credentials"):
        assert is_secret_flag(flag), flag
    for flag in ("--tokenizer", "--max-num-batched-tokens", "--ssl-keyfile", "--keyring-dir", "value-password"):
        assert not is_secret_flag(flag), flag
    argv = [
        "vllm",
        "--ssl-keyfile-password",
        PASSWORD,
        "--db-secret=zz9999",
        "--tokenizer",
        "t",
        "--use-token",
        "--port",
        "1",
    ]
    assert redact_argv(argv) == [
        "vllm",
        "--ssl-keyfile-password",
        REDACTED,
        f"--db-secret={REDACTED}",
        "--tokenizer",
        "t",
        "--use-token",
        "--port",
        "1",
    ]
    assert secret_values(argv, {}) == [PASSWORD, "zz9999"]


def test_secret_flags_are_hidden_in_scenario_yaml_and_manifest(tmp_path: Path) -> None:
    extra = ["--ssl-keyfile-password", PASSWORD, "--db-secret=zz9999", "--tokenizer", "tok-name"]
    scenario = parse_scenario(
        {
            "name": "secret-flags",
            "engine": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "extra_args": extra},
            "arms": [{"name": "A", "offload": "off"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [100]},
        },
        "test",
    )
    run_dir = RunDir.create(tmp_path, scenario)
    Manifest.start(run_dir.manifest_file, scenario, None, attempt=0)
    for name in ("scenario.yaml", "manifest.json"):
        text = (run_dir.path / name).read_text(encoding="utf-8")
        assert PASSWORD not in text and "zz9999" not in text, name
        assert "tok-name" in text, name  # not a secret: kept


async def test_a_real_engine_process_logs_its_command_without_the_password(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "engine.log"
    process = ManagedProcess(fake_engine_spec(log, "--mode", "crash-at-start", "--ssl-keyfile-password", PASSWORD))
    with pytest.raises(EngineStartError) as caught:
        await process.__aenter__()
    assert PASSWORD not in str(caught.value)
    text = log.read_text(encoding="utf-8")
    assert "--ssl-keyfile-password ***" in text  # the command line kvbench logs
    assert "loading model ***" in text  # the engine's own echo of it (the fake takes it for its model)
    assert PASSWORD not in text


async def test_a_log_left_unscrubbed_by_a_killed_kvbench_is_scrubbed_when_the_process_starts_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "logs" / "engine.log"
    log.parent.mkdir()
    # what an engine printed before kvbench was killed -9: its own echo of the password, never scrubbed
    log.write_text(f"INFO args: --ssl-keyfile-password {PASSWORD}\n", encoding="utf-8")
    async with ManagedProcess(fake_engine_spec(log, env={"VLLM_SSL_KEYFILE_PASSWORD": PASSWORD})):
        text = log.read_text(encoding="utf-8")  # while the new process runs, before any stop could scrub
        assert text.startswith("INFO args: --ssl-keyfile-password ***") and PASSWORD not in text
