"""``harness.calibrate.fit``: the fit recovers parameters the simulator was run with.

The "measured" run directory is written from the simulator's engine core (the scheduler, the
offload tiers and the time model on a virtual clock, not the closed-form formula the fit uses)
with a chosen calibration applied; the fit must find that calibration again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from common.errors import CalibrationError
from harness.calibrate.fit import calibrate, front_slope
from harness.calibrate.samples import ENGINE_CLOCK, LMCACHE_LOG, FrontSample, collect, front_samples, run_facts
from harness.calibrate.whatif import _run
from harness.scenario.spec import parse_scenario
from harness.sim.calibration import BackendCalibration, CalibratedDeployment, Calibration, FitParam
from harness.sim.scheduler import EngineCore, SimRequest, ignore_event
from harness.sim.settings import SimSettings
from harness.store.events import MetricsDelta
from harness.store.jsonl import append_jsonl
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from offload.profiles import OffloadProfile, OffloadTier
from offload.shapes import Deployment
from tests.resultfiles import request_record

LENGTHS = (1000, 4000, 16000, 64000)
OUTPUT_TOKENS = 8
QUESTION = 64


def _p(value: float, unit: str = "") -> FitParam:
    return FitParam(value=value, unit=unit, fitted=True, source="chosen")


def chosen(hardware: str = "h100-sxm") -> Calibration:
    return Calibration(
        deployment=CalibratedDeployment(
            model="llama-3.1-8b",
            hardware=hardware,
            tp=1,
            dtype="bf16",
            engine="vllm",
            engine_version="9.9.9",
            cuda_graphs=True,
        ),
        sources=[],
        fit_context_tokens=list(LENGTHS),
        holdout_context_tokens=[],
        max_batch_tokens=8192,
        request_overhead_s=_p(0.030),
        request_overhead_s_per_ktoken=_p(0.0),
        linear_efficiency=_p(0.50),
        attention_efficiency=_p(0.40),
        # host-bound decode steps up to 16k of context (9 ms of host work against 7-8 ms of reads),
        # memory-bound at 64k: both the host's part and the HBM rate show
        step_overhead_s=_p(0.009),
        hbm_efficiency=_p(0.70),
        step_s_per_seq=_p(0.0),
        decode_s_per_ktoken=_p(0.0),
        prefill_host_s=FitParam(value=0.009, unit="s", fitted=False, source="the step overhead"),
        engine_blocking_share=_p(0.0),
        holdout_loads=[],
        warnings=[],
        residuals=[],
        decode_residuals=[],
        tpot_residuals=[],
        power=None,
        backends={
            "lmcache": BackendCalibration(
                version="0.0.1",
                tier="cpu",
                load_gbps=_p(12.0),
                load_latency_s=_p(0.020),
                store_s_per_gb=_p(0.05),
                store_latency_s=_p(0.015),
                busy_intake_s=_p(0.0),
                step_extra_s=_p(0.0),
            )
        },
    )


ARMS = {
    "OFF": OffloadProfile(name="off", prefix_caching=False),
    "LMC": OffloadProfile(name="lmc", tiers=(OffloadTier(kind="cpu", capacity_gb=60),), backend="lmcache"),
}


def write_run(
    path: Path,
    truth: Calibration,
    gpu: str = "NVIDIA H100 80GB HBM3",
    arms: dict[str, OffloadProfile] | None = None,
    keep_hbm: frozenset[str] = frozenset(),
    engine: dict[str, object] | None = None,
    lengths: tuple[int, ...] = LENGTHS,
) -> Path:
    """A probe run directory whose records the simulator's engine core produced under ``truth``.

    ``engine``: more fields of the run's vLLM engine section (they change its deployment, not the records).
    """
    arms = arms if arms is not None else ARMS
    engine_section: dict[str, object] = {"kind": "vllm", "model": "synth:llama-3.1-8b", **(engine or {})}
    scenario = parse_scenario(
        {
            "name": "calib-truth",
            "engine": engine_section,
            "arms": [{"name": name, "offload": profile.model_dump(mode="json")} for name, profile in arms.items()],
            "workload": {"kind": "multi_round_qa", "context_tokens": list(lengths), "conversations": 1, "turns": 2},
        },
        "test",
    )
    run_dir = RunDir.create(path, scenario)
    engines = {}
    for arm, profile in arms.items():
        details = {"offload_backend": profile.backend if profile.tiers else "none", "lmcache_version": "0.0.1"}
        engines[arm] = {"kind": "vllm", "version": "9.9.9", "details": details}
        core = EngineCore(SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=profile, calibration=truth))
        now = 0.0
        for length in lengths:
            prompt = [1000 + (i * 7 + length) % 50000 for i in range(length)]
            for turn, tokens in ((1, prompt), (2, prompt + list(range(7, 7 + QUESTION)))):
                request = SimRequest(f"{arm}-{length}-{turn}", tokens, OUTPUT_TOKENS, ignore_event)
                end = _run(core, request, now)
                assert request.first_token_at is not None
                ttft = request.first_token_at - request.arrival
                step = (end - request.first_token_at) / (OUTPUT_TOKENS - 1)
                record = request_record(
                    arm,
                    length,
                    0,
                    turn,
                    request_id=request.request_id,
                    started_ns=int(now * 1e9),
                    ttft_ns=int(ttft * 1e9),
                    e2e_ns=int((end - now) * 1e9),
                    itl_ns=[int(step * 1e9)] * (OUTPUT_TOKENS - 1),
                    output_chunks=OUTPUT_TOKENS,
                    prompt_tokens=len(tokens),
                    completion_tokens=OUTPUT_TOKENS,
                    ok=True,
                )
                append_jsonl(run_dir.records_file, record)
                values = {
                    "gpu_prefix_hits": float(request.hbm_hit_tokens),
                    "external_prefix_hits": float(request.external_tokens),
                    "prompt_tokens": float(len(tokens)),
                }
                delta = MetricsDelta(arm=arm, attempt=0, repetition=0, context_tokens=length, turn=turn, values=values)
                append_jsonl(run_dir.metrics_file, delta)
                now = end + 1.0  # tier writes are ready at once under a calibration
                if arm not in keep_hbm:  # an arm in keep_hbm serves turn 2 from the HBM prefix cache
                    core.reset_prefix_cache()
    manifest = {"run_id": run_dir.run_id, "engines": engines, "host": {"gpus": [{"name": gpu}]}}
    run_dir.manifest_file.write_text(json.dumps(manifest), encoding="utf-8")
    return run_dir.path


def test_fit_recovers_the_parameters_the_simulator_ran_with(tmp_path: Path) -> None:
    truth = chosen()
    fitted = calibrate([write_run(tmp_path, truth)])
    assert fitted.deployment == truth.deployment
    for name in (
        "request_overhead_s",
        "linear_efficiency",
        "attention_efficiency",
        "step_overhead_s",
        "hbm_efficiency",
    ):
        got, want = getattr(fitted, name), getattr(truth, name)
        assert got.fitted, name
        assert got.value == pytest.approx(want.value, rel=0.03), name
    lmc, want_lmc = fitted.backends["lmcache"], truth.backends["lmcache"]
    assert lmc.version == "0.0.1"
    assert lmc.load_gbps.value == pytest.approx(want_lmc.load_gbps.value, rel=0.03)
    assert lmc.load_latency_s.value == pytest.approx(want_lmc.load_latency_s.value, rel=0.05)
    assert lmc.store_s_per_gb.value == pytest.approx(want_lmc.store_s_per_gb.value, rel=0.05)
    assert lmc.store_latency_s.fitted
    assert lmc.store_latency_s.value == pytest.approx(want_lmc.store_latency_s.value, rel=0.05)
    # the arm's steps are the arm without a tier's: no per-step cost of the backend
    assert lmc.step_extra_s.fitted and lmc.step_extra_s.value < 1e-4
    # no request was served from the HBM prefix cache: the growth term is not determined
    assert not fitted.request_overhead_s_per_ktoken.fitted
    # every prefill step's host part is the step overhead: no floor of its own
    assert fitted.prefill_host_s is not None and not fitted.prefill_host_s.fitted
    assert all(abs(r.error) < 0.02 for r in fitted.residuals)
    assert {(r.arm, r.context_tokens, r.turn) for r in fitted.residuals} == {
        (arm, n, t) for arm in ARMS for n in LENGTHS for t in (1, 2)
    }


def test_a_backends_per_step_cost_is_fitted_against_the_arm_without_a_tier(tmp_path: Path) -> None:
    """A backend whose connector adds work to every engine step (LMCache at TP=4: +17 to +74 % per decode
    step, measured) slows its arm's steps only; the fit finds it and keeps the shared step overhead."""
    truth = chosen()
    lmcache = truth.backends["lmcache"].model_copy(update={"step_extra_s": _p(0.003, "s")})
    truth = truth.model_copy(update={"backends": {"lmcache": lmcache}})
    fitted = calibrate([write_run(tmp_path, truth)])
    got = fitted.backends["lmcache"]
    assert got.step_extra_s.fitted
    assert got.step_extra_s.value == pytest.approx(0.003, rel=0.05)
    assert fitted.step_overhead_s.value == pytest.approx(truth.step_overhead_s.value, rel=0.03)
    assert got.store_latency_s.value == pytest.approx(lmcache.store_latency_s.value, rel=0.1)
    assert all(abs(r.error) < 0.02 for r in fitted.decode_residuals)


def test_a_prefill_steps_own_host_floor_is_found_where_short_prompts_sit_on_it(tmp_path: Path) -> None:
    """An engine whose prefill steps take at least 40 ms on the host (eager mode's short-prompt floor) holds
    its 1k prompts and every short turn-2 prefill after a tier hit at that floor; the fit finds it, and the
    other parameters, again."""
    truth = chosen().model_copy(update={"prefill_host_s": _p(0.040, "s")})
    fitted = calibrate([write_run(tmp_path, truth)])
    assert fitted.prefill_host_s is not None and fitted.prefill_host_s.fitted
    assert fitted.prefill_host_s.value == pytest.approx(0.040, rel=0.03)
    assert "requests" in fitted.prefill_host_s.source
    for name in ("request_overhead_s", "linear_efficiency", "attention_efficiency", "step_overhead_s"):
        assert getattr(fitted, name).value == pytest.approx(getattr(truth, name).value, rel=0.03), name
    assert all(abs(r.error) < 0.02 for r in fitted.residuals)


def test_overhead_growth_is_fitted_from_requests_served_from_the_hbm_prefix_cache(tmp_path: Path) -> None:
    grows = chosen().model_copy(update={"request_overhead_s_per_ktoken": _p(0.004)})
    arms = {**ARMS, "GPU": OffloadProfile(name="gpu", prefix_caching=True)}
    fitted = calibrate([write_run(tmp_path, grows, arms=arms, keep_hbm=frozenset({"GPU"}))])
    assert fitted.request_overhead_s_per_ktoken.fitted
    assert fitted.request_overhead_s_per_ktoken.value == pytest.approx(0.004, rel=0.05)
    assert fitted.request_overhead_s.value == pytest.approx(0.030, rel=0.05)
    assert fitted.linear_efficiency.value == pytest.approx(0.50, rel=0.03)


def test_holdout_lengths_stay_out_of_the_fit(tmp_path: Path) -> None:
    fitted = calibrate([write_run(tmp_path, chosen())], holdout=[4000])
    assert fitted.fit_context_tokens == [1000, 16000, 64000]
    assert fitted.holdout_context_tokens == [4000]
    held = [r for r in fitted.residuals if not r.used_in_fit]
    assert held and {r.context_tokens for r in held} == {4000}


def test_runs_of_two_deployments_are_an_error_naming_both(tmp_path: Path) -> None:
    h100 = write_run(tmp_path / "a", chosen())
    h200 = write_run(tmp_path / "b", chosen(), gpu="NVIDIA H200")
    with pytest.raises(CalibrationError) as error:
        calibrate([h100, h200])
    message = str(error.value)
    assert "h100-sxm" in message and "h200-sxm" in message and str(h100) in message and str(h200) in message


def test_fp8_weights_are_another_deployment_than_bf16(tmp_path: Path) -> None:
    bf16 = write_run(tmp_path / "bf16", chosen(), engine={"dtype": "bfloat16"})
    fp8 = write_run(tmp_path / "fp8", chosen(), engine={"dtype": "bfloat16", "quantization": "fp8"})
    dep = run_facts(fp8).deployment
    # --quantization fp8 quantizes the weights; the KV cache stays in --dtype
    assert (dep.dtype, dep.kv_dtype) == ("fp8", "bf16")
    assert (run_facts(bf16).deployment.dtype, run_facts(bf16).deployment.kv_dtype) == ("bf16", None)
    with pytest.raises(CalibrationError) as error:
        calibrate([bf16, fp8])
    message = str(error.value)
    assert "llama-3.1-8b bf16 on 1x h100-sxm" in message and "llama-3.1-8b fp8 weights, bf16 KV on 1x" in message
    fitted = calibrate([fp8])
    assert fitted.deployment == dep
    with pytest.raises(CalibrationError) as refused:
        fitted.check_deployment(run_facts(bf16).deployment.resolve())
    assert "fp8 weights, bf16 KV" in str(refused.value) and "bf16 on 1x h100-sxm" in str(refused.value)
    with pytest.raises(CalibrationError, match=r"cannot be used for llama-3\.1-8b fp8 on 1x"):  # FP8 KV too
        fitted.check_deployment(Deployment.resolve("llama-3.1-8b", "h100-sxm", 1, "fp8"))
    fitted.check_deployment(Deployment.resolve("llama-3.1-8b", "h100-sxm", 1, "fp8", "bf16"))


def test_calibration_file_round_trips(tmp_path: Path) -> None:
    truth = chosen()
    path = truth.save(tmp_path / "calibration.yaml")
    assert Calibration.load(path) == truth
    path.write_text(path.read_text().replace("schema_version: 4", "schema_version: 7"))
    with pytest.raises(CalibrationError, match="schema_version 7"):
        Calibration.load(path)


def _decoding(name: str, start_ms: float, ttft_ms: float, gaps_ms: list[float], prompt: int = 1000) -> RequestRecord:
    ms = 1_000_000
    return request_record(
        "A",
        1000,
        0,
        1,
        request_id=name,
        started_ns=int(start_ms * ms),
        ttft_ns=int(ttft_ms * ms),
        e2e_ns=int((ttft_ms + sum(gaps_ms)) * ms),
        itl_ns=[int(g * ms) for g in gaps_ms],
        output_chunks=len(gaps_ms) + 1,
        prompt_tokens=prompt,
        completion_tokens=len(gaps_ms) + 1,
        ok=True,
    )


def test_decode_steps_come_from_gaps_while_no_other_request_prefills() -> None:
    from harness.calibrate.samples import decode_samples

    # A: first token at 10 ms, then 10 gaps of 10 ms (decodes 10-110 ms). B is sent at 35 ms and
    # prefills until 60 ms: A's gaps overlapping 35-60 ms (30-40, 40-50, 50-60) may hold B's prefill
    # and are left out. B decodes 60-160, with A until 110 (batch 2), then alone.
    a = _decoding("a", 0, 10, [10.0] * 10)
    b = _decoding("b", 35, 25, [10.0] * 10, prompt=3000)
    c = _decoding("c", 500, 10, [4.0] * 5)  # alone: batch 1, 4 ms steps
    samples = decode_samples([a, b, c], [a, b, c])
    assert [s.step_s for s in samples] == pytest.approx([0.010, 0.010, 0.004])
    # A's clean gaps: 10-30 alone, 60-110 with B decoding: (20 x 1 + 50 x 2) / 70
    assert samples[0].batch == pytest.approx((20 * 1 + 50 * 2) / 70)
    # B decodes 60-160: with A until 110
    assert samples[1].batch == pytest.approx((50 * 2 + 50 * 1) / 100)
    assert samples[2].batch == pytest.approx(1.0)
    # C's context grows from its prompt by the 6 tokens it generates: time-averaged, the middle
    assert samples[2].context_tokens == 1000 + 3


# -- sweeps: the decode step against the batch, and the engine-blocking share of the request overhead ---

SWEEP_LOADS = (2.0, 4.0, 8.0)
SWEEP_OUTPUT = 24


def _with_load_terms(truth: Calibration, per_seq: float, share: float) -> Calibration:
    return truth.model_copy(update={"step_s_per_seq": _p(per_seq, "s"), "engine_blocking_share": _p(share)})


def _sweep_point(
    core: EngineCore, load: float, point: int, t0: float, seconds: float, seed: int, arm: str = "OFF"
) -> tuple[list[RequestRecord], float]:
    """``load`` closed-loop users on a virtual clock from ``t0``: each sends a request of 2,000-4,000 new
    tokens, waits for its last token, thinks (exponential, 50 ms mean) and sends the next, until ``seconds``
    have passed; returns their records and when the engine drained."""
    import random

    from harness.sim.scheduler import Event, FinishEvent, TokenEvent

    rng = random.Random(seed)
    clock = [t0]
    ready = [t0 + 0.01 * u for u in range(int(load))]
    tokens: dict[str, list[float]] = {}
    sent: dict[str, tuple[float, SimRequest, int]] = {}
    records: list[RequestRecord] = []

    def sink_for(name: str, user: int) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if isinstance(event, TokenEvent):
                tokens[name].append(clock[0])
            elif isinstance(event, FinishEvent):
                at, request, _ = sent[name]
                times = tokens[name]
                records.append(
                    request_record(
                        arm,
                        request.prompt_tokens,
                        user,
                        1,
                        request_id=name,
                        started_ns=int(at * 1e9),
                        ttft_ns=int((times[0] - at) * 1e9),
                        e2e_ns=int((times[-1] - at) * 1e9),
                        itl_ns=[int((b - a) * 1e9) for a, b in pairwise(times)],
                        output_chunks=len(times),
                        prompt_tokens=request.prompt_tokens,
                        completion_tokens=len(times),
                        cached_tokens=event.usage.cached_tokens,
                        ok=True,
                        point=point,
                        load=load,
                        user=user,
                    )
                )
                ready[user] = clock[0] + rng.expovariate(1 / 0.05)

        return sink

    def submit(now: float) -> None:
        for user, due in enumerate(ready):
            if due <= now and due < t0 + seconds:
                name = f"p{point}-u{user}-{len(sent)}"
                prompt = [rng.randrange(1000, 60000) for _ in range(rng.randrange(2000, 4000))]
                request = SimRequest(name, prompt, SWEEP_OUTPUT, sink_for(name, user))
                tokens[name] = []
                sent[name] = (due, request, user)
                core.add_request(request, due)
                ready[user] = float("inf")

    now = t0
    while True:
        submit(now)
        plan = core.plan(now)
        if plan is None:
            # new sends stop at the window's end; a held-back or loading request still wakes the engine after it
            wakeup = core.next_wakeup()
            upcoming = [t for t in (min(ready),) if t < t0 + seconds] + ([wakeup] if wakeup is not None else [])
            if not upcoming and not core.has_work:
                return records, now
            now = max(now, min(upcoming)) if upcoming else now
            continue
        end = now + plan.seconds
        submit(end)  # requests sent while the step ran: their intake goes to the next step
        clock[0] = end
        core.complete(plan, end)
        now = end


def write_sweep(
    path: Path,
    truth: Calibration,
    seconds: float = 3.0,
    arms: dict[str, OffloadProfile] | None = None,
) -> Path:
    """A sweep run directory (by default one arm with the HBM prefix cache; loads 2-8) that the engine core
    produced under ``truth`` on a virtual clock."""
    from harness.store.events import PointDone

    arms = arms if arms is not None else {"OFF": OffloadProfile(name="hbm")}
    scenario = parse_scenario(
        {
            "name": "calib-sweep",
            "engine": {"kind": "vllm", "model": "synth:llama-3.1-8b"},
            "arms": [{"name": name, "offload": profile.model_dump(mode="json")} for name, profile in arms.items()],
            "workload": {
                "kind": "multi_user_qa",
                "users": 8,
                "rounds": 3,
                "context_tokens": 3000,
                "answer_tokens": SWEEP_OUTPUT,
            },
            "sweep": {"mode": "concurrency", "values": list(SWEEP_LOADS), "warmup": 0.5, "duration": seconds},
        },
        "test",
    )
    run_dir = RunDir.create(path, scenario)
    t0 = 1.0
    engines = {}
    for arm, profile in arms.items():
        details = {"offload_backend": profile.backend if profile.tiers else "none", "lmcache_version": "0.0.1"}
        engines[arm] = {"kind": "vllm", "version": "9.9.9", "details": details}
        for point, load in enumerate(SWEEP_LOADS):
            settings = SimSettings(model="llama-3.1-8b", hardware="h100-sxm", offload=profile, calibration=truth)
            records, end = _sweep_point(EngineCore(settings), load, point, t0, seconds, seed=point, arm=arm)
            for record in records:
                append_jsonl(run_dir.records_file, record)
            ns = int(1e9)
            append_jsonl(
                run_dir.points_file,
                PointDone(
                    arm=arm,
                    point=point,
                    load=load,
                    attempt=0,
                    start_ns=int(t0 * ns),
                    window_start_ns=int(t0 * ns),
                    window_end_ns=int((t0 + seconds) * ns),
                    end_ns=int(end * ns),
                    sent=len(records),
                    measured=len(records),
                    errors=0,
                    sessions=int(load),
                    max_in_flight=int(load),
                    late_arrivals=0,
                    cancelled=0,
                ),
            )
            t0 = end + 1.0
    manifest = {"run_id": run_dir.run_id, "engines": engines, "host": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}}
    run_dir.manifest_file.write_text(json.dumps(manifest), encoding="utf-8")
    assert run_dir.kind == "sweep"
    return run_dir.path


@pytest.mark.parametrize("share", [0.0, 0.4])
def test_a_sweep_fits_the_per_sequence_step_cost_and_the_engine_blocking_share(tmp_path: Path, share: float) -> None:
    truth = _with_load_terms(chosen(), per_seq=0.6e-3, share=share)
    probe = write_run(tmp_path / "probe", truth)
    sweep = write_sweep(tmp_path / "sweep", truth)
    fitted = calibrate([probe, sweep])
    assert [s.path for s in fitted.sources] == [str(probe), str(sweep)]
    assert fitted.step_overhead_s.fitted and fitted.step_s_per_seq.fitted and fitted.engine_blocking_share.fitted
    assert fitted.step_overhead_s.value == pytest.approx(truth.step_overhead_s.value, rel=0.05)
    assert fitted.step_s_per_seq.value == pytest.approx(0.6e-3, rel=0.1)
    assert fitted.engine_blocking_share.value == pytest.approx(share, abs=0.03)
    # the probe's parameters are found as without a sweep
    for name in ("request_overhead_s", "linear_efficiency", "attention_efficiency", "hbm_efficiency"):
        assert getattr(fitted, name).value == pytest.approx(getattr(truth, name).value, rel=0.03), name
    # the decode windows (every step: prefill chunks and other requests' intake included) are predicted
    windows = fitted.tpot_residuals
    assert {r.load for r in windows} == set(SWEEP_LOADS) and all(r.used_in_fit for r in windows)
    assert all(abs(r.error) < 0.03 for r in windows), windows
    assert max(r.batch for r in windows) > 2 * min(r.batch for r in windows)


def test_with_decode_read_the_sweep_fits_the_decode_kv_read_alone_and_the_probe_the_rest(tmp_path: Path) -> None:
    """``decode_read``: the sweep's decode steps fit ``decode_s_per_ktoken`` (batch x context of its load points
    spread 2x) and nothing else; every other term is what the probe alone gives. As on the H200 (eager), the idle
    engine of the probe run hides the read, the loaded one does not."""
    truth = chosen().model_copy(update={"decode_s_per_ktoken": _p(0.2e-3, "s")})
    probe = write_run(tmp_path / "probe", chosen())
    sweep = write_sweep(tmp_path / "sweep", truth)
    fitted = calibrate([probe, sweep], decode_read=True)
    alone = calibrate([probe])
    assert fitted.decode_s_per_ktoken.fitted and not fitted.step_s_per_seq.fitted
    assert fitted.decode_s_per_ktoken.value == pytest.approx(0.2e-3, rel=0.15)
    assert "decode_s_per_ktoken" in fitted.step_s_per_seq.source and not fitted.engine_blocking_share.fitted
    for name in ("request_overhead_s", "linear_efficiency", "attention_efficiency", "step_overhead_s"):
        assert getattr(fitted, name).value == pytest.approx(getattr(alone, name).value, rel=1e-6), name
    # the sweep's decode windows are still reported, predicted with the read
    assert {r.load for r in fitted.tpot_residuals} == set(SWEEP_LOADS)
    assert all(abs(r.error) < 0.1 for r in fitted.tpot_residuals), fitted.tpot_residuals
    # not asked for: the per-sequence cost is the load term, as before
    plain = calibrate([probe, sweep])
    assert not plain.decode_s_per_ktoken.fitted and "--decode-read" in plain.decode_s_per_ktoken.source


def test_a_sweep_fits_each_offload_backends_intake_per_request_arriving_at_a_busy_engine(tmp_path: Path) -> None:
    """The backend's ``busy_intake_s`` slows the running requests of its arm only; the fit finds it from that
    arm's decode windows, leaves the shared blocking share at 0, and the probe (an idle engine at every
    arrival: nothing charged) still gives its TTFT parameters."""
    lmcache = chosen().backends["lmcache"].model_copy(update={"busy_intake_s": _p(0.008, "s")})
    truth = _with_load_terms(chosen(), per_seq=0.6e-3, share=0.0).model_copy(update={"backends": {"lmcache": lmcache}})
    probe = write_run(tmp_path / "probe", truth)
    sweep = write_sweep(tmp_path / "sweep", truth, arms={"OFF": OffloadProfile(name="hbm"), "LMC": ARMS["LMC"]})
    fitted = calibrate([probe, sweep])
    got = fitted.backends["lmcache"].busy_intake_s
    assert got.fitted and got.value == pytest.approx(0.008, rel=0.1)
    assert fitted.engine_blocking_share.value == pytest.approx(0.0, abs=0.03)
    for name in ("request_overhead_s", "linear_efficiency", "attention_efficiency"):
        assert getattr(fitted, name).value == pytest.approx(getattr(truth, name).value, rel=0.03), name
    assert fitted.backends["lmcache"].store_latency_s.value == pytest.approx(0.015, rel=0.05)
    # both arms' decode windows are predicted: the OFF arm's without the term, the LMC arm's with it
    for arm in ("OFF", "LMC"):
        windows = [r for r in fitted.tpot_residuals if r.arm == arm]
        assert {r.load for r in windows} == set(SWEEP_LOADS) and all(abs(r.error) < 0.03 for r in windows), windows
    assert truth.request_intake(3000, lmcache, busy=False) == 0.0


def test_sweep_loads_held_out_stay_out_of_the_fit(tmp_path: Path) -> None:
    truth = _with_load_terms(chosen(), per_seq=0.6e-3, share=0.4)
    probe = write_run(tmp_path / "probe", truth)
    sweep = write_sweep(tmp_path / "sweep", truth)
    fitted = calibrate([probe, sweep], holdout_loads=[8.0])
    assert fitted.holdout_loads == [8.0]
    for rows in (fitted.decode_residuals, fitted.tpot_residuals):
        swept = [r for r in rows if r.load is not None]
        assert {r.load for r in swept if not r.used_in_fit} == {8.0}
        assert {r.load for r in swept if r.used_in_fit} == {2.0, 4.0}
    # the held-out load is predicted from the others
    assert all(abs(r.error) < 0.05 for r in fitted.tpot_residuals if not r.used_in_fit)


def test_an_outlier_record_is_left_out_and_named_not_followed(tmp_path: Path) -> None:
    """R4: one wild record among the run's requests moved every efficiency to its bound, silently. (A negative
    TTFT, the issue's example, no longer loads at all: records are checked on load.)"""
    truth = chosen()
    run = write_run(tmp_path, truth)
    records = (run / "records.jsonl").read_text(encoding="utf-8").splitlines()
    good = json.loads(records[4])
    # two more requests like it, and one of 50 s: a cell of four whose median is the good requests'
    twins = [good | {"request_id": f"twin{n}", "conversation": good["conversation"] + 100 + n} for n in range(2)]
    wild = 50_000_000_000  # its first token 50 s late; the rest of it as the good request's
    late = {"ttft_ns": wild, "first_chunk_ns": wild, "first_content_ns": wild}
    bad = good | late | {"request_id": "wild", "conversation": good["conversation"] + 200}
    bad["e2e_ns"] = wild + good["e2e_ns"] - good["ttft_ns"]
    records += [json.dumps(record) for record in (*twins, bad)]
    (run / "records.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")
    fitted = calibrate([run])
    for name in ("linear_efficiency", "attention_efficiency", "request_overhead_s"):
        assert getattr(fitted, name).value == pytest.approx(getattr(truth, name).value, rel=0.03), name
    named = f"{bad['arm']} {bad['context_tokens']:,} tokens turn {bad['turn']}"
    assert any(w.startswith("outlier: 1 of 4 requests of " + named) and "50000 ms" in w for w in fitted.warnings)


def test_one_length_does_not_determine_the_prefill_slope(tmp_path: Path) -> None:
    """R4: two requests at one length gave ``linear_efficiency: 0.65, fitted: true`` from a 'slope' over one
    length; the intercept takes them and the efficiency keeps its datasheet value, saying why."""
    fitted = calibrate([write_run(tmp_path, chosen(), arms={"OFF": ARMS["OFF"]}, lengths=(8000,))])
    assert fitted.request_overhead_s.fitted
    for name in ("linear_efficiency", "attention_efficiency"):
        param = getattr(fitted, name)
        assert not param.fitted and "4x" in param.source, (name, param)
    hardware = fitted.deployment.resolve().hardware
    assert fitted.linear_efficiency.value == hardware.mfu


def test_a_value_fitted_onto_its_bound_is_a_warning() -> None:
    from harness.calibrate.fit import bound_warnings
    from harness.calibrate.model import Params, free_param

    params = Params(linear=0.99999999)
    frees = [free_param("linear", 0.02, 1.0), free_param("overhead_s", 0.0, 2.0)]
    warnings = bound_warnings(params, {"linear", "overhead_s"}, frees)
    assert warnings == [
        "not identified: linear = 1 ended on its bound 1; the runs do not determine it (too few lengths, or outliers)"
    ]


def test_a_schema_1_file_is_refused_with_the_command_that_refits_it(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    data = chosen().model_dump(mode="json")
    data["schema_version"] = 1
    del data["warnings"]
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(CalibrationError) as error:
        Calibration.load(old)
    message = str(error.value)
    assert "\n" not in message and str(old) in message
    assert "schema_version 1" in message and "kvbench sim calibrate" in message


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("request_overhead_s", -0.5, "[0, 10]"),
        ("linear_efficiency", -0.6, "(0, 1]"),
        ("linear_efficiency", 50.0, "(0, 1]"),
        ("hbm_efficiency", 0.0, "(0, 1]"),
        ("backends.lmcache.load_gbps", 0.0, "(0, 10000]"),
    ],
)
def test_a_value_out_of_range_is_refused_on_load_naming_file_field_and_range(
    tmp_path: Path, field: str, value: float, allowed: str
) -> None:
    """R5: a negative overhead, an efficiency of -0.6, 50 or 0 (which divided by zero in the simulator)."""
    path = chosen().save(tmp_path / "calibration.yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    node = data
    *parents, leaf = field.split(".")
    for key in parents:
        node = node[key]
    node[leaf]["value"] = value
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(CalibrationError) as error:
        Calibration.load(path)
    assert str(error.value) == f"{path}: {field} = {value:g}: allowed {allowed}"


def test_a_file_missing_a_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = chosen().save(tmp_path / "calibration.yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["step_s_per_seq"]
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(CalibrationError, match="step_s_per_seq"):
        Calibration.load(path)


def test_host_bound_decode_steps_leave_the_hbm_rate_at_the_datasheet_and_say_why(tmp_path: Path) -> None:
    """Eager-mode steps whose host work outlasts every read: the HBM rate changes no prediction, so it is
    not reported as fitted."""
    truth = chosen().model_copy(update={"step_overhead_s": _p(0.020)})  # above 64k's ~10 ms of reads
    fitted = calibrate([write_run(tmp_path, truth)])
    assert fitted.step_overhead_s.value == pytest.approx(0.020, rel=0.03)
    assert not fitted.hbm_efficiency.fitted and "host-bound" in fitted.hbm_efficiency.source
    assert fitted.hbm_efficiency.value == fitted.deployment.resolve().hardware.hbm_efficiency


def test_a_run_in_eager_mode_is_another_deployment_than_one_with_cuda_graphs(tmp_path: Path) -> None:
    graphs = write_run(tmp_path / "graphs", chosen())
    eager = write_run(tmp_path / "eager", chosen(), engine={"enforce_eager": True})
    assert run_facts(graphs).deployment.cuda_graphs is True and run_facts(eager).deployment.cuda_graphs is False
    assert "eager" in run_facts(eager).deployment.label
    with pytest.raises(CalibrationError, match=r"CUDA graphs.*eager|eager.*CUDA graphs"):
        calibrate([graphs, eager])
    # a file that did not record it (written before) agrees with either
    unrecorded = run_facts(eager).deployment.model_copy(update={"cuda_graphs": None})
    assert unrecorded.agrees(run_facts(graphs).deployment) and unrecorded.agrees(run_facts(eager).deployment)


def test_front_slope_is_the_growth_of_the_cells_medians() -> None:
    # 2 ms per 1000 prompt tokens plus noise that a median per cell takes out; the intercept does not matter
    samples = [
        FrontSample("r", length, turn, length + 100, 0.005 + 0.002 * (length + 100) / 1000 + noise)
        for length in (1000, 8000, 32000, 64000)
        for turn in (1, 2)
        for noise in (0.0, 0.0, 0.050)
    ]
    assert front_slope(samples) == pytest.approx(0.002, rel=1e-6)
    assert front_slope(samples[:3]) == 0.0  # one length: no slope
    falling = [FrontSample("r", n, 1, n, 1.0 - n / 1e6) for n in (1000, 8000)]
    assert front_slope(falling) == 0.0  # never below 0


@pytest.mark.lab
def test_lmcaches_log_fixes_the_overhead_growth_and_leaves_held_out_lengths_out(tmp_path: Path) -> None:
    # measured: Llama-3.1-8B shape, 1x H200, vLLM 0.26.0 + LMCache 0.5.3, its engine log stored with the run
    run = Path(__file__).resolve().parents[3] / "lab" / "runs" / "gpu-llama8b-lmcache-graphs-h200"
    facts = run_facts(run)
    fit, held = collect(run, facts, holdout=[96000])
    assert fit.front and held.front
    assert {s.context_tokens for s in held.front} == {96000}
    assert 96000 not in {s.context_tokens for s in fit.front}
    fitted = calibrate([run], holdout=[96000])
    growth = fitted.request_overhead_s_per_ktoken
    assert growth.fitted and "LMCache's log" in growth.source
    assert growth.value == pytest.approx(front_slope(fit.front))
    assert 0.0005 < growth.value < 0.005  # 0.5-5 ms per 1000 tokens: tokenizing and intake, not a prefill
    assert {s.source for s in fit.front} == {LMCACHE_LOG}  # a run scraped before vLLM's timing histograms


@pytest.mark.lab
def test_the_engines_clock_fixes_the_overhead_growth_where_it_timed_every_request() -> None:
    # measured: Llama-3.1-8B shape, 1x H200, vLLM 0.26.0 + LMCache 0.5.3 against native offload, /metrics with
    # vLLM's queue and prefill histograms: every arm's groups time their front end, not only LMCache's requests
    run = Path(__file__).resolve().parents[3] / "lab" / "runs" / "gpu-llama8b-lmcache-t2-split-h200"
    fit, held = collect(run, run_facts(run), holdout=[96000])
    clocked = [s for s in fit.front if s.source == ENGINE_CLOCK]
    assert {s.source for s in fit.front} == {ENGINE_CLOCK, LMCACHE_LOG}
    assert {s.context_tokens for s in clocked} == {16000, 32000, 64000, 80000, 112000, 128000}
    assert all(s.context_tokens == 96000 for s in held.front)
    assert front_samples(fit.front) == clocked  # the engine's clock first: it times every arm
    fitted = calibrate([run], holdout=[96000])
    growth = fitted.request_overhead_s_per_ktoken
    assert growth.fitted and "the engine's histograms" in growth.source
    assert growth.value == pytest.approx(front_slope(clocked))
    assert 0.0005 < growth.value < 0.005


@pytest.mark.lab
def test_the_overhead_growth_needs_lengths_4x_apart_not_prompts() -> None:
    """32k and 128k are the 4x the growth needs, though their prompts (question and chat template added) are
    32,066 and 128,066 tokens. Measured: the intake pair on one H200 (vLLM 0.26.0 + LMCache 0.5.3), where the
    prompt sent as text grows the way in by tokenizing and the prompt sent as token ids much less."""
    root = Path(__file__).resolve().parents[3] / "lab" / "runs"
    growth = {}
    for form in ("text", "token-ids"):
        run = root / f"gpu-llama8b-lmcache-prompt-{form}-h200"
        fit, _ = collect(run, run_facts(run), holdout=[64000])
        prompts = [s.prompt_tokens for s in front_samples(fit.front)]
        assert max(prompts) < 4 * min(prompts)
        fitted = calibrate([run], holdout=[64000]).request_overhead_s_per_ktoken
        assert fitted.fitted and "the engine's histograms" in fitted.source
        growth[form] = fitted.value
    assert growth["token-ids"] < growth["text"] / 2


def test_predict_stores_the_calibrated_ttft_per_cell_for_reports(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from harness.results.calibrated import CalibratedTtft
    from kvbench.cli.sim import sim_app

    run = write_run(tmp_path / "run", chosen())
    calibration = chosen().save(tmp_path / "calibration.yaml")
    result = CliRunner().invoke(sim_app, ["predict", str(run), "--calibration", str(calibration)])
    assert result.exit_code == 0, result.output
    stored = CalibratedTtft.read_file(run)
    cells = stored.by_cell()
    assert len(cells) == len(ARMS) * len(LENGTHS) * 2 and f"{len(cells)} cells predicted" in result.output
    # the run was generated under this very calibration: its own time model predicts each measured cell
    records = [json.loads(line) for line in (run / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in records:
        assert cells[(r["arm"], r["context_tokens"], r["turn"])] == pytest.approx(r["ttft_ns"] / 1e6, rel=0.01)
