"""Rendering offload profiles into vLLM launches, the vLLM command line, and the engine lifecycle.

The lifecycle tests run :class:`VllmEngine` for real against a stand-in ``vllm`` package (and a
stand-in ``lmcache`` for the sidecar) written to a temporary directory: real processes, real
health checks, real /tokenize and /reset_prefix_cache traffic, in about a second.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from common.errors import EngineStartError
from harness.engines.base import LaunchContext, PrefixCacheResetUnsupported
from harness.engines.configs import VllmEngineConfig
from harness.engines.kinds import create_engine, engine_kinds
from harness.engines.vllm import (
    FLASHINFER_ALLREDUCE_ENV,
    MULTICAST_FREE_ENV,
    SYMM_MEM_ALLREDUCE_ENV,
    EngineRequestError,
    VllmEngine,
    build_vllm_argv,
    build_vllm_env,
    probe_versions,
)
from harness.engines.vllm_offload import VllmLaunchPlan, check_supported, render_vllm_launch, resolve_backend
from harness.scenario.spec import parse_scenario
from offload.profiles import BUILTIN_PROFILES, OffloadProfile, OffloadTier, TierScope, session_dir_name


def vllm_config(**overrides: object) -> VllmEngineConfig:
    return VllmEngineConfig.model_validate(
        {"kind": "vllm", "model": "/models/llama-3.1-8b", "python": "/venv/bin/python", **overrides}
    )


def fixed_ports(start: int = 6000) -> Callable[[], int]:
    numbers: Iterator[int] = count(start)
    return lambda: next(numbers)


CPU_ONLY = OffloadProfile(name="cpu8", tiers=(OffloadTier(kind="cpu", capacity_gb=8),))


# ------------------------------------------------------------------------------------- rendering


def test_profile_without_tiers_only_sets_prefix_caching(tmp_path: Path) -> None:
    config = vllm_config()
    off = render_vllm_launch(BUILTIN_PROFILES["off"], config, True, tmp_path)
    assert off.backend == "none"
    assert off.args == ("--no-enable-prefix-caching",)  # profile 'off' has prefix_caching=False
    hbm = render_vllm_launch(BUILTIN_PROFILES["hbm"], config, True, tmp_path)
    assert hbm.args == ("--enable-prefix-caching",)
    disabled = render_vllm_launch(BUILTIN_PROFILES["hbm"], config, False, tmp_path)
    assert disabled.args == ("--no-enable-prefix-caching",)
    assert not off.sidecars and not off.files and not off.env


def test_auto_picks_lmcache_mp_on_cpu_and_lmcache_on_cuda() -> None:
    assert resolve_backend(CPU_ONLY, vllm_config(device="cpu")) == "lmcache-mp"
    assert resolve_backend(CPU_ONLY, vllm_config(device="cuda")) == "lmcache"
    assert resolve_backend(BUILTIN_PROFILES["off"], vllm_config(device="cpu")) == "none"


def test_lmcache_mp_renders_server_and_connector(tmp_path: Path) -> None:
    plan = render_vllm_launch(CPU_ONLY, vllm_config(device="cpu"), True, tmp_path, port_factory=fixed_ports())
    assert plan.backend == "lmcache-mp" and plan.uses_lmcache
    assert plan.args[0] == "--enable-prefix-caching"
    assert plan.args[1] == "--kv-transfer-config"
    transfer = json.loads(plan.args[2])
    assert transfer == {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 6000},
    }
    (server,) = plan.sidecars
    assert (
        server.args()
        == (
            "--host 127.0.0.1 --port 6000 --chunk-size 256 --l1-size-gb 8 --eviction-policy LRU "
            "--supported-transfer-mode engine_driven --http-host 127.0.0.1 --http-port 6001 --prometheus-port 6002"
        ).split()
    )
    assert server.health_url == "http://127.0.0.1:6001/healthcheck"
    assert not plan.files and not plan.env


def test_lmcache_mp_transfer_mode_follows_the_device(tmp_path: Path) -> None:
    profile = CPU_ONLY.model_copy(update={"backend": "lmcache-mp"})
    cuda = render_vllm_launch(profile, vllm_config(device="cuda"), True, tmp_path, port_factory=fixed_ports())
    args = cuda.sidecars[0].args()
    # vLLM's connector on CUDA registers its KV caches for server-driven transfer: engine_driven alone hangs it
    assert args[args.index("--supported-transfer-mode") + 1] == "auto"


def tiered(tmp_path: Path, *, fresh: bool = True, **fields: object) -> OffloadProfile:
    """cpu (1.5 GB) + disk + shared tiers under ``tmp_path``, on backend lmcache-mp unless ``fields`` say otherwise."""
    tiers = (
        OffloadTier(kind="cpu", capacity_gb=1.5),
        OffloadTier(kind="disk", capacity_gb=100, path=str(tmp_path / "disk"), fresh_per_arm=fresh),
        OffloadTier(kind="shared", capacity_gb=1000, path=str(tmp_path / "shared"), fresh_per_arm=fresh),
    )
    return OffloadProfile.model_validate({"name": "tiered", "backend": "lmcache-mp", "tiers": tiers, **fields})


def fs_adapter_paths(plan: VllmLaunchPlan) -> list[str]:
    args = plan.sidecars[0].args()
    return [json.loads(args[i + 1])["base_path"] for i, arg in enumerate(args) if arg == "--l2-adapter"]


def test_lmcache_mp_disk_and_shared_tiers_become_fs_adapters(tmp_path: Path) -> None:
    profile = tiered(tmp_path, chunk_tokens=512)
    plan = render_vllm_launch(profile, vllm_config(device="cpu"), True, tmp_path, port_factory=fixed_ports())
    (server,) = plan.sidecars
    args = server.args()
    assert args[args.index("--l1-size-gb") + 1] == "1.5"
    assert args[args.index("--chunk-size") + 1] == "512"
    adapters = [json.loads(args[i + 1]) for i, arg in enumerate(args) if arg == "--l2-adapter"]
    assert adapters == [
        {"type": "fs", "base_path": str(tmp_path / "disk")},
        {"type": "fs", "base_path": str(tmp_path / "shared")},
    ]
    assert plan.dirs == (tmp_path / "disk",)
    assert plan.must_exist == (tmp_path / "shared",)
    assert any("does not enforce capacity_gb" in note for note in plan.notes)


def test_lmcache_mp_with_a_scope_writes_into_the_sessions_subdirectories(tmp_path: Path) -> None:
    scope = TierScope(session_dir_name("run", "arm", 0, 0, "t"), owner="replica-1")
    config = vllm_config(device="cpu")
    plan = render_vllm_launch(tiered(tmp_path), config, True, tmp_path, port_factory=fixed_ports(), scope=scope)
    disk, shared = tmp_path / "disk" / scope.session / "replica-1", tmp_path / "shared" / scope.session
    assert fs_adapter_paths(plan) == [str(disk), str(shared)]
    assert set(plan.dirs) == {disk, shared}  # created; the shared mount itself must be there already
    assert plan.must_exist == (tmp_path / "shared",)
    assert any(f"disk tier directory {disk} (new for this engine session" in note for note in plan.notes)
    warm = tiered(tmp_path, fresh=False)
    kept = render_vllm_launch(warm, config, True, tmp_path, port_factory=fixed_ports(), scope=scope)
    assert fs_adapter_paths(kept) == [str(tmp_path / "disk"), str(tmp_path / "shared")]  # fresh_per_arm: false
    assert kept.dirs == (tmp_path / "disk",) and kept.must_exist == (tmp_path / "shared",)


def test_lmcache_in_process_with_a_scope_puts_local_disk_in_the_engines_subdirectory(tmp_path: Path) -> None:
    profile = OffloadProfile(
        name="disk",
        backend="lmcache",
        tiers=(
            OffloadTier(kind="cpu", capacity_gb=16),
            OffloadTier(kind="disk", capacity_gb=256, path=str(tmp_path / "kv-disk")),
            OffloadTier(kind="shared", capacity_gb=1024, remote_url="lm://cache-server:65432"),
        ),
    )
    scope = TierScope(session_dir_name("run", "arm", 0, 3, "t"))
    plan = render_vllm_launch(profile, vllm_config(), True, tmp_path, scope=scope)
    disk = tmp_path / "kv-disk" / scope.session / "replica-0"
    assert yaml.safe_load(plan.files[0].text)["local_disk"] == f"file://{disk}/"
    assert disk in plan.dirs
    # a cache server the user runs is not kvbench's to empty, and the manifest says so
    assert yaml.safe_load(plan.files[0].text)["remote_url"] == "lm://cache-server:65432"
    assert any("cannot empty it" in note for note in plan.notes)


def test_ports_of_a_sidecar_are_distinct(tmp_path: Path) -> None:
    values = iter([7000, 7000, 7001, 7001, 7002])
    plan = render_vllm_launch(CPU_ONLY, vllm_config(device="cpu"), True, tmp_path, port_factory=lambda: next(values))
    server = plan.sidecars[0]
    assert (server.port, server.http_port, server.prometheus_port) == (7000, 7001, 7002)


def test_lmcache_in_process_writes_yaml_and_env(tmp_path: Path) -> None:
    disk = tmp_path / "kv-disk"
    profile = OffloadProfile(
        name="disk",
        tiers=(
            OffloadTier(kind="cpu", capacity_gb=16),
            OffloadTier(kind="disk", capacity_gb=256, path=str(disk)),
            OffloadTier(kind="shared", capacity_gb=1024, remote_url="lm://cache-server:65432"),
        ),
    )
    plan = render_vllm_launch(profile, vllm_config(), False, tmp_path)
    assert plan.backend == "lmcache"
    assert plan.args[:2] == ("--no-enable-prefix-caching", "--kv-transfer-config")
    assert json.loads(plan.args[2]) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    (file,) = plan.files
    assert file.path == tmp_path / "lmcache.yaml"
    assert yaml.safe_load(file.text) == {
        "chunk_size": 256,
        "local_cpu": True,
        "max_local_cpu_size": 16,
        "local_disk": f"file://{disk}/",
        "max_local_disk_size": 256,
        "remote_url": "lm://cache-server:65432",
        "remote_serde": "naive",
        "save_unfull_chunk": True,
    }
    assert plan.env == {
        "LMCACHE_CONFIG_FILE": str(tmp_path / "lmcache.yaml"),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
    }
    assert set(plan.dirs) == {disk, tmp_path / "prometheus"}
    assert not plan.sidecars


def test_async_loading_reaches_lmcache_and_only_lmcache(tmp_path: Path) -> None:
    cpu = (OffloadTier(kind="cpu", capacity_gb=16),)
    profile = OffloadProfile(name="async", tiers=cpu, async_loading=True)
    plan = render_vllm_launch(profile, vllm_config(), True, tmp_path)
    assert yaml.safe_load(plan.files[0].text)["enable_async_loading"] is True
    plain = render_vllm_launch(OffloadProfile(name="sync", tiers=cpu), vllm_config(), True, tmp_path)
    assert "enable_async_loading" not in yaml.safe_load(plain.files[0].text)
    for backend in ("native", "lmcache-mp"):
        profile = OffloadProfile(name="x", backend=backend, tiers=cpu, async_loading=True)
        with pytest.raises(ValueError, match="async_loading is LMCache's in-process option"):
            check_supported(profile, vllm_config())


def test_native_offload_flags_in_gib(tmp_path: Path) -> None:
    profile = OffloadProfile(name="native", backend="native", tiers=(OffloadTier(kind="cpu", capacity_gb=64),))
    plan = render_vllm_launch(profile, vllm_config(), True, tmp_path)
    assert plan.backend == "native" and not plan.uses_lmcache
    assert plan.args == (
        "--enable-prefix-caching",
        "--kv-offloading-size",
        "59.605",  # 64e9 bytes / 2**30
        "--kv-offloading-backend",
        "native",
    )


@pytest.mark.parametrize(
    ("profile", "device", "message"),
    [
        (
            OffloadProfile(name="n", backend="native", tiers=(OffloadTier(kind="cpu", capacity_gb=4),)),
            "cpu",
            "backend 'native' does not run on vLLM device 'cpu'",
        ),
        (
            OffloadProfile(name="l", backend="lmcache", tiers=(OffloadTier(kind="cpu", capacity_gb=4),)),
            "cpu",
            "backend 'lmcache' does not run on vLLM device 'cpu'",
        ),
        (BUILTIN_PROFILES["disk"].model_copy(update={"backend": "native"}), "cuda", "CPU tier only"),
        (
            OffloadProfile(name="d", tiers=(OffloadTier(kind="disk", capacity_gb=4, path="/x"),)),
            "cuda",
            "needs a cpu tier",
        ),
        (BUILTIN_PROFILES["shared"], "cuda", "shared tier needs remote_url"),
        (
            OffloadProfile(
                name="s",
                tiers=(
                    OffloadTier(kind="cpu", capacity_gb=4),
                    OffloadTier(kind="shared", capacity_gb=4, remote_url="lm://h:1"),
                ),
            ),
            "cpu",
            "a shared tier is a filesystem path",
        ),
        (
            OffloadProfile(
                name="nodisk",
                tiers=(OffloadTier(kind="cpu", capacity_gb=4), OffloadTier(kind="disk", capacity_gb=4)),
            ),
            "cuda",
            "disk tier needs a path",
        ),
    ],
)
def test_unsupported_combinations_name_what_is_supported(profile: OffloadProfile, device: str, message: str) -> None:
    config = vllm_config(device=device)
    with pytest.raises(ValueError, match=message) as info:
        check_supported(profile, config)
    if "supported:" in str(info.value):
        assert "lmcache-mp on cpu" in str(info.value)
    with pytest.raises(ValueError, match=message):
        VllmEngine(config, LaunchContext(arm="a", profile=profile, log_dir=Path("/nonexistent"), prefix_caching=True))


def test_chunk_must_be_a_multiple_of_block_size() -> None:
    profile = CPU_ONLY.model_copy(update={"chunk_tokens": 200})
    with pytest.raises(ValueError, match="multiple of vLLM's block_size 16"):
        check_supported(profile, vllm_config(block_size=16))
    check_supported(CPU_ONLY, vllm_config(block_size=128))


def test_builtin_profiles_on_cpu() -> None:
    config = vllm_config(device="cpu")
    for name in ("off", "hbm", "cpu", "disk", "shared"):
        check_supported(BUILTIN_PROFILES[name], config)


# ------------------------------------------------------------------------------------- config + argv


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="device 'cpu' only"):
        vllm_config(cpu_kvcache_space_gb=2)
    with pytest.raises(ValidationError, match="cpu_worker_in_engine_core applies to device 'cpu' only"):
        vllm_config(cpu_worker_in_engine_core=True)
    with pytest.raises(ValidationError, match="one worker"):
        vllm_config(device="cpu", cpu_worker_in_engine_core=True, parallelism={"tp": 2})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        vllm_config(gpu_mem=0.5)
    config = vllm_config()
    assert config.startup_timeout_s == 600 and config.launcher == "module" and config.host == "127.0.0.1"


def test_scenario_accepts_engine_kind_vllm() -> None:
    scenario = parse_scenario(
        {
            "name": "vllm-cpu",
            "engine": {"kind": "vllm", "model": "/m/tiny", "device": "cpu", "load_format": "dummy"},
            "arms": [{"name": "off", "offload": "off"}, {"name": "on", "offload": "cpu"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [4000]},
        },
        "test.yaml",
    )
    assert isinstance(scenario.engine, VllmEngineConfig)
    assert "vllm" in engine_kinds()
    for arm in scenario.arms:
        check_supported(arm.profile, scenario.engine)


def test_argv_module_launcher_with_everything(tmp_path: Path) -> None:
    config = vllm_config(
        served_model_name="llama",
        dtype="bfloat16",
        quantization="fp8",
        max_model_len=131072,
        gpu_memory_utilization=0.85,
        load_format="dummy",
        enforce_eager=True,
        max_num_batched_tokens=8192,
        block_size=16,
        num_gpu_blocks_override=20000,
        parallelism={"tp": 2, "pp": 2},
        extra_args=["--api-key", "sk-secret-value-1234", "--seed", "1"],
    )
    plan = render_vllm_launch(CPU_ONLY, config, True, tmp_path)
    argv = build_vllm_argv(config, "/venv/bin/python", 8123, plan)
    assert argv[:5] == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/llama-3.1-8b",
    )
    text = " ".join(argv)
    for expected in (
        "--served-model-name llama",
        "--host 127.0.0.1 --port 8123",
        "--dtype bfloat16 --quantization fp8",
        "--max-model-len 131072",
        "--gpu-memory-utilization 0.85",
        "--load-format dummy",
        "--enforce-eager",
        "--max-num-batched-tokens 8192",
        "--block-size 16 --num-gpu-blocks-override 20000",
        "--tensor-parallel-size 2",
        "--pipeline-parallel-size 2",
        "--enable-prefix-caching --kv-transfer-config",
        "--enable-prompt-tokens-details",
    ):
        assert expected in text
    assert "--data-parallel-size" not in text
    # 2 x 2 ranks, each with its own LMCache engine and CPU buffer: the tier is split between them
    (file,) = plan.files
    cpu_gb = next(tier.capacity_gb for tier in CPU_ONLY.tiers if tier.kind == "cpu")
    assert yaml.safe_load(file.text)["max_local_cpu_size"] == pytest.approx(cpu_gb / 4)
    assert any("per rank" in note for note in plan.notes)
    assert argv[-4:] == ("--api-key", "sk-secret-value-1234", "--seed", "1")  # extra_args come last


def test_argv_script_launcher_and_cpu_env(tmp_path: Path) -> None:
    config = vllm_config(
        launcher="script",
        device="cpu",
        gpu_memory_utilization=0.5,
        cpu_kvcache_space_gb=2,
        env={"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_SERVER_DEV_MODE": "1"},
    )
    plan = render_vllm_launch(BUILTIN_PROFILES["off"], config, True, tmp_path)
    argv = build_vllm_argv(config, "/venv/bin/python", 9000, plan)
    assert argv[:3] == ("/venv/bin/vllm", "serve", "/models/llama-3.1-8b")
    assert "--gpu-memory-utilization" not in argv  # meaningless on cpu
    assert "--served-model-name" in argv and argv[argv.index("--served-model-name") + 1] == "llama-3.1-8b"
    env = build_vllm_env(config, plan)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_cpu_worker_in_the_engine_core_is_asked_for_with_both_switches(tmp_path: Path) -> None:
    # vLLM-CPU swaps "uni" back to its multiprocess executor unless V1 multiprocessing is off as well
    config = vllm_config(device="cpu", cpu_worker_in_engine_core=True)
    plan = render_vllm_launch(BUILTIN_PROFILES["off"], config, True, tmp_path)
    argv = build_vllm_argv(config, "/venv/bin/python", 9000, plan)
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    assert build_vllm_env(config, plan)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    default = vllm_config(device="cpu")
    assert "--distributed-executor-backend" not in build_vllm_argv(default, "/venv/bin/python", 9000, plan)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in build_vllm_env(default, plan)


def test_usage_details_are_asked_for_once(tmp_path: Path) -> None:
    plan = render_vllm_launch(BUILTIN_PROFILES["off"], vllm_config(), True, tmp_path)
    assert build_vllm_argv(vllm_config(), "/venv/bin/python", 9000, plan).count("--enable-prompt-tokens-details") == 1
    given = vllm_config(extra_args=["--enable-prompt-tokens-details"])
    assert build_vllm_argv(given, "/venv/bin/python", 9000, plan).count("--enable-prompt-tokens-details") == 1


# ------------------------------------------------------------------------------------- lifecycle (stand-ins)

FAKE_VLLM_SERVER = '''
"""Stand-in for vllm.entrypoints.openai.api_server: /health, /tokenize, /detokenize, /reset_prefix_cache."""
import argparse, json, os, sys
from aiohttp import web

parser = argparse.ArgumentParser()
parser.add_argument("--model"); parser.add_argument("--served-model-name"); parser.add_argument("--host")
parser.add_argument("--port", type=int)
args, rest = parser.parse_known_args()
with open(os.environ["FAKE_RECORD"], "w") as handle:
    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM", "LMCACHE", "PROMETHEUS"))}
    lmcache_yaml = open(env["LMCACHE_CONFIG_FILE"]).read() if "LMCACHE_CONFIG_FILE" in env else None
    json.dump({"argv": sys.argv[1:], "env": env, "lmcache_yaml": lmcache_yaml}, handle)
refusals = {"left": int(os.environ.get("FAKE_RESET_REFUSALS", "0"))}

async def health(request):
    return web.Response(text="")

async def tokenize(request):
    body = await request.json()
    assert body["model"] == args.served_model_name and body["add_special_tokens"] is False
    tokens = [ord(c) for c in body["prompt"]]
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 8})

async def detokenize(request):
    body = await request.json()
    return web.json_response({"prompt": "".join(chr(t) for t in body["tokens"])})

async def reset(request):
    if os.environ.get("VLLM_SERVER_DEV_MODE") != "1":
        return web.Response(status=404)
    if refusals["left"] > 0:
        refusals["left"] -= 1
        return web.json_response({"success": False})
    return web.json_response({"success": True})

app = web.Application()
app.add_routes([web.get("/health", health), web.post("/tokenize", tokenize), web.post("/detokenize", detokenize),
                web.post("/reset_prefix_cache", reset)])
web.run_app(app, host=args.host, port=args.port, print=None)
'''

FAKE_LMCACHE_MAIN = '''
"""Stand-in for `lmcache server`: answers /healthcheck on --http-port."""
import argparse, os, sys
from aiohttp import web

parser = argparse.ArgumentParser()
parser.add_argument("command"); parser.add_argument("--http-host"); parser.add_argument("--http-port", type=int)
args, rest = parser.parse_known_args()
with open(os.environ["FAKE_LMCACHE_RECORD"], "w") as handle:
    handle.write(" ".join(sys.argv[1:]))

async def healthcheck(request):
    return web.json_response({"status": "healthy"})

app = web.Application()
app.add_routes([web.get("/healthcheck", healthcheck)])
web.run_app(app, host=args.http_host, port=args.http_port, print=None)
'''


def exists(path: Path) -> bool:
    return path.exists()


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_vllm(tmp_path, monkeypatch)


def install_fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PYTHONPATH folder with stand-in ``vllm`` and ``lmcache`` packages (and lmcache's metadata)."""
    site = tmp_path / "site"
    server = site / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.0.1-fake"\n')
    (site / "vllm" / "entrypoints" / "__init__.py").write_text("")
    (server / "__init__.py").write_text("")
    (server / "api_server.py").write_text(textwrap.dedent(FAKE_VLLM_SERVER))
    cli = site / "lmcache" / "cli"
    cli.mkdir(parents=True)
    (site / "lmcache" / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text(textwrap.dedent(FAKE_LMCACHE_MAIN))
    dist = site / "lmcache-0.0.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcache\nVersion: 0.0.2\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.json"))
    monkeypatch.setenv("FAKE_LMCACHE_RECORD", str(tmp_path / "lmcache-record.txt"))
    return site


async def test_engine_lifecycle_with_lmcache_mp_sidecar(
    fake_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RESET_REFUSALS", "2")
    monkeypatch.setattr("harness.engines.vllm.RESET_RETRY_S", 0.01)
    config = vllm_config(
        model=str(tmp_path / "tiny"), python=sys.executable, device="cpu", startup_timeout_s=30, stop_grace_s=5
    )
    context = LaunchContext(arm="on", profile=CPU_ONLY, log_dir=tmp_path / "logs", prefix_caching=True)
    engine = create_engine(config, context)
    assert isinstance(engine, VllmEngine)
    async with engine as running:
        assert running.endpoint.model == "tiny"
        assert running.endpoint.base_url.startswith("http://127.0.0.1:")
        facts = running.facts
        assert facts.kind == "vllm" and facts.version == "0.0.1-fake"
        assert facts.details["lmcache_version"] == "0.0.2"
        assert facts.details["offload_backend"] == "lmcache-mp"
        assert facts.command[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
        assert "lmcache.cli.main server" in facts.details["lmcache_server_command"]
        tokenizer = running.tokenizer()
        assert await tokenizer.encode("abc") == [97, 98, 99]
        assert await tokenizer.decode([104, 105]) == "hi"
        await running.reset_prefix_cache()  # refused twice, then succeeds
        sidecar_pid = running.sidecars[0].pid
        engine_pid = running.pid
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    transfer = json.loads(record["argv"][record["argv"].index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "LMCacheMPConnector"
    lmcache_argv = (tmp_path / "lmcache-record.txt").read_text().split()
    assert transfer["kv_connector_extra_config"]["lmcache.mp.port"] == int(
        lmcache_argv[lmcache_argv.index("--port") + 1]
    )
    assert (tmp_path / "logs" / "engine.log").exists() and (tmp_path / "logs" / "lmcache-server.log").exists()
    for pid in (sidecar_pid, engine_pid):
        assert pid is not None and not exists(Path(f"/proc/{pid}"))  # both stopped (process groups swept)


async def test_lmcache_yaml_is_written_and_removed(
    fake_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "0")  # config.env and kvbench's default win over this
    config = vllm_config(model=str(tmp_path / "m"), python=sys.executable, startup_timeout_s=30, stop_grace_s=5)
    context = LaunchContext(arm="on", profile=CPU_ONLY, log_dir=tmp_path / "logs", prefix_caching=True)
    async with VllmEngine(config, context) as running:
        record = json.loads((tmp_path / "record.json").read_text())
        config_file = Path(record["env"]["LMCACHE_CONFIG_FILE"])
        assert exists(config_file) and exists(Path(record["env"]["PROMETHEUS_MULTIPROC_DIR"]))
        assert yaml.safe_load(record["lmcache_yaml"])["max_local_cpu_size"] == 8
        assert "max_local_cpu_size: 8" in running.facts.details["file:lmcache.yaml"]
        await running.reset_prefix_cache()
    assert not exists(config_file) and not exists(config_file.parent)


async def test_reset_without_dev_mode_is_unsupported(fake_site: Path, tmp_path: Path) -> None:
    config = vllm_config(
        model=str(tmp_path / "m"), python=sys.executable, env={"VLLM_SERVER_DEV_MODE": "0"}, startup_timeout_s=30
    )
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    async with VllmEngine(config, context) as running:
        assert "lmcache_version" not in running.facts.details
        with pytest.raises(PrefixCacheResetUnsupported, match="VLLM_SERVER_DEV_MODE"):
            await running.reset_prefix_cache()


async def test_reset_refused_for_too_long_is_an_error(
    fake_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RESET_REFUSALS", "1000")
    monkeypatch.setattr("harness.engines.vllm.RESET_RETRY_S", 0.0)
    config = vllm_config(model=str(tmp_path / "m"), python=sys.executable, startup_timeout_s=30)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    async with VllmEngine(config, context) as running:
        with pytest.raises(EngineRequestError, match="refused to reset"):
            await running.reset_prefix_cache()


async def test_engine_that_dies_reports_its_log(fake_site: Path, tmp_path: Path) -> None:
    (fake_site / "vllm" / "entrypoints" / "openai" / "api_server.py").write_text(
        "import sys\nprint('RuntimeError: no KV cache space left (fake)')\nsys.exit(3)\n"
    )
    config = vllm_config(model=str(tmp_path / "m"), python=sys.executable, startup_timeout_s=30)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    with pytest.raises(EngineStartError, match=r"(?s)exited with code 3.*no KV cache space left"):
        async with VllmEngine(config, context):
            pass


async def test_a_python_that_passed_is_probed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\necho probed >> {calls}\necho \'KVBENCH_VERSIONS={{"vllm": "0.0-fake", "lmcache": "0.0-fake"}}\'\n'
    )
    python.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "first"))
    first = await probe_versions(str(python), with_lmcache=True)
    first["vllm"] = "changed by a caller"
    assert await probe_versions(str(python), with_lmcache=True) == {"vllm": "0.0-fake", "lmcache": "0.0-fake"}
    assert calls.read_text().count("probed") == 1
    # another import path is another probe; an arm without LMCache asks the same one
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "second"))
    await probe_versions(str(python), with_lmcache=True)
    await probe_versions(str(python), with_lmcache=False)
    assert calls.read_text().count("probed") == 2
    # a failure is not remembered: a python that fails once is asked again
    broken = tmp_path / "broken"
    broken.write_text(f"#!/bin/sh\necho probed >> {calls}\nexit 1\n")
    broken.chmod(0o755)
    for _ in range(2):
        with pytest.raises(EngineStartError, match="'import vllm' failed"):
            await probe_versions(str(broken), with_lmcache=False)
    assert calls.read_text().count("probed") == 4


async def test_replicas_starting_at_once_share_one_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        f"#!/bin/sh\necho probed >> {calls}\nsleep 0.5\n"
        'echo \'KVBENCH_VERSIONS={"vllm": "0.0-fake", "lmcache": null}\'\n'
    )
    python.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shared"))
    found = await asyncio.gather(*(probe_versions(str(python), with_lmcache=False) for _ in range(3)))
    assert found == [{"vllm": "0.0-fake", "lmcache": None}] * 3
    assert calls.read_text().count("probed") == 1
    # the same answer says "no lmcache there" to an arm that needs it, without another import
    with pytest.raises(EngineStartError, match=r"(?s)lmcache is not installed there.*install-vllm-cpu.sh"):
        await probe_versions(str(python), with_lmcache=True)
    assert calls.read_text().count("probed") == 1


async def test_a_start_with_a_python_without_vllm_fails_with_the_probes_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = tmp_path / "python"  # runs the vLLM server module and the probe alike: neither finds vllm
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'vllm'\" >&2\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "empty"))
    config = vllm_config(model=str(tmp_path / "m"), python=str(python), startup_timeout_s=30, stop_grace_s=5)
    context = LaunchContext(arm="off", profile=BUILTIN_PROFILES["off"], log_dir=tmp_path / "logs", prefix_caching=False)
    with pytest.raises(
        EngineStartError, match=r"(?s)'import vllm' failed.*No module named 'vllm'.*install-vllm-cpu.sh"
    ):
        async with VllmEngine(config, context):
            pass


async def test_python_without_vllm_fails_before_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no vllm there (nor, presumably, in kvbench's env)
    try:
        import vllm  # type: ignore[import-not-found]  # noqa: F401  # vllm is optional, absent from the dev env
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("vllm is importable in kvbench's own environment")
    with pytest.raises(EngineStartError, match=r"(?s)'import vllm' failed.*install-vllm-cpu.sh"):
        await probe_versions(sys.executable, with_lmcache=False)
    with pytest.raises(EngineStartError, match="cannot run"):
        await probe_versions(str(tmp_path / "no-such-python"), with_lmcache=False)


@pytest.mark.parametrize(("name", "multicast_free"), sorted(MULTICAST_FREE_ENV.items()))
def test_tensor_parallel_steers_vllm_off_the_multicast_all_reduces(
    name: str, multicast_free: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(name, raising=False)
    one = vllm_config()
    plan = render_vllm_launch(BUILTIN_PROFILES["off"], one, True, tmp_path)
    assert name not in build_vllm_env(one, plan)
    four = vllm_config(parallelism={"tp": 4})
    assert build_vllm_env(four, plan)[name] == multicast_free
    assert build_vllm_env(vllm_config(parallelism={"tp": 2, "pp": 2}), plan)[name] == multicast_free
    # a value the user set (in the scenario or the environment kvbench inherits) is left alone
    assert build_vllm_env(vllm_config(parallelism={"tp": 4}, env={name: "user"}), plan)[name] == "user"
    monkeypatch.setenv(name, "user")
    assert name not in build_vllm_env(four, plan)


def test_the_multicast_free_defaults_name_vllms_variables() -> None:
    assert MULTICAST_FREE_ENV == {SYMM_MEM_ALLREDUCE_ENV: "0", FLASHINFER_ALLREDUCE_ENV: "trtllm"}
    assert (SYMM_MEM_ALLREDUCE_ENV, FLASHINFER_ALLREDUCE_ENV) == (
        "VLLM_ALLREDUCE_USE_SYMM_MEM",
        "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
    )


def test_lmcache_gets_a_fixed_hash_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At TP > 1 the scheduler (lookups) and the workers (stores) are separate processes: with
    randomised hash seeds LMCache's chunk keys differ between them and every turn 2 misses."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    four = vllm_config(parallelism={"tp": 4})
    lmcache = render_vllm_launch(CPU_ONLY, four, True, tmp_path)
    assert lmcache.uses_lmcache
    assert build_vllm_env(four, lmcache)["PYTHONHASHSEED"] == "0"
    assert "PYTHONHASHSEED" not in build_vllm_env(
        four, render_vllm_launch(BUILTIN_PROFILES["off"], four, True, tmp_path)
    )
    assert build_vllm_env(vllm_config(env={"PYTHONHASHSEED": "7"}), lmcache)["PYTHONHASHSEED"] == "7"
    monkeypatch.setenv("PYTHONHASHSEED", "3")  # inherited by the engine: kvbench leaves it
    assert "PYTHONHASHSEED" not in build_vllm_env(four, lmcache)
