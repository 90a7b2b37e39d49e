"""The simulator's profiles and time model: sizes from config values, times from physics."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.engines.configs import Parallelism
from harness.sim.config import SimEngineConfig
from harness.sim.settings import SimSettings
from harness.sim.timemodel import StepWork, TimeModel
from offload.profiles import BUILTIN_PROFILES
from offload.shapes import HARDWARE, MODELS, SHIPPED_DEPLOYMENTS, Deployment, Dtype


def timing(model: str, hardware: str = "h100-sxm", tp: int = 1, dtype: Dtype | None = None) -> TimeModel:
    m = MODELS[model]
    return TimeModel(Deployment(m, HARDWARE[hardware], tp, dtype or m.dtype))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_counts_match_the_shapes(name: str) -> None:
    model = MODELS[name]
    assert model.counted_params() == pytest.approx(model.params, rel=0.01)


def test_kv_sizes_of_llama_8b() -> None:
    deployment = Deployment.resolve("llama-3.1-8b", "h100-sxm")
    assert deployment.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    # ~(0.9 x 85.5 GB - 16 GB weights - activations - runtime) / 128 KiB: vLLM reports ~450k tokens
    assert 400_000 < deployment.kv_cache_tokens(0.9, 8192) < 500_000
    fp8 = Deployment.resolve("llama-3.1-70b", "h100-sxm", tp=8, dtype="fp8")
    assert fp8.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 1  # one KV head per GPU at tp 8


@pytest.mark.parametrize(("model", "hardware", "tp", "dtype", "kv_dtype"), SHIPPED_DEPLOYMENTS)
def test_shipped_deployments_fit_their_context(
    model: str, hardware: str, tp: int, dtype: Dtype, kv_dtype: Dtype | None
) -> None:
    deployment = Deployment.resolve(model, hardware, tp, dtype, kv_dtype)
    assert deployment.kv_cache_tokens(0.9, 8192) >= deployment.model.max_position_embeddings


def test_cold_128k_prefill_of_llama_8b_on_h100_is_about_ten_seconds() -> None:
    seconds = timing("llama-3.1-8b").prefill_seconds(131072)
    assert 8.0 < seconds < 12.0


def test_prefill_grows_superlinearly_with_context() -> None:
    model = timing("llama-3.1-8b")
    short, long = model.prefill_seconds(16384), model.prefill_seconds(131072)
    assert long > 8 * short * 1.5  # 8x the tokens costs well over 8x the time (causal attention)
    # the same 8k-token chunk costs more the more context sits before it
    early, late = StepWork(), StepWork()
    early.add_prefill(8192, 0)
    late.add_prefill(8192, 120_000)
    assert model.step_seconds(late) > 2 * model.step_seconds(early)


def test_tensor_parallel_is_faster() -> None:
    tp1, tp8 = timing("llama-3.1-70b", tp=1), timing("llama-3.1-70b", tp=8)
    assert tp8.prefill_seconds(32768) < tp1.prefill_seconds(32768) / 4
    assert tp8.decode_step_seconds(8, 4096) < tp1.decode_step_seconds(8, 4096) / 3
    # the all-reduces are not free: tp 8 is short of a perfect 8x
    assert tp8.prefill_seconds(32768) > tp1.prefill_seconds(32768) / 8
    assert tp8.cost(StepWork(tokens=1, attention_pairs=1, kv_tokens=1)).allreduce_s > 0


def test_fp8_is_faster_than_bf16_for_70b() -> None:
    fp16, fp8 = timing("llama-3.1-70b", tp=8, dtype="fp16"), timing("llama-3.1-70b", tp=8, dtype="fp8")
    assert fp8.prefill_seconds(8192) < 0.8 * fp16.prefill_seconds(8192)
    assert fp8.decode_step_seconds(1, 4096) < 0.8 * fp16.decode_step_seconds(1, 4096)


def test_decode_is_memory_bound_and_h200_is_faster() -> None:
    h100, h200 = timing("llama-3.1-8b"), timing("llama-3.1-8b", "h200-sxm")
    cost = h100.cost(StepWork(tokens=1, attention_pairs=1000, kv_tokens=1000))
    assert cost.memory_s > cost.compute_s
    assert 5e-3 < h100.decode_step_seconds(1, 1000) < 9e-3  # ~16 GB of weights at ~2.8 TB/s
    assert h200.decode_step_seconds(1, 1000) < h100.decode_step_seconds(1, 1000)
    # more sequences and longer contexts read more KV
    assert h100.decode_step_seconds(64, 8192) > h100.decode_step_seconds(1, 8192)


def test_settings_validate_the_deployment() -> None:
    SimSettings(model="qwen3-14b", hardware="h100-sxm")
    with pytest.raises(ValidationError, match="unknown simulator model"):
        SimSettings(model="gpt-9", hardware="h100-sxm")
    with pytest.raises(ValidationError, match="no room for a KV cache"):
        SimSettings(model="llama-3.1-70b", hardware="h100-sxm", tp=1)
    with pytest.raises(ValidationError, match="does not divide"):
        SimSettings(model="qwen3-14b", hardware="h100-sxm", tp=3)


def test_settings_from_engine_config() -> None:
    config = SimEngineConfig(
        kind="sim", model="llama-3.1-70b", hardware="h100-sxm", parallelism=Parallelism(tp=8), dtype="fp8"
    )
    settings = SimSettings.from_engine_config(config, BUILTIN_PROFILES["cpu"], prefix_caching=False)
    assert settings.tp == 8 and settings.dtype == "fp8" and settings.offload.name == "cpu"
    assert not settings.hbm_prefix_caching
    assert SimSettings.model_validate_json(settings.model_dump_json()) == settings
    # refused when the scenario is validated (kvbench validate), not when the simulator starts
    with pytest.raises(ValueError, match="tensor parallelism only"):
        SimEngineConfig.model_validate({**config.model_dump(), "parallelism": Parallelism(tp=8, dp=2)})


def test_fp8_weights_with_a_bf16_kv_cache() -> None:
    # vLLM's --quantization fp8: weights and GEMMs in FP8, the KV cache in --dtype (bf16)
    mixed = Deployment.resolve("llama-3.1-70b", "h200-sxm", 4, "fp8", "bf16")
    fp8 = Deployment.resolve("llama-3.1-70b", "h200-sxm", 4, "fp8")
    bf16 = Deployment.resolve("llama-3.1-70b", "h200-sxm", 4, "bf16")
    m = MODELS["llama-3.1-70b"]
    assert mixed.kv_bytes_per_token == bf16.kv_bytes_per_token == 2 * m.layers * m.kv_heads * m.head_dim * 2
    assert fp8.kv_bytes_per_token == mixed.kv_bytes_per_token // 2
    assert mixed.weight_bytes_per_gpu == fp8.weight_bytes_per_gpu == m.params / 4
    # bf16 KV holds half the tokens of fp8 KV in the same (fp8-weight) free memory
    free = mixed.kv_cache_bytes_per_gpu(0.9, 8192)
    assert mixed.kv_cache_tokens(0.9, 8192) == int(free // (2 * m.layers * 2 * m.head_dim * 2))
    assert mixed.label == "llama-3.1-70b fp8 weights, bf16 KV on 4x h200-sxm"
    # a KV dtype equal to the weights' is the default spelling
    assert Deployment.resolve("llama-3.1-70b", "h200-sxm", 4, "bf16", "bf16") == bf16
    # GEMMs at the FP8 rate (as fp8), attention KV reads at the bf16 size
    work = StepWork()
    work.add_prefill(8192, 0)
    assert TimeModel(mixed).cost(work).compute_s == pytest.approx(TimeModel(fp8).cost(work).compute_s)
    decode = StepWork()
    decode.add_decode(100_000)
    assert TimeModel(mixed).cost(decode).memory_s > TimeModel(fp8).cost(decode).memory_s


def test_the_host_term_grows_with_the_sequences_in_a_step_and_intake_adds() -> None:
    from harness.sim.timemodel import Efficiencies

    deployment = Deployment.resolve("llama-3.1-8b", "h100-sxm")
    # host-bound steps (eager mode's overhead outlasts these steps' GPU work), so the host term shows whole
    per_seq, overhead = 0.7e-3, 0.060
    bare = TimeModel(deployment, Efficiencies(step_overhead_s=overhead))
    host = TimeModel(deployment, Efficiencies(step_overhead_s=overhead, step_s_per_seq=per_seq))
    for batch in (1, 4, 11):
        assert host.decode_step_seconds(batch, 9000) - bare.decode_step_seconds(batch, 9000) == pytest.approx(
            batch * per_seq
        )
    # a prefill chunk is one sequence, whatever its length; so is each decode beside it
    mixed = StepWork()
    mixed.add_prefill(200, 2000)
    mixed.add_decode(9000)
    mixed.add_decode(9000)
    assert mixed.sequences == 3
    assert host.cost(mixed).host_s == pytest.approx(3 * per_seq)
    assert host.step_seconds(mixed) - bare.step_seconds(mixed) == pytest.approx(3 * per_seq)
    # intake work charged to a step adds to it as it is
    mixed.intake_s = 0.0123
    assert host.cost(mixed).total_s == pytest.approx(bare.step_seconds(mixed) + 3 * per_seq)
    assert host.cost(mixed).intake_s == 0.0123
    # the datasheet model has no host term
    assert TimeModel(deployment).cost(mixed).host_s == 0.0


def test_the_decode_read_grows_with_the_running_sequences_contexts_and_adds_beyond_the_host() -> None:
    from harness.sim.timemodel import Efficiencies

    deployment = Deployment.resolve("llama-3.1-8b", "h200-sxm")
    per_ktoken, overhead = 7e-5, 0.016
    bare = TimeModel(deployment, Efficiencies(step_overhead_s=overhead))
    read = TimeModel(deployment, Efficiencies(step_overhead_s=overhead, decode_s_per_ktoken=per_ktoken))
    # host-bound steps: the GPU's own KV read hides under the host, this term does not
    for batch, context in ((1, 1000), (3, 30_000), (9, 10_000)):
        extra = read.decode_step_seconds(batch, context) - bare.decode_step_seconds(batch, context)
        assert extra == pytest.approx(batch * (context + 1) * per_ktoken / 1000)
    # a prefill chunk's context is not decode's: a step of prefill alone pays nothing more
    prefill = StepWork()
    prefill.add_prefill(4000, 60_000)
    assert prefill.decode_kv_tokens == 0 and read.step_seconds(prefill) == bare.step_seconds(prefill)
    prefill.add_decode(20_000)
    assert read.cost(prefill).decode_read_s == pytest.approx(20_001 * per_ktoken / 1000)
    # the datasheet model has no such term
    assert TimeModel(deployment).cost(prefill).decode_read_s == 0.0


def test_a_step_is_as_long_as_the_slower_of_host_and_gpu() -> None:
    """The host launches a step's kernels while the GPU runs them, so a short step takes the host's time and a
    long prefill the GPU's; a blocking store still adds after the forward pass."""
    from harness.sim.timemodel import Efficiencies

    deployment = Deployment.resolve("llama-3.1-8b", "h100-sxm")
    host_s = 0.017  # eager mode's host time per step on the measured 1x H100 (vLLM 0.26.0)
    model = TimeModel(deployment, Efficiencies(step_overhead_s=host_s, store_latency_s=0.004))
    decode = StepWork()
    decode.add_decode(1000)
    assert model.cost(decode).gpu_s < host_s  # 16 GB of weights at 3.35 TB/s: a few ms
    assert model.step_seconds(decode) == pytest.approx(host_s)
    prefill = StepWork()
    prefill.add_prefill(8000, 0)
    gpu_prefill = model.cost(prefill).gpu_s
    assert gpu_prefill > host_s
    assert model.step_seconds(prefill) == pytest.approx(gpu_prefill + 0.004)


def test_a_prefill_step_has_its_own_host_floor_where_one_is_given() -> None:
    """``prefill_host_s``: eager mode's short prompts take about as long whatever their length (vLLM 0.26.0
    --enforce-eager, 8B on one H200: 42-43 ms from 250 to 1,500 tokens) until the GPU's work outlasts it;
    decode steps keep the step overhead, and a step mixing both takes the prefill's."""
    from harness.sim.timemodel import Efficiencies

    deployment = Deployment.resolve("llama-3.1-8b", "h200-sxm")
    floor_s, step_s = 0.040, 0.016
    floored = TimeModel(deployment, Efficiencies(step_overhead_s=step_s, prefill_host_s=floor_s))
    plain = TimeModel(deployment, Efficiencies(step_overhead_s=step_s))
    short, long = StepWork(), StepWork()
    short.add_prefill(500, 0)
    long.add_prefill(8000, 0)
    assert floored.cost(short).gpu_s < floor_s < floored.cost(long).gpu_s
    assert floored.step_seconds(short) == pytest.approx(floor_s)
    assert plain.step_seconds(short) == pytest.approx(max(step_s, plain.cost(short).gpu_s))
    assert floored.step_seconds(long) == pytest.approx(plain.step_seconds(long))  # the GPU hides it
    decode = StepWork()
    decode.add_decode(1000)
    assert floored.step_seconds(decode) == pytest.approx(step_s)
    decode.add_prefill(64, 1000)  # a turn-2 prefill of a question beside a decoding request
    assert floored.step_seconds(decode) == pytest.approx(floor_s)
