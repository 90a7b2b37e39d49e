"""Rendering offload profiles into SGLang launches (HiCache flags), the SGLang command line, and the
scenario checks that keep SGLang arms measurable.

The flags are SGLang's own (``server_args.py``, 0.5.x): ``--enable-hierarchical-cache``,
``--hicache-size`` (whole GB), ``--hicache-write-policy``, ``--hicache-storage-backend file`` with
its directory in ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``, ``--disable-radix-cache``. The
engine lifecycle against a stand-in server is in test_engine_lifecycle.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from common.errors import ScenarioError
from harness.engines.base import LaunchContext
from harness.engines.configs import SglangEngineConfig
from harness.engines.sglang import SglangEngine, build_sglang_argv, build_sglang_env, served_model_name
from harness.engines.sglang_offload import STORAGE_DIR_ENV, SUPPORTED, check_supported, render_sglang_launch
from harness.scenario.spec import parse_scenario
from offload.profiles import BUILTIN_PROFILES, OffloadProfile, OffloadTier, TierScope, session_dir_name


def sglang_config(**overrides: Any) -> SglangEngineConfig:
    return SglangEngineConfig.model_validate(
        {"kind": "sglang", "model": "/models/Qwen2.5-7B-Instruct", "python": "/venv/bin/python", **overrides}
    )


def profile(*tiers: OffloadTier, **fields: Any) -> OffloadProfile:
    return OffloadProfile(name=fields.pop("name", "p"), tiers=tiers, **fields)


CPU = OffloadTier(kind="cpu", capacity_gb=64)
DISK = OffloadTier(kind="disk", capacity_gb=500, path="/nvme/hicache")
SHARED = OffloadTier(kind="shared", capacity_gb=2000, path="/mnt/shared/hicache")


# ------------------------------------------------------------------------------------- rendering


def test_profiles_without_tiers_only_toggle_the_radix_cache() -> None:
    config = sglang_config()
    assert render_sglang_launch(BUILTIN_PROFILES["hbm"], config, True).args == ()
    assert render_sglang_launch(BUILTIN_PROFILES["off"], config, True).args == ("--disable-radix-cache",)
    runner_off = render_sglang_launch(BUILTIN_PROFILES["hbm"], config, False)  # between_turns=disable_prefix_cache
    assert runner_off.args == ("--disable-radix-cache",) and not runner_off.prefix_caching
    assert not runner_off.hierarchical and runner_off.env == {}


def test_cpu_tier_is_the_hicache_host_pool() -> None:
    plan = render_sglang_launch(BUILTIN_PROFILES["cpu"], sglang_config(), True)
    assert plan.args == (
        "--enable-hierarchical-cache",
        "--hicache-size",
        "64",
        "--hicache-write-policy",
        "write_through",
    )
    assert plan.hierarchical and plan.prefix_caching and plan.env == {} and plan.storage_dir is None
    assert any("chunk_tokens (256) is not used" in note for note in plan.notes)


def test_host_pool_size_is_whole_gb() -> None:
    plan = render_sglang_launch(profile(OffloadTier(kind="cpu", capacity_gb=12.7)), sglang_config(), True)
    assert plan.args[plan.args.index("--hicache-size") + 1] == "12"
    assert any("rounded down to --hicache-size 12" in note for note in plan.notes)
    with pytest.raises(ValueError, match=r"must be at least 1 GB each\. Supported: backend auto or native"):
        check_supported(profile(OffloadTier(kind="cpu", capacity_gb=0.5)), sglang_config())


def test_host_pool_is_sized_per_gpu_rank() -> None:
    plan = render_sglang_launch(BUILTIN_PROFILES["cpu"], sglang_config(parallelism={"tp": 2}), True)
    assert plan.args[plan.args.index("--hicache-size") + 1] == "32"  # each rank's scheduler owns a pool
    assert any("over 2 GPU ranks: --hicache-size 32 per rank" in note for note in plan.notes)
    odd = profile(OffloadTier(kind="cpu", capacity_gb=12))
    plan = render_sglang_launch(odd, sglang_config(parallelism={"tp": 4, "dp": 2}), True)
    assert plan.args[plan.args.index("--hicache-size") + 1] == "1"
    assert any("rounded down" in note for note in plan.notes)
    with pytest.raises(ValueError, match=r"over 16 rank\(s\) must be at least 1 GB each"):
        check_supported(odd, sglang_config(parallelism={"tp": 8, "dp": 2}))


def test_disk_tier_is_the_file_storage_backend() -> None:
    config = sglang_config(hicache_write_policy="write_back", hicache_storage_prefetch_policy="wait_complete")
    plan = render_sglang_launch(profile(CPU, DISK), config, True)
    text = " ".join(plan.args)
    assert "--hicache-write-policy write_back" in text
    assert "--hicache-storage-backend file --hicache-storage-prefetch-policy wait_complete" in text
    assert plan.env == {STORAGE_DIR_ENV: "/nvme/hicache"} and plan.storage_dir == Path("/nvme/hicache")
    assert plan.dirs == (Path("/nvme/hicache"),) and plan.must_exist == ()
    assert any("does not enforce capacity_gb (500 GB)" in note for note in plan.notes)


def test_storage_dir_with_a_scope_is_the_sessions_subdirectory() -> None:
    scope = TierScope(session_dir_name("run", "arm", 0, 0, "t"), owner="replica-2")
    shared = render_sglang_launch(profile(CPU, SHARED), sglang_config(), True, scope)
    assert shared.env[STORAGE_DIR_ENV] == f"/mnt/shared/hicache/{scope.session}"
    assert shared.dirs == (Path(f"/mnt/shared/hicache/{scope.session}"),)
    assert shared.must_exist == (Path("/mnt/shared/hicache"),)
    disk = render_sglang_launch(profile(CPU, DISK), sglang_config(), True, scope)
    assert disk.storage_dir == Path(f"/nvme/hicache/{scope.session}/replica-2") and disk.dirs == (disk.storage_dir,)
    warm = render_sglang_launch(
        profile(CPU, DISK.model_copy(update={"fresh_per_arm": False})), sglang_config(), True, scope
    )
    assert warm.storage_dir == Path("/nvme/hicache")
    assert any("used as given (fresh_per_arm: false)" in note for note in warm.notes)


def test_shared_tier_directory_must_already_exist() -> None:
    plan = render_sglang_launch(BUILTIN_PROFILES["shared"], sglang_config(), True)
    assert plan.must_exist == (Path("/mnt/kvbench-shared"),) and plan.dirs == ()
    assert plan.env[STORAGE_DIR_ENV] == "/mnt/kvbench-shared"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (profile(CPU, backend="lmcache"), "backend 'lmcache' is vLLM's"),
        (profile(CPU, backend="lmcache-mp"), "backend 'lmcache-mp' is vLLM's"),
        (profile(DISK), r"need a cpu tier"),
        (profile(CPU, DISK, SHARED), "disk tier or a shared tier, not both"),
        (profile(CPU, OffloadTier(kind="shared", capacity_gb=10, remote_url="lm://cache:65432")), "remote_url"),
        (profile(CPU, OffloadTier(kind="disk", capacity_gb=10)), "needs a path"),
        (profile(CPU, prefix_caching=False), "need prefix_caching: true"),
    ],
)
def test_unsupported_profiles_say_what_is_supported(bad: OffloadProfile, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_supported(bad, sglang_config())
    with pytest.raises(ValueError, match=message):
        render_sglang_launch(bad, sglang_config(), True)


def test_every_error_lists_the_supported_setups() -> None:
    with pytest.raises(ValueError) as caught:
        check_supported(profile(CPU, backend="lmcache"), sglang_config())
    assert SUPPORTED in str(caught.value)


def test_tiers_need_the_radix_cache() -> None:
    with pytest.raises(ValueError, match="HiCache cannot run without SGLang's radix cache"):
        render_sglang_launch(BUILTIN_PROFILES["cpu"], sglang_config(), False)


def test_between_turns_modes_that_cannot_measure_tiers_are_refused() -> None:
    config = sglang_config()
    with pytest.raises(ValueError, match=r"flush_cache also empties HiCache's host pool.*'filler'"):
        check_supported(BUILTIN_PROFILES["cpu"], config, between_turns="reset_prefix_cache")
    with pytest.raises(ValueError, match=r"--disable-radix-cache.*'filler'"):
        check_supported(BUILTIN_PROFILES["disk"], config, between_turns="disable_prefix_cache")
    for mode in ("filler", "none", None):
        check_supported(BUILTIN_PROFILES["disk"], config, between_turns=mode)
    for name in ("off", "hbm"):  # no tiers: a flush only drops the GPU cache
        check_supported(BUILTIN_PROFILES[name], config, between_turns="reset_prefix_cache")
        check_supported(BUILTIN_PROFILES[name], config, between_turns="disable_prefix_cache")


def test_engine_checks_the_profile_when_created(tmp_path: Path) -> None:
    context = LaunchContext(arm="a", profile=profile(CPU, backend="lmcache"), log_dir=tmp_path, prefix_caching=True)
    with pytest.raises(ValueError, match="vLLM's"):
        SglangEngine(sglang_config(), context)
    with pytest.raises(TypeError, match="SglangEngineConfig"):
        SglangEngine(BUILTIN_PROFILES["cpu"], context)  # type: ignore[arg-type]  # wrong on purpose: the runtime check


# ------------------------------------------------------------------------------------- config + argv


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        sglang_config(hicache_ratio=2)
    with pytest.raises(ValidationError):
        sglang_config(hicache_write_policy="write_sometimes")
    config = sglang_config()
    assert config.enable_metrics and config.host == "127.0.0.1" and config.startup_timeout_s == 900


def test_argv_with_everything() -> None:
    config = sglang_config(
        served_model_name="qwen",
        dtype="bfloat16",
        context_length=32768,
        mem_fraction_static=0.8,
        load_format="dummy",
        page_size=64,
        chunked_prefill_size=8192,
        skip_server_warmup=True,
        parallelism={"tp": 2, "pp": 2, "dp": 2},
        extra_args=["--api-key", "sk-secret-value-1234", "--random-seed", "1"],
    )
    plan = render_sglang_launch(profile(CPU, DISK), config, True)
    argv = build_sglang_argv(config, "/venv/bin/python", 30000, plan)
    assert argv[:13] == (
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Qwen2.5-7B-Instruct",
        "--served-model-name",
        "qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--enable-cache-report",
        "--enable-metrics",
    )
    text = " ".join(argv)
    for expected in (
        "--dtype bfloat16",
        "--context-length 32768",
        "--mem-fraction-static 0.8",
        "--load-format dummy",
        "--page-size 64",
        "--chunked-prefill-size 8192",
        "--skip-server-warmup",
        "--tp-size 2 --pp-size 2 --dp-size 2",
        "--enable-hierarchical-cache --hicache-size 8",  # 64 GB over tp*pp*dp = 8 ranks
    ):
        assert expected in text, expected
    assert argv[-4:] == ("--api-key", "sk-secret-value-1234", "--random-seed", "1")  # extra_args last, as given
    env = build_sglang_env(config.model_copy(update={"env": {STORAGE_DIR_ENV: "/override"}}), plan)
    assert env == {"PYTHONUNBUFFERED": "1", STORAGE_DIR_ENV: "/override"}  # config.env wins


def test_metrics_flag_can_be_turned_off() -> None:
    config = sglang_config(enable_metrics=False)
    argv = build_sglang_argv(config, "python", 1, render_sglang_launch(BUILTIN_PROFILES["off"], config, True))
    assert "--enable-metrics" not in argv and "--enable-cache-report" in argv
    assert argv[-1] == "--disable-radix-cache"


def test_served_name() -> None:
    assert served_model_name(sglang_config()) == "Qwen2.5-7B-Instruct"
    assert served_model_name(sglang_config(model="synth:llama-3.1-8b")) == "llama-3.1-8b"
    assert served_model_name(sglang_config(served_model_name="q")) == "q"


# ------------------------------------------------------------------------------------- scenarios


def scenario(between: str | None, *arms: tuple[str, Any]) -> dict[str, Any]:
    workload: dict[str, Any] = {"kind": "multi_round_qa", "context_tokens": [4000]}
    if between is not None:
        workload["between_turns"] = (
            {"mode": between, "filler_tokens": 200000} if between == "filler" else {"mode": between}
        )
    return {
        "name": "sglang",
        "engine": {"kind": "sglang", "model": "/m/qwen", "load_format": "dummy"},
        "arms": [{"name": name, "offload": offload} for name, offload in arms],
        "workload": workload,
    }


def test_scenario_with_sglang_arms() -> None:
    ok = parse_scenario(scenario("filler", ("off", "hbm"), ("cpu", "cpu"), ("disk", "disk")), "s.yaml")
    assert isinstance(ok.engine, SglangEngineConfig)
    parse_scenario(scenario("reset_prefix_cache", ("off", "off"), ("hbm", "hbm")), "s.yaml")  # fine without tiers
    with pytest.raises(ScenarioError, match=r"arm 'cpu'.*flush_cache.*'filler'"):
        parse_scenario(scenario("reset_prefix_cache", ("off", "hbm"), ("cpu", "cpu")), "s.yaml")
    # the default, auto, takes no reset from an arm with HiCache (its flush would empty the tier): filler instead
    parse_scenario(scenario(None, ("off", "hbm"), ("cpu", "cpu")), "s.yaml")
    with pytest.raises(ScenarioError, match=r"arm 'disk'.*disable-radix-cache"):
        parse_scenario(scenario("disable_prefix_cache", ("disk", "disk")), "s.yaml")
    lmcache = {"name": "lm", "backend": "lmcache", "tiers": [{"kind": "cpu", "capacity_gb": 8}]}
    with pytest.raises(ScenarioError, match=r"arm 'lm'.*vLLM's"):
        parse_scenario(scenario("filler", ("lm", lmcache)), "s.yaml")
