"""Engine process lifecycle: ManagedProcess against tests/fakes/fake_engine.py, then the SGLang and
TensorRT-LLM engines end to end with stand-in launchers.

The first half starts the fake engine in its failure modes: crashing at start (EngineStartError
with the log tail), never becoming healthy (a timeout naming the health URL), ignoring SIGTERM
(SIGKILL of the process group after the grace period, no process left) and leaving files behind
(the cleanup globs remove what it created and keep what was there before).

The second half runs :class:`SglangEngine` and :class:`TrtllmEngine` for real: a stand-in
``sglang`` package on PYTHONPATH whose ``sglang.launch_server`` hands its command line to the fake
engine, and a stand-in ``trtllm-serve`` executable doing the same. What the engines rendered
(command line, environment, LLM-API YAML) is read back from what the fake recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from common.errors import EngineStartError
from harness.engines.base import LaunchContext, PrefixCacheResetUnsupported
from harness.engines.configs import SglangEngineConfig, TrtllmEngineConfig
from harness.engines.kinds import create_engine, engine_kinds
from harness.engines.process import ManagedProcess, ProcessSpec
from harness.engines.sglang import (
    PYTHON_ENV_VAR,
    EngineRequestError,
    SglangEngine,
    TokenizerUnavailable,
    probe_version,
)
from harness.engines.trtllm import SERVE_ENV_VAR, ModelDirTokenizer, TrtllmEngine
from offload.profiles import BUILTIN_PROFILES, OffloadProfile, OffloadTier
from tests.support import FAKE_ENGINE, fake_engine_spec

EXTRA_ARGS_ENV = "KVBENCH_FAKE_ENGINE_ARGS"
RECORD_ENV = "KVBENCH_FAKE_ENGINE_RECORD"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def exists(path: Path) -> bool:
    return path.exists()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def fake_spec(
    tmp_path: Path, *args: str, grace: float = 2.0, timeout: float = 10.0, globs: tuple[str, ...] = ()
) -> ProcessSpec:
    return fake_engine_spec(
        tmp_path / "logs" / "engine.log",
        *args,
        env={"HF_TOKEN": "hf_abcdefghijklmnop"},
        startup_timeout_s=timeout,
        stop_grace_s=grace,
        cleanup_globs=globs,
    )


# ------------------------------------------------------------------------------------- ManagedProcess


async def test_crash_at_start_raises_with_the_log_tail(tmp_path: Path) -> None:
    process = ManagedProcess(fake_spec(tmp_path, "--mode", "crash-at-start", "--api-key", "sk-secret-key-123456"))
    with pytest.raises(EngineStartError) as caught:
        await process.__aenter__()
    message = str(caught.value)
    assert "exited with code 3 before becoming healthy" in message
    assert "CUDA out of memory" in message and "fake vllm engine" in message  # the log tail
    assert str(tmp_path / "logs" / "engine.log") in message
    assert "sk-secret-key-123456" not in message  # the command line in the log is redacted
    assert process.returncode() == 3


async def test_never_healthy_times_out_naming_the_url(tmp_path: Path) -> None:
    # 3 s, not 1: on a loaded 2-core machine the fake's Python took over a second to listen, and the last
    # health check then saw a refused connection instead of the 503 this test is about
    spec = fake_spec(tmp_path, "--mode", "never-healthy", timeout=3.0)
    process = ManagedProcess(spec)
    started = time.monotonic()
    with pytest.raises(EngineStartError) as caught:
        await process.__aenter__()
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"not healthy after 3 s ({spec.health_url}: HTTP 503)" in message
    assert "INFO fake vllm engine serving" in message  # the log tail says it was up, just not healthy
    assert process.pid is not None and not alive(process.pid)  # stopped on the way out


async def test_slow_start_is_waited_for(tmp_path: Path) -> None:
    async with ManagedProcess(fake_spec(tmp_path, "--startup-delay-s", "0.6")) as process:
        assert process.returncode() is None
        async with aiohttp.ClientSession() as session, session.get(process.spec.health_url) as response:
            assert response.status == 200


async def test_sigterm_stops_a_well_behaved_engine_within_the_grace(tmp_path: Path) -> None:
    process = ManagedProcess(fake_spec(tmp_path, grace=10.0))
    await process.__aenter__()
    pid = process.pid
    started = time.monotonic()
    await process.stop()
    assert time.monotonic() - started < 5  # no SIGKILL wait: it left on SIGTERM
    assert pid is not None and not alive(pid)
    assert "SIGTERM, shutting down" in "\n".join(process.log_tail())


async def test_engine_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids.json"
    process = ManagedProcess(fake_spec(tmp_path, "--mode", "ignore-sigterm", "--pid-file", str(pid_file), grace=0.5))
    await process.__aenter__()
    pids = read_json(pid_file)
    worker = pids["children"][0]
    assert alive(pids["pid"]) and alive(worker)
    started = time.monotonic()
    await process.stop()
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 8  # waited the grace period, then SIGKILLed the group
    assert process.returncode() == -9
    deadline = time.monotonic() + 3
    while alive(worker) and time.monotonic() < deadline:  # SIGKILL is delivered asynchronously
        await asyncio.sleep(0.05)
    assert not alive(pids["pid"]) and not alive(worker)  # the worker child went with its group
    assert "SIGTERM, shutting down" not in "\n".join(process.log_tail())


async def test_leftovers_matching_the_cleanup_globs_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    preexisting = shm / "psm_from_another_engine"
    preexisting.write_text("not ours")
    globs = (str(shm / "psm_*"), str(tmp_path / "dist_*"))
    spec = fake_spec(
        tmp_path,
        *("--leftover", str(shm / "psm_{pid}")),
        *("--leftover", str(tmp_path / "dist_{pid}" / "rendezvous")),
        globs=globs,
    )
    async with ManagedProcess(spec) as process:
        pid = process.pid
        assert (shm / f"psm_{pid}").exists() and (tmp_path / f"dist_{pid}" / "rendezvous").exists()
    assert not (shm / f"psm_{pid}").exists()
    assert not (tmp_path / f"dist_{pid}").exists()  # a directory goes as a whole
    assert preexisting.read_text() == "not ours"  # present before start: not ours to remove


# ------------------------------------------------------------------------------------- stand-ins

STAND_IN = """
import runpy, sys
sys.argv = [{fake!r}, "--family", {family!r}, *sys.argv[1:]]
runpy.run_path({fake!r}, run_name="__main__")
"""


def write_tokenizer(model_dir: Path) -> None:
    """A tiny word-level tokenizer.json, as a Hugging Face model directory would carry one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "kv": 3, "cache": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(model_dir / "tokenizer.json"))


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "record.json"
    monkeypatch.setenv(RECORD_ENV, str(path))
    return path


@pytest.fixture
def sglang_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PYTHONPATH folder with a stand-in ``sglang`` package (``__version__``, ``launch_server``)."""
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.5.11-fake"\n')
    (package / "launch_server.py").write_text(textwrap.dedent(STAND_IN.format(fake=str(FAKE_ENGINE), family="sglang")))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.delenv(PYTHON_ENV_VAR, raising=False)
    return package.parent


@pytest.fixture
def trtllm_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``trtllm-serve`` executable (found through $KVBENCH_TRTLLM_SERVE)."""
    script = tmp_path / "bin" / "trtllm-serve"
    script.parent.mkdir()
    body = textwrap.dedent(STAND_IN.format(fake=str(FAKE_ENGINE), family="trtllm"))
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    monkeypatch.setenv(SERVE_ENV_VAR, str(script))
    return script


def sglang_config(model_dir: Path, **overrides: Any) -> SglangEngineConfig:
    data: dict[str, Any] = {
        "kind": "sglang",
        "model": str(model_dir),
        "python": sys.executable,
        "startup_timeout_s": 20,
        "stop_grace_s": 5,
    }
    data.update(overrides)
    return SglangEngineConfig.model_validate(data)


DISK = OffloadProfile(
    name="cpu-disk",
    tiers=(OffloadTier(kind="cpu", capacity_gb=8), OffloadTier(kind="disk", capacity_gb=100, path="/placeholder")),
)


async def test_sglang_engine_lifecycle(
    sglang_site: Path, record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXTRA_ARGS_ENV, json.dumps(["--flush-refusals", "2"]))
    monkeypatch.setattr("harness.engines.sglang.RESET_RETRY_S", 0.01)
    storage = tmp_path / "hicache"
    profile = DISK.model_copy(
        update={"tiers": (DISK.tiers[0], DISK.tiers[1].model_copy(update={"path": str(storage)}))}
    )
    model_dir = tmp_path / "models" / "Qwen2.5-7B-Instruct"
    model_dir.mkdir(parents=True)
    context = LaunchContext(arm="on", profile=profile, log_dir=tmp_path / "logs", prefix_caching=True)
    engine = create_engine(sglang_config(model_dir, env={"HF_TOKEN": "hf_secretsecret"}), context)
    assert isinstance(engine, SglangEngine)
    assert {"sglang", "trtllm"} <= set(engine_kinds())
    async with engine as running:
        assert running.endpoint.model == "Qwen2.5-7B-Instruct"
        facts = running.facts
        assert facts.kind == "sglang" and facts.version == "0.5.11-fake"
        assert facts.command[1:3] == ("-m", "sglang.launch_server")
        assert facts.details["metrics_family"] == "sglang" and facts.details["hicache_storage_dir"] == str(storage)
        assert '"HF_TOKEN": "***"' in facts.details["env"]
        assert storage.is_dir()  # the disk tier's directory was created
        tokenizer = running.tokenizer()
        assert await tokenizer.encode("hé") == [104, 195, 169]  # /tokenize, without BOS
        assert await tokenizer.decode([104, 105]) == "hi"  # /detokenize answers {"text": ...}
        await running.reset_prefix_cache()  # refused (HTTP 400) twice, then flushed
        pid = running.pid
        async with aiohttp.ClientSession() as session, session.get(running.endpoint.base_url + "/fake/state") as got:
            state = await got.json()
        assert state["flushes"] == 1
    assert pid is not None and not alive(pid)
    recorded = read_json(record)
    argv = recorded["argv"]
    assert argv[argv.index("--model-path") + 1] == str(model_dir)
    assert argv[argv.index("--served-model-name") + 1] == "Qwen2.5-7B-Instruct"
    assert {"--enable-metrics", "--enable-cache-report", "--enable-hierarchical-cache"} <= set(argv)
    assert argv[argv.index("--hicache-size") + 1] == "8"
    assert argv[argv.index("--hicache-storage-backend") + 1] == "file"
    assert recorded["env"]["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == str(storage)
    assert (tmp_path / "logs" / "engine.log").exists()


async def test_sglang_reset_refused_for_too_long_is_an_error(
    sglang_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXTRA_ARGS_ENV, json.dumps(["--flush-refusals", "1000"]))
    monkeypatch.setattr("harness.engines.sglang.RESET_RETRY_S", 0.0)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["hbm"], log_dir=tmp_path / "logs", prefix_caching=True)
    async with SglangEngine(sglang_config(tmp_path / "m"), context) as running:
        with pytest.raises(EngineRequestError, match=r"refused to flush its cache 20 times.*running or waiting"):
            await running.reset_prefix_cache()


async def test_sglang_without_tokenize_falls_back_to_tokenizer_json(
    sglang_site: Path, record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXTRA_ARGS_ENV, json.dumps(["--no-tokenize"]))
    with_tokenizer = tmp_path / "with-tokenizer"
    write_tokenizer(with_tokenizer)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    async with SglangEngine(sglang_config(with_tokenizer), context) as running:
        tokenizer = running.tokenizer()
        assert await tokenizer.encode("hello kv cache") == [1, 3, 4]
        assert await tokenizer.decode([1, 2]) == "hello world"
    argv = read_json(record)["argv"]
    assert "--disable-radix-cache" in argv and "--enable-hierarchical-cache" not in argv
    bare = tmp_path / "bare"
    bare.mkdir()
    async with SglangEngine(sglang_config(bare, enable_metrics=False), context) as running:
        with pytest.raises(TokenizerUnavailable, match=r"no POST /tokenize \(HTTP 404\).*has no tokenizer.json"):
            await running.tokenizer().encode("hello")
        assert running.facts.details["metrics_path"] == ""


async def test_sglang_python_without_sglang_fails_before_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no sglang there (nor in kvbench's own environment)
    with pytest.raises(EngineStartError, match=r"(?s)'import sglang' failed.*KVBENCH_SGLANG_PYTHON"):
        await probe_version(sys.executable)
    with pytest.raises(EngineStartError, match="cannot run"):
        await probe_version(str(tmp_path / "no-such-python"))


async def test_trtllm_engine_lifecycle(trtllm_serve: Path, record: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "Llama-3.1-8B-Instruct"
    write_tokenizer(model_dir)
    config = TrtllmEngineConfig(
        kind="trtllm",
        model=str(model_dir),
        startup_timeout_s=20,
        stop_grace_s=5,
        max_batch_size=64,
        extra_llm_api_options={"kv_cache_config": {"enable_partial_reuse": False}, "max_beam_width": 1},
    )
    context = LaunchContext(arm="on", profile=BUILTIN_PROFILES["cpu"], log_dir=tmp_path / "logs", prefix_caching=True)
    engine = create_engine(config, context)
    assert isinstance(engine, TrtllmEngine)
    async with engine as running:
        assert running.endpoint.model == "Llama-3.1-8B-Instruct"  # trtllm-serve names a checkpoint by its directory
        facts = running.facts
        assert facts.kind == "trtllm" and facts.version == "0.0.0-fake-trtllm"  # GET /version
        assert facts.command[0] == str(trtllm_serve)
        assert facts.details["metrics_path"] == "/prometheus/metrics"
        assert "host_cache_size: 64000000000" in facts.details["file:llm_api_options.yaml"]
        with pytest.raises(PrefixCacheResetUnsupported, match="filler"):
            await running.reset_prefix_cache()
        assert await running.tokenizer().encode("hello world") == [1, 2]  # the model directory's tokenizer.json
        options_path = Path(facts.command[facts.command.index("--extra_llm_api_options") + 1])
        assert exists(options_path)
        pid = running.pid
    assert pid is not None and not alive(pid)
    assert not exists(options_path) and not exists(options_path.parent)  # the temporary directory went too
    recorded = read_json(record)
    argv = recorded["argv"]
    assert argv[:2] == ["--family", "trtllm"] and argv[2] == str(model_dir)  # positional MODEL
    assert argv[argv.index("--backend") + 1] == "pytorch"
    assert argv[argv.index("--max_batch_size") + 1] == "64"
    assert recorded["llm_api_options"] == {
        "kv_cache_config": {
            "enable_block_reuse": True,
            "enable_partial_reuse": False,
            "free_gpu_memory_fraction": 0.9,
            "host_cache_size": 64_000_000_000,
        },
        "max_beam_width": 1,
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }


async def test_trtllm_serve_missing_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVE_ENV_VAR, str(tmp_path / "nowhere" / "trtllm-serve"))
    config = TrtllmEngineConfig(kind="trtllm", model=str(tmp_path))
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["hbm"], log_dir=tmp_path / "logs", prefix_caching=True)
    with pytest.raises(EngineStartError, match=r"(?s)not found.*KVBENCH_TRTLLM_SERVE"):
        async with TrtllmEngine(config, context):
            pass


async def test_trtllm_without_tokenizer_json_is_a_clear_error(trtllm_serve: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "no-tokenizer"
    model_dir.mkdir()
    config = TrtllmEngineConfig(kind="trtllm", model=str(model_dir), startup_timeout_s=20, enable_metrics=False)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    async with TrtllmEngine(config, context) as running:
        with pytest.raises(TokenizerUnavailable, match=r"has no /tokenize endpoint, and .* has no tokenizer.json"):
            running.tokenizer()
        url = running.endpoint.base_url + "/prometheus/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 404  # return_perf_metrics off: no Prometheus page


def test_model_dir_tokenizer_rejects_a_broken_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerUnavailable, match="cannot read"):
        ModelDirTokenizer.from_model_dir(tmp_path, "test")
    assert os.environ.get(RECORD_ENV) is None
