"""The NVML power fit (harness.calibrate.power) and the simulator's fitted power source (harness.sim.power).

Synthetic runs are written as a real run directory holds them (points.jsonl of PointDone, records.jsonl of
RequestRecord); their joules come from a known law, so the fit must find it. The kept NVML run checks the
shipped terms: refitted from its own windows they are the shipped ones, and each held-out group's median window
is within 15 % of NVML.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from common.errors import CalibrationError
from harness.calibrate.power import energy_windows, fit_power, held_out_residuals, median_error
from harness.client.power import NS, EnergyWindow
from harness.sim.calibration import SHIPPED_DIR, Calibration, PowerFit
from harness.sim.power import (
    BUSY_SECONDS,
    EXTERNAL_HITS,
    GENERATED_TOKENS,
    POWER,
    PREFIX_HITS,
    PROMPT_TOKENS,
    SimulatedPower,
    fitted_joules,
)
from harness.store.events import PointDone
from tests.resultfiles import request_record
from tests.unit.client.test_power import read_each_second

ROOT = Path(__file__).resolve().parents[3]
AGENTIC = ROOT / "docs" / "results" / "gpu-agentic-llama8b-h200"
WINDOW_S = 10.0


def _law(prefill_tps: float, decode_tps: float) -> float:
    """The synthetic GPU: 120 W + 0.02 J per computed prompt token + 0.5 J per generated token."""
    return 120.0 + 0.02 * prefill_tps + 0.5 * decode_tps


def _write_run(folder: Path, arms: dict[str, list[tuple[int, int]]], seed: int = 0) -> Path:
    """One point per (arm, users): ``users`` requests of ``prompt`` tokens (a quarter cached) and 200 generated
    tokens each, all inside the window; its joules follow :func:`_law` over the window's work, ±1 %."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    points: list[dict[str, object]] = []
    records: list[dict[str, object]] = []
    for arm, loads in arms.items():
        for index, (users, prompt) in enumerate(loads):
            a = (100 + 100 * len(points)) * NS  # points run one after another, as a sweep runs them
            b = a + int(WINDOW_S * NS)
            cached = prompt // 4
            for user in range(users):
                start = a + user * NS // 10
                records.append(
                    request_record(
                        arm,
                        prompt,
                        user,
                        1,
                        point=index,
                        started_ns=start,
                        ttft_ns=NS // 2,
                        e2e_ns=5 * NS,
                        prompt_tokens=prompt,
                        cached_tokens=cached,
                        completion_tokens=200,
                        output_chunks=200,
                    ).model_dump(mode="json")
                )
            prefill_tps = users * (prompt - cached) / WINDOW_S
            decode_tps = users * 199 / WINDOW_S
            joules = _law(prefill_tps, decode_tps) * WINDOW_S * rng.uniform(0.99, 1.01)
            energy = EnergyWindow(source="nvml", method="energy_counter", gpus=1, seconds=WINDOW_S, joules=joules)
            done = PointDone(
                arm=arm,
                point=index,
                load=float(users),
                attempt=0,
                start_ns=a - NS,
                window_start_ns=a,
                window_end_ns=b,
                end_ns=b + NS,
                sent=users,
                measured=users,
                errors=0,
                sessions=users,
                max_in_flight=users,
                late_arrivals=0,
                cancelled=0,
                energy=energy,
            )
            points.append(done.model_dump(mode="json"))
    (folder / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points), encoding="utf-8")
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return folder


# prefill and decode rates vary apart across arms (long vs short prompts), so both terms are determined
ARMS = {
    "OFF": [(2, 20_000), (4, 20_000), (8, 20_000)],
    "ON": [(2, 4_000), (6, 4_000), (12, 4_000)],
    "MID": [(3, 10_000), (9, 8_000), (16, 2_000)],
}


def test_the_fit_finds_the_law_its_windows_follow(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", ARMS)
    fit = fit_power([run], tdp_w=700.0)
    assert fit.model == "tokens"
    assert fit.base_w.value == pytest.approx(120.0, rel=0.1)
    assert fit.j_per_prefill_token.value == pytest.approx(0.02, rel=0.1)
    assert fit.j_per_decode_token.value == pytest.approx(0.5, rel=0.2)
    assert {r.held_out for r in fit.residuals} == {"arm OFF", "arm ON", "arm MID"}
    assert max(abs(r.error) for r in fit.residuals) < 0.05


def test_a_wrong_model_misses_the_held_out_windows(tmp_path: Path) -> None:
    """Power that follows the prompt work: a model without the prefill term is far off on a held-out arm, and
    the fit does not keep it."""
    windows = energy_windows(_write_run(tmp_path / "run", ARMS))
    assert median_error(held_out_residuals(windows, "constant", 700.0)) > 0.15
    assert median_error(held_out_residuals(windows, "tokens", 700.0)) < 0.05


def test_a_held_out_run_is_predicted_not_fitted(tmp_path: Path) -> None:
    first = _write_run(tmp_path / "a", {"OFF": ARMS["OFF"], "ON": ARMS["ON"]}, seed=1)
    second = _write_run(tmp_path / "b", {"MID": ARMS["MID"]}, seed=2)
    third = _write_run(tmp_path / "c", {"OFF": [(5, 12_000)], "ON": [(7, 3_000)]}, seed=3)
    fit = fit_power([first, second], tdp_w=700.0, holdout=[third])
    assert fit.runs == [str(first), str(second)]
    assert {r.held_out for r in fit.residuals if r.run == "a"} == {"run a"}
    unseen = [r for r in fit.residuals if r.run == "c"]
    assert len(unseen) == 2 and {r.held_out for r in unseen} == {"run c (not fitted)"}
    assert all(abs(r.error) < 0.05 for r in unseen)


def test_a_run_without_nvml_windows_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"no points\.jsonl"):
        fit_power([tmp_path], tdp_w=700.0)
    simulated = _write_run(tmp_path / "sim", {"OFF": ARMS["OFF"]})
    lines = (simulated / "points.jsonl").read_text().replace('"source": "nvml"', '"source": "simulated"')
    (simulated / "points.jsonl").write_text(lines.replace('"method": "energy_counter"', '"method": "model"'))
    with pytest.raises(CalibrationError, match="no window with NVML joules"):
        fit_power([_write_run(tmp_path / "run", ARMS)], tdp_w=700.0, holdout=[simulated])


def test_the_shipped_power_terms_are_the_kept_runs_fit_within_15_percent() -> None:
    shipped = Calibration.load(SHIPPED_DIR / "llama8b-h200-eager.yaml").power
    assert shipped is not None
    refit = fit_power([ROOT / run for run in shipped.runs], tdp_w=shipped.tdp_w)
    assert refit.model == shipped.model
    assert refit.base_w.value == pytest.approx(shipped.base_w.value)
    assert refit.j_per_decode_token.value == pytest.approx(shipped.j_per_decode_token.value)
    for group in {r.held_out for r in refit.residuals}:  # each held-out run (or arm) within 15 % at its median
        assert median_error([r for r in refit.residuals if r.held_out == group]) <= 0.15, group
    # the datasheet model's figure, W = TDP at full busy, is twice what this GPU drew
    assert all(r.measured_w < 0.8 * POWER["h200-sxm"].tdp_w for r in refit.residuals)


def test_the_other_shipped_calibrations_keep_the_datasheet_model() -> None:
    fitted = {path.name for path in SHIPPED_DIR.glob("*.yaml") if Calibration.load(path).power is not None}
    assert fitted == {"llama8b-h200-eager.yaml"}


def _metrics(busy: float, prompt: float, hits: float, generated: float) -> str:
    lines = [f"{BUSY_SECONDS} {busy}", f"{PROMPT_TOKENS} {prompt}", f"{PREFIX_HITS} {hits}"]
    return "\n".join([*lines, f"{GENERATED_TOKENS} {generated}"]) + "\n"


def test_the_simulated_source_charges_the_fitted_terms_for_the_tokens_it_served() -> None:
    fit = Calibration.load(SHIPPED_DIR / "llama8b-h200-eager.yaml").power
    assert isinstance(fit, PowerFit)
    clock = [0]
    counters = [0.0, 0.0, 0.0, 0.0]  # busy s, prompt tokens, HBM hits, generated tokens

    async def scrape() -> str:
        return _metrics(*counters)

    source = SimulatedPower(
        POWER["h200-sxm"], gpus=1, tp=1, scrape=scrape, period_s=3600, clock=lambda: clock[0], fit=fit
    )
    each_second = [[0.9, 9000, 3000, 150]] * 4  # 9,000 prompt tokens of which 3,000 cached, 150 generated
    (window,) = asyncio.run(read_each_second(source, clock, counters, each_second, [(NS, 3 * NS)]))
    expected = fitted_joules(fit, 2.0, 2 * 6000, 2 * 150, gpus=1) / 2.0
    assert window.avg_watts == pytest.approx(expected)
    assert window.avg_watts == pytest.approx(fit.watts(6000, 150))
    assert window.avg_watts is not None and window.avg_watts < POWER["h200-sxm"].watts(0.9) - 100


async def test_a_calibrated_simulator_server_is_metered_by_the_fitted_terms() -> None:
    """The real simulator server with the shipped 8B H200 eager calibration (``calibration: auto``): the power
    source the registry gives reads its /metrics and charges base W over the window plus the fitted J per token
    of what the server computed and generated."""
    import aiohttp

    from harness.client.scrape import parse_metrics, sum_metric
    from harness.engines.kinds import power_source
    from harness.sim.config import SimEngineConfig
    from harness.sim.server import running_server
    from harness.sim.settings import SimSettings
    from offload.profiles import resolve_profile

    engine = SimEngineConfig.model_validate(
        {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h200-sxm", "calibration": "auto", "cuda_graphs": False}
    )
    settings = SimSettings.from_engine_config(engine, resolve_profile("hbm"), True)
    clock = [0]
    async with running_server(settings) as url, aiohttp.ClientSession() as session:

        async def scrape() -> str:
            async with session.get(url + "/metrics") as response:
                return await response.text()

        async def counters() -> tuple[float, float]:
            snapshot = parse_metrics(await scrape())
            computed = sum(
                (sum_metric(snapshot, name) or 0.0) * sign
                for name, sign in ((PROMPT_TOKENS, 1), (PREFIX_HITS, -1), (EXTERNAL_HITS, -1))
            )
            return computed, sum_metric(snapshot, GENERATED_TOKENS) or 0.0

        source = power_source(engine, scrape)
        assert isinstance(source, SimulatedPower) and source.fit is not None
        source._clock = lambda: clock[0]
        source.period_s = 3600
        before = await counters()
        await source.start()
        text = "Tell me about caches. " * 400
        for _ in range(2):  # the second is served from the HBM prefix cache: not computed again
            body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": text}], "max_tokens": 20}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
        after = await counters()
        clock[0] = 10 * NS
        window = await source.window(0, 10 * NS)
        await source.stop()
    computed, generated = after[0] - before[0], after[1] - before[1]
    assert computed > 1000 and generated == 40
    assert window.joules == pytest.approx(fitted_joules(source.fit, 10.0, computed, generated, gpus=1))


def test_calibrate_power_prints_the_held_out_table_and_writes_the_terms(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvbench.cli.sim import sim_app

    run = _write_run(tmp_path / "run", ARMS)
    calibration = tmp_path / "calibration.yaml"
    calibration.write_text((SHIPPED_DIR / "llama8b-h100-eager.yaml").read_text())
    argv = ["calibrate-power", str(run), "--calibration", str(calibration)]
    printed = CliRunner().invoke(sim_app, argv)
    assert printed.exit_code == 0, printed.output
    assert "| run | OFF | 2 | arm OFF |" in printed.output and "model tokens" in printed.output
    assert Calibration.load(calibration).power is None  # printing alone writes nothing
    written = CliRunner().invoke(sim_app, [*argv, "--write"])
    assert written.exit_code == 0 and f"Wrote {calibration}" in written.output
    stored = Calibration.load(calibration).power
    assert stored is not None and stored.j_per_prefill_token.value == pytest.approx(0.02, rel=0.1)
    missing = CliRunner().invoke(
        sim_app, ["calibrate-power", str(tmp_path / "nowhere"), "--calibration", str(calibration)]
    )
    assert missing.exit_code == 2 and "no points.jsonl" in missing.output and "Traceback" not in missing.output


def test_hits_counted_before_their_prompt_are_no_restart_and_no_window_passes_tdp() -> None:
    """The engine counts a prompt's HBM hits at admission and its prompt tokens at its first token: between two
    readings prompt − hits can fall. That is no restart (nothing is counted twice); and a burst of work is
    credited no faster than TDP, the rest carried into the next interval with the total kept."""
    fit = Calibration.load(SHIPPED_DIR / "llama8b-h200-eager.yaml").power
    assert isinstance(fit, PowerFit)
    clock = [0]
    counters = [0.0, 0.0, 0.0, 0.0]  # busy s, prompt tokens, HBM hits, generated tokens
    steps = [
        (20_000.0, 0.0, 0.0),  # (prompt, hits, generated) in second 1: 20,000 prompt tokens computed
        (0.0, 8_000.0, 0.0),  # second 2: hits of an admitted request, counted before its prompt tokens
        (8_000.0, 0.0, 0.0),  # second 3: its 8,000 prompt tokens arrive, all cached: nothing computed
        (60_000.0, 0.0, 0.0),  # second 4: a 60,000-token burst: more than TDP can draw in one second
        (0.0, 0.0, 0.0),  # seconds 5-6: idle (the burst's remainder is credited here)
        (0.0, 0.0, 0.0),
    ]

    async def scrape() -> str:
        return _metrics(*counters)

    async def run() -> list[EnergyWindow]:
        source = SimulatedPower(
            POWER["h200-sxm"], gpus=1, tp=1, scrape=scrape, period_s=3600, clock=lambda: clock[0], fit=fit
        )
        await source.start()
        for prompt, hits, generated in steps:
            clock[0] += NS
            counters[1] += prompt
            counters[2] += hits
            counters[3] += generated
            await source._read()
        windows = [await source.window(i * NS, (i + 1) * NS) for i in range(6)]
        windows.append(await source.window(0, 6 * NS))
        await source.stop()
        return windows

    *seconds, whole = asyncio.run(run())
    watts = [w.avg_watts or 0.0 for w in seconds]
    base, per_prefill = fit.base_w.value, fit.j_per_prefill_token.value
    assert watts[0] == pytest.approx(base + per_prefill * 20_000)
    assert watts[1] == pytest.approx(base - per_prefill * 8_000) and watts[2] == pytest.approx(
        base + per_prefill * 8_000
    )
    assert max(watts) <= fit.tdp_w + 1e-6 and watts[3] == pytest.approx(fit.tdp_w)
    assert whole.joules == pytest.approx(fitted_joules(fit, 6.0, 80_000, 0, gpus=1))  # the total is kept
