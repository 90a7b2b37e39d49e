"""``kvbench sim``: run the engine simulator, list its model and hardware profiles, or run the
compute-vs-load what-if (``whatif``: turn-2 TTFT against tier read bandwidth, see
:mod:`harness.calibrate.whatif`) and the colocated-vs-P/D what-if (``pd-whatif``, see
:mod:`harness.calibrate.pd_whatif`).

Only typer is imported at module level; the server and its dependencies load inside the commands,
so mounting this sub-app keeps ``kvbench --help`` fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from .options import command_group

sim_app = command_group("The built-in engine simulator (OpenAI-compatible, physics-based latencies).")


def _fail(message: str) -> typer.Exit:
    from .console import fail

    return fail(message)  # one line however long (soft wrap), markup-escaped, redacted


@sim_app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", help="Settings JSON (as written by the sim engine); overrides the rest.")
    ] = None,
    model: Annotated[str, typer.Option(help="Model profile (see `kvbench sim profiles`).")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option(help="Hardware profile.")] = "h100-sxm",
    tp: Annotated[int, typer.Option(help="Tensor parallel degree.")] = 1,
    dtype: Annotated[str | None, typer.Option(help="Weights: bf16, fp16 or fp8; default: the model's.")] = None,
    kv_dtype: Annotated[
        str | None, typer.Option("--kv-dtype", help="KV cache: bf16, fp16 or fp8; default: --dtype.")
    ] = None,
    offload: Annotated[str, typer.Option(help="Built-in offload profile: off, hbm, cpu, disk, shared.")] = "hbm",
    no_prefix_caching: Annotated[
        bool, typer.Option("--no-prefix-caching", help="Force the HBM prefix cache off.")
    ] = False,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every HTTP request.")] = False,
    faults: Annotated[
        Path | None,
        typer.Option("--faults", help="Fault-injection file (YAML or JSON list of faults); replaces any in --config."),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option("--calibration", help="Calibration file (kvbench sim calibrate) for this deployment."),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible simulator until interrupted."""
    from pydantic import ValidationError

    from harness.sim.server import serve as run_server
    from harness.sim.settings import SimSettings
    from offload.profiles import resolve_profile

    try:
        if config is not None:
            settings = SimSettings.load(config)
        else:
            settings = SimSettings.model_validate(
                {
                    "model": model,
                    "hardware": hardware,
                    "tp": tp,
                    "dtype": dtype,
                    "kv_dtype": kv_dtype,
                    "offload": resolve_profile(offload),
                    "prefix_caching": not no_prefix_caching,
                }
            )
        if faults is not None:
            from harness.sim.faults import load_faults

            settings = settings.model_copy(update={"faults": load_faults(faults)})
        if calibration is not None:
            from harness.sim.calibration import Calibration

            fitted = Calibration.load(calibration)
            where = f"calibration {calibration}"
            fitted.check_deployment(settings.deployment(), where)
            fitted.backend_for(settings.offload, where)
            settings = settings.model_copy(update={"calibration": fitted})
    except OSError as error:
        raise _fail(f"{config}: cannot read: {error.strerror}") from None
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise _fail(problems) from None
    except ValueError as error:
        raise _fail(str(error)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger(__name__).info("kvbench sim serving %s on http://%s:%d", settings.name, host, port)
    if settings.faults:
        kinds = ", ".join(fault.kind for fault in settings.faults)
        logging.getLogger(__name__).warning("fault injection is ON: %s", kinds)
    run_server(settings, host=host, port=port, access_log=access_log)


@sim_app.command()
def profiles() -> None:
    """Print the model and hardware profiles, and the shipped deployments with their speeds."""
    from rich.table import Table

    from harness.sim.timemodel import TimeModel
    from offload.shapes import HARDWARE, MODELS, SHIPPED_DEPLOYMENTS, Deployment, dtype_label
    from reports.tables import print_table

    from .console import console

    models = Table(title="Model profiles")
    for column in ("name", "checkpoint", "params", "layers", "hidden", "heads/kv", "head_dim", "ffn", "max len"):
        models.add_column(column, justify="left" if column in ("name", "checkpoint") else "right")
    for m in MODELS.values():
        models.add_row(
            m.name,
            m.hf_id,
            f"{m.params / 1e9:.2f} B",
            str(m.layers),
            str(m.hidden_size),
            f"{m.heads}/{m.kv_heads}",
            str(m.head_dim),
            str(m.intermediate_size),
            str(m.max_position_embeddings),
        )
    print_table(console, models)

    hardware = Table(title="Hardware profiles (per GPU)")
    for column in ("name", "BF16 TFLOP/s", "FP8 TFLOP/s", "MFU", "HBM GB", "HBM TB/s", "host link GB/s"):
        hardware.add_column(column, justify="left" if column == "name" else "right")
    for hw in HARDWARE.values():
        hardware.add_row(
            hw.name,
            f"{hw.peak_bf16_flops / 1e12:.0f}",
            f"{hw.peak_fp8_flops / 1e12:.0f}",
            f"{hw.mfu:.2f}",
            f"{hw.hbm_bytes / 1e9:.1f}",
            f"{hw.hbm_bytes_per_s / 1e12:.2f}",
            f"{hw.host_link_bytes_per_s / 1e9:.0f}",
        )
    print_table(console, hardware)

    shipped = Table(title="Shipped deployments (gpu_memory_utilization 0.9, 8192-token steps)")
    for column in ("model", "hardware", "tp", "dtype", "KV tokens", "TTFT 8k", "TTFT 32k", "TTFT 128k", "TPOT"):
        shipped.add_column(column, justify="left" if column in ("model", "hardware", "dtype") else "right")
    for model, hw_name, tp, dtype, kv_dtype in SHIPPED_DEPLOYMENTS:
        deployment = Deployment.resolve(model, hw_name, tp, dtype, kv_dtype)
        timing = TimeModel(deployment)
        limit = deployment.model.max_position_embeddings

        def ttft(tokens: int, timing: TimeModel = timing, limit: int = limit) -> str:
            return f"{timing.prefill_seconds(tokens):.2f} s" if tokens <= limit else "-"

        shipped.add_row(
            model,
            hw_name,
            str(tp),
            dtype_label(dtype, kv_dtype),
            f"{deployment.kv_cache_tokens(0.9, 8192):,}",
            ttft(8192),
            ttft(32768),
            ttft(131072),
            f"{timing.decode_step_seconds(1, 8192) * 1e3:.1f} ms",
        )
    print_table(console, shipped)


@sim_app.command()
def whatif(
    model: Annotated[str, typer.Option(help="Model profile.")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option(help="Hardware profile.")] = "h100-sxm",
    tokens: Annotated[
        list[int] | None, typer.Option("--tokens", help="Context lengths (repeat the option); default 32768, 131072.")
    ] = None,
    read_gbps: Annotated[
        list[float] | None,
        typer.Option("--read-gbps", help="Tier read bandwidths in GB/s (repeat); default 1 2 5 10 20 25 50."),
    ] = None,
    new_tokens: Annotated[int, typer.Option(help="Turn-2 tokens beyond the cached turn 1.")] = 128,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for whatif.csv and whatif.png.")] = Path("whatif"),
) -> None:
    """Compute, load or both: simulated turn-2 TTFT against tier read bandwidth (compute-only, load-only,
    layerwise, bidirectional), as a table, a CSV and a PNG plot."""
    from harness.calibrate import whatif as what

    try:
        points = what.run_whatif(
            model,
            hardware,
            tokens or list(what.DEFAULT_TOKENS),
            read_gbps or list(what.DEFAULT_READ_GBPS),
            new_tokens,
        )
    except ValueError as error:
        raise _fail(str(error)) from None
    table = what.rows(points)
    summary = what.gains(table)
    what.write_csv(points, out / "whatif.csv")
    what.plot(points, out / "whatif.png", f"Simulated turn-2 TTFT, {model} on 1x {hardware} (kvbench sim)")
    typer.echo(f"Simulated ({model} on {hardware}; modelled times, not measurements). TTFT of turn 2:\n")
    typer.echo(what.markdown_table(table))
    typer.echo(
        f"Mean gain of bidirectional over the grid: {summary.vs_compute:.2f}x vs compute-only, "
        f"{summary.vs_load:.2f}x vs load-only, {summary.vs_mean_of_both:.2f}x vs both (mean of the two), "
        f"{summary.vs_better:.2f}x vs the better of the two (at most {summary.max_vs_better:.2f}x)."
    )
    typer.echo(f"Wrote {out / 'whatif.csv'} and {out / 'whatif.png'}")


@sim_app.command("pd-whatif")
def pd_whatif(
    model: Annotated[str, typer.Option(help="Model profile.")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option(help="Hardware profile.")] = "h100-sxm",
    tokens: Annotated[
        list[int] | None,
        typer.Option("--tokens", help="Context lengths (repeat the option); default 8192, 32768, 131072."),
    ] = None,
    link_gbps: Annotated[
        list[float] | None,
        typer.Option(
            "--link-gbps", help="KV link bandwidths per GPU in GB/s (repeat); default 49 (NIXL push) and 0.5 (TCP)."
        ),
    ] = None,
    per_transfer_ms: Annotated[
        float, typer.Option("--per-transfer-ms", min=0.0, help="Fixed cost of one KV transfer (assumed).")
    ] = 1.0,
    prefill_gpus: Annotated[int, typer.Option("--prefill-gpus", min=1, help="GPUs of the prefill pool.")] = 1,
    decode_gpus: Annotated[int, typer.Option("--decode-gpus", min=1, help="GPUs of the decode pool.")] = 1,
    read_gbps: Annotated[float, typer.Option("--read-gbps", min=0.001, help="CPU tier read bandwidth, GB/s.")] = 25.0,
    new_tokens: Annotated[int, typer.Option(help="Turn-2 tokens beyond the cached turn 1.")] = 128,
    loaded: Annotated[
        bool,
        typer.Option(
            "--loaded", help="Also compare under multi-round QA load: colocated replicas vs P/D on the same GPUs."
        ),
    ] = False,
    rates: Annotated[
        list[float] | None,
        typer.Option("--rate", help="--loaded: offered requests per second (repeat); default 1 2 4 6 8 12."),
    ] = None,
    slo_ms: Annotated[float, typer.Option("--slo-ms", min=1.0, help="--loaded: returning users' TTFT p90 SLO.")] = 500,
    users: Annotated[int, typer.Option(min=1, help="--loaded: users, each with its own document.")] = 64,
    context_tokens: Annotated[int, typer.Option(min=16, help="--loaded: tokens of each user's document.")] = 8000,
    tier_gb: Annotated[float, typer.Option("--tier-gb", min=0.001, help="CPU tier per instance, GB.")] = 128.0,
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            help="Calibration file of this deployment, or 'auto' (the shipped one): fitted engine and tier terms "
            "(the tier's backend's load rate replaces --read-gbps) and their held-out band. Default: datasheet.",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="With --calibration: the tier's fitted offload backend (default: the calibration's only one)."
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for pd-whatif.csv/.png (and -loaded.csv).")
    ] = Path("pd-whatif"),
) -> None:
    """Colocated vs prefill/decode disaggregation, with and without a CPU tier: simulated turn-2 TTFT of a
    returning user taken apart (queue, load, prefill, transfer, admission, first step), as a table, a CSV and
    a PNG plot; with --loaded, capacity at a TTFT SLO."""
    from dataclasses import replace

    from pydantic import ValidationError

    from harness.calibrate import pd_whatif as what
    from harness.sim.disagg import Disaggregation
    from offload.shapes import get_hardware, get_model

    for option, value, known in (("--model", model, get_model), ("--hardware", hardware, get_hardware)):
        try:
            known(value)
        except ValueError as error:
            raise _fail(f"{option}: {error}") from None
    links = link_gbps or list(what.DEFAULT_LINK_GBPS)
    if any(gbps <= 0 for gbps in links):
        raise _fail(
            f"--link-gbps {' '.join(f'{g:g}' for g in links)}: give positive bandwidths in GB/s, e.g. 49 or 0.5"
        )
    try:
        calibrated = None if calibration is None else what.load_calibration(calibration, model, hardware, backend)
        layout = Disaggregation(prefill_gpus=prefill_gpus, decode_gpus=decode_gpus, per_transfer_ms=per_transfer_ms)
        points = what.run_pd_whatif(
            model,
            hardware,
            tokens or list(what.DEFAULT_TOKENS),
            read_gbps,
            links,
            new_tokens,
            layout,
            tier_gb,
            calibrated,
        )
    except ValidationError as error:
        raise _fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())) from None
    except OSError as error:
        raise _fail(f"--calibration {calibration}: cannot read: {error.strerror}") from None
    except ValueError as error:
        raise _fail(str(error)) from None
    if calibrated is None:
        basis = "datasheet profiles (no calibration, so no held-out error band)"
    else:
        basis = f"{calibrated.band}; the CPU tier at {calibrated.tier}'s fitted load rate"
    label = (
        f"simulated: {model} on {hardware}, {basis}; KV link {' and '.join(f'{g:g}' for g in links)} GB/s per GPU "
        f"and {per_transfer_ms:g} ms per transfer are reported and assumed figures, not fitted on any measured P/D run"
    )
    what.write_csv(points, out / "pd-whatif.csv")
    short = "datasheet profiles, no held-out band" if calibrated is None else calibrated.file
    title = (
        f"Simulated turn-2 TTFT taken apart: {model} on {hardware} (kvbench sim, {short})"
        f"\nKV link {per_transfer_ms:g} ms + bytes / bandwidth: reported and assumed figures, not fitted on a P/D run"
    )
    what.plot(points, out / "pd-whatif.png", title)
    typer.echo(f"Turn-2 TTFT of a returning user, ms ({label}; modelled times, not measurements):\n")
    typer.echo(what.markdown_table(points))
    written = [out / "pd-whatif.csv", out / "pd-whatif.png"]
    if loaded:
        try:
            traffic = replace(what.LOADED_TRAFFIC, users=users, context_tokens=context_tokens)
            loaded_points = what.run_loaded(
                model,
                hardware,
                rates or list(what.DEFAULT_RATES),
                traffic,
                read_gbps,
                layout.model_copy(update={"link_gbps": links[0]}),
                tier_gb,
                calibrated,
            )
        except ValueError as error:
            raise _fail(str(error)) from None
        typer.echo(
            f"Returning users' TTFT under load, ms (simulated as above, KV link {links[0]:g} GB/s): multi-round QA, "
            f"{traffic.users} users with {traffic.context_tokens:,}-token documents, {traffic.turns} turns of "
            f"{traffic.question_tokens}-token questions and {traffic.answer_tokens}-token answers, "
            f"{traffic.duration_s:g} s measured after {traffic.warmup_s:g} s:\n"
        )
        typer.echo(what.loaded_table(loaded_points, slo_ms / 1e3))
        what.write_loaded_csv(loaded_points, out / "pd-whatif-loaded.csv")
        written.append(out / "pd-whatif-loaded.csv")
    typer.echo("Wrote " + ", ".join(str(path) for path in written))


def _numbers(text: str | None, option: str, what: str) -> list[float]:
    """A comma-separated option's numbers; a clear error naming the option and an example otherwise."""
    if not text:
        return []
    try:
        return [float(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise _fail(f"{option} {text!r}: give {what} separated by commas") from None


def _lengths(text: str | None) -> list[int]:
    what = "whole context lengths, e.g. 2000,16000,96000"
    numbers = _numbers(text, "--holdout", what)
    if not all(n.is_integer() for n in numbers):
        raise _fail(f"--holdout {text!r}: give {what} separated by commas")
    return [int(n) for n in numbers]


def _loads(text: str | None) -> list[float]:
    return _numbers(text, "--holdout-loads", "sweep loads, e.g. 16,24,32,48")


@sim_app.command()
def calibrate(
    runs: Annotated[
        list[Path], typer.Argument(help="Run directories of one deployment (probe runs; sweeps add decode).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Calibration file to write (YAML).")] = Path(
        "calibration.yaml"
    ),
    holdout: Annotated[
        str | None, typer.Option("--holdout", help="Context lengths to leave out of the fit, e.g. 2000,16000,96000.")
    ] = None,
    holdout_loads: Annotated[
        str | None,
        typer.Option("--holdout-loads", help="Sweep load points to leave out of the fit, e.g. 16,24,32,48."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Simulator model profile, if the run's model is not one.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Simulator hardware profile, if the GPU is not known.")] = None,
    decode_read: Annotated[
        bool,
        typer.Option(
            "--decode-read",
            help="Learn the decode step's load term as its KV read (s per 1000 context tokens of the running "
            "sequences) instead of a cost per sequence.",
        ),
    ] = False,
) -> None:
    """Fit the simulator to real runs: request overhead, prefill efficiencies, offload load/store costs, decode."""
    from common.errors import KvbenchError
    from harness.calibrate.fit import calibrate as fit

    try:
        calibration = fit(runs, _lengths(holdout), model, hardware, _loads(holdout_loads), decode_read)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    calibration.save(out)
    typer.echo(_describe(calibration))
    typer.echo(f"Wrote {out}")


@sim_app.command("calibrate-power")
def calibrate_power(
    runs: Annotated[list[Path], typer.Argument(help="Load runs (sweep, agentic) with NVML energy windows.")],
    calibration: Annotated[
        Path, typer.Option("--calibration", help="The deployment's calibration file (its hardware gives the TDP).")
    ],
    holdout: Annotated[
        list[Path] | None, typer.Option("--holdout", help="A run to predict only, never fitted on (repeatable).")
    ] = None,
    write: Annotated[bool, typer.Option("--write", help="Store the fitted terms as the calibration's power.")] = False,
) -> None:
    """Fit GPU power (W = base + J/prefill token x rate + J/decode token x rate) on NVML energy windows and print
    every window predicted by a fit that left its run (or, with one run, its arm) out."""
    from common.errors import KvbenchError
    from harness.calibrate.power import fit_power as fit
    from harness.calibrate.power import power_table
    from harness.sim.calibration import Calibration
    from harness.sim.power import POWER

    try:
        calibrated = Calibration.load(calibration)
        profile = POWER.get(calibrated.deployment.hardware)
        if profile is None:
            known = ", ".join(sorted(POWER))
            raise _fail(
                f"{calibration}: deployment.hardware {calibrated.deployment.hardware!r}: power known for {known}"
            )
        fitted = fit(runs, profile.tdp_w, holdout or [])
    except KvbenchError as error:
        raise _fail(str(error)) from None
    typer.echo("\n".join(power_table(fitted)))
    terms = (fitted.base_w, fitted.j_per_prefill_token, fitted.j_per_decode_token)
    typer.echo(f"model {fitted.model}: " + ", ".join(f"{t.value:.4g} {t.unit}" for t in terms))
    typer.echo(f"held-out median |error| of J/token: {fitted.median_error:.1%}")
    if write:
        calibrated.model_copy(update={"power": fitted}).save(calibration)
        typer.echo(f"Wrote {calibration}")


@sim_app.command()
def predict(
    run: Annotated[Path, typer.Argument(help="A probe run directory.")],
    calibration: Annotated[Path, typer.Option("--calibration", help="Calibration file for the run's deployment.")],
) -> None:
    """Store the calibrated TTFT per cell in the run directory (calibrated_ttft.json); reports show it beside
    the measured TTFT."""
    from common.errors import KvbenchError
    from harness.calibrate.predict import write_predictions

    try:
        stored = write_predictions(run, calibration)
    except KvbenchError as error:
        raise _fail(str(error)) from None
    typer.echo(f"{len(stored.cells)} cells predicted; {stored.note}")
    typer.echo(f"Wrote {run / stored.FILE_NAME}")


def _describe(calibration: object) -> str:
    from harness.engines.host_link import summary_text
    from harness.sim.calibration import Calibration, FitParam

    assert isinstance(calibration, Calibration)
    lines = [f"Calibration for {calibration.deployment.label}"]
    lines += [
        f"  from {s.path} (run {s.run_id}, {s.gpu}, manifest sha256 {s.manifest_sha256[:16]}…)"
        for s in calibration.sources
    ]
    lines.append(
        f"  fitted on lengths {calibration.fit_context_tokens}; held out {calibration.holdout_context_tokens or 'none'}"
    )
    if calibration.holdout_loads:
        lines.append(f"  sweep load points held out: {[f'{v:g}' for v in calibration.holdout_loads]}")
    lines += [f"WARNING: {warning}" for warning in calibration.warnings]

    def show(name: str, p: FitParam) -> str:
        state = "fitted " if p.fitted else "default"
        return f"  {name:<32} {p.value:>12.5g} {p.unit:<28} {state}  {p.source}"

    lines.append("Parameters:")
    for name in (
        "request_overhead_s",
        "request_overhead_s_per_ktoken",
        "engine_blocking_share",
        "linear_efficiency",
        "attention_efficiency",
        "step_overhead_s",
        "step_s_per_seq",
        "decode_s_per_ktoken",
        "hbm_efficiency",
    ):
        value = getattr(calibration, name)
        assert isinstance(value, FitParam)
        lines.append(show(name, value))
    lines.append(show("prefill_host_s", calibration.prefill_host_s))
    for backend, entry in calibration.backends.items():
        label = f"{backend} {entry.version or ''}".strip()
        lines.append(show(f"{label}: load_gbps", entry.load_gbps))
        lines.append(show(f"{label}: load_latency_s", entry.load_latency_s))
        lines.append(show(f"{label}: store_s_per_gb", entry.store_s_per_gb))
        lines.append(show(f"{label}: store_latency_s", entry.store_latency_s))
        lines.append(show(f"{label}: busy_intake_s", entry.busy_intake_s))
        lines.append(show(f"{label}: step_extra_s", entry.step_extra_s))
    tp = calibration.deployment.tp
    per_rank = f"; load_gbps above moves all {tp} TP ranks' KV: per rank it is load_gbps / {tp}" if tp > 1 else ""
    lines.append(
        f"Host link of the source runs (pinned host -> GPU copies, GB/s per GPU{per_rank}; shown, not used by the fit):"
    )
    lines += [f"  {s.run_id}: {summary_text(s.host_link)}" for s in calibration.sources]
    if calibration.residuals:
        lines.append("Residuals (median TTFT per arm, length, turn; error = predicted/measured - 1):")
        lines.append(
            f"  {'arm':<22} {'tokens':>8} {'turn':>4} {'measured ms':>12} {'predicted ms':>12} {'error':>8}  set"
        )
    for r in calibration.residuals:
        where = "fit" if r.used_in_fit else "held out"
        lines.append(
            f"  {r.arm:<22} {r.context_tokens:>8} {r.turn:>4} {r.measured_ms:>12.1f} "
            f"{r.predicted_ms:>12.1f} {r.error:>+8.1%}  {where}"
        )
    drops = calibration.falling_tier_hits()
    if drops:
        lines.append(
            "Turn 2 from the tier is faster at a longer prompt (measured medians; the model's tier load grows "
            "with the bytes loaded and cannot follow these):"
        )
        lines += [
            f"  {a.arm}: {a.context_tokens:,} -> {b.context_tokens:,} tokens, {a.measured_ms:.1f} -> "
            f"{b.measured_ms:.1f} ms"
            for a, b in drops
        ]
    titles = (
        (
            calibration.decode_residuals,
            "Decode residuals (mean clean step per run, arm and load point or probe length; "
            "batch = requests decoding at once, context = their mean context):",
        ),
        (
            calibration.tpot_residuals,
            "Decode-window residuals (sweeps: median over requests of the mean step of "
            "the whole decode window, prefill chunks and arrivals' intake included):",
        ),
    )
    for rows, title in titles:
        if not rows:
            continue
        lines.append(title)
        width = max(len(d.run) for d in rows)
        lines.append(
            f"  {'run':<{width}} {'arm':<18} {'load':>6} {'reqs':>5} {'batch':>6} {'context':>8} "
            f"{'measured ms':>12} {'predicted ms':>12} {'error':>8}  set"
        )
        for d in rows:
            load = "probe" if d.load is None else f"{d.load:g}"
            where = "fit" if d.used_in_fit else "held out"
            lines.append(
                f"  {d.run:<{width}} {d.arm:<18} {load:>6} {d.requests:>5} {d.batch:>6.2f} "
                f"{d.context_tokens:>8,} {d.measured_ms:>12.2f} {d.predicted_ms:>12.2f} {d.error:>+8.1%}  "
                f"{where}"
            )
    return "\n".join(lines)


@sim_app.command()
def validate(
    run: Annotated[Path, typer.Argument(help="A real run directory: a probe run or a sweep.")],
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="Calibration file; default: probe runs fit one on the lengths not held out, sweeps use the "
            "run's own simulator settings or the datasheet profile.",
        ),
    ] = None,
    holdout: Annotated[
        str | None,
        typer.Option(
            "--holdout", help="Probe runs: lengths to simulate and compare (and, without --calibration, not to fit)."
        ),
    ] = None,
    conversations: Annotated[int, typer.Option(help="Probe runs: conversations per length in the simulator.")] = 1,
    max_error: Annotated[
        float, typer.Option("--max-error", help="Largest |sim/measured - 1| per cell (TTFT; sweeps: per point metric).")
    ] = 0.15,
    max_capacity_error: Annotated[
        float, typer.Option("--max-capacity-error", help="Sweeps: largest error of an arm's capacity within the SLO.")
    ] = 0.15,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the simulator run goes.")] = Path("runs/validate"),
    count_client_time: Annotated[
        bool,
        typer.Option(
            "--count-client-time",
            help="With a calibration: charge the whole calibrated overhead and this machine's client time on top "
            "(as the lab's older outputs did), instead of measuring the client time first and taking "
            "it out.",
        ),
    ] = False,
) -> None:
    """Re-run a real run's scenario (probe run or sweep) on the (calibrated) simulator and compare per cell;
    exit 0 within the thresholds, 1 beyond, 2 cannot compare."""
    from common.errors import KvbenchError
    from harness.calibrate.validate import validate_run

    try:
        result = validate_run(
            run, out, calibration, _lengths(holdout), conversations, max_error, max_capacity_error, count_client_time
        )
    except KvbenchError as error:
        raise _fail(str(error)) from None
    typer.echo(f"Simulated {result.sim_run} against measured {result.run} ({result.kind})")
    for line in result.context:
        typer.echo(line)
    typer.echo(_validation_table(result))
    for line in result.notes:
        typer.echo(line)
    for line in result.skipped:
        typer.echo(f"skipped: {line}")
    for line in result.one_sided:
        typer.echo(f"BEYOND: {line}")
    worst = result.worst
    typer.echo(
        f"{len(result.judged)} cells judged; median |error| {result.median_abs_error:.1%}; worst "
        f"{abs(worst.error) if worst else 0:.1%}"
        + (f" ({' '.join(worst.key)})" if worst else "")
        + f"; {result.threshold}: "
        + ("within" if result.passed else "BEYOND")
    )
    for line in result.beyond_lines():
        typer.echo(line)
    raise typer.Exit(0 if result.passed else 1)


def _validation_table(result: object) -> str:
    """The cells, one line each: key columns, measured, simulated, error, note; ``!`` marks a cell beyond."""
    from harness.calibrate.validate import Validation

    assert isinstance(result, Validation)
    widths = [max(len(name), *(len(c.key[i]) for c in result.cells)) for i, name in enumerate(result.columns)]

    def cols(parts: tuple[str, ...]) -> str:
        first, *rest = parts
        return f"{first:<{widths[0]}} " + " ".join(f"{p:>{w}}" for p, w in zip(rest, widths[1:], strict=True))

    def num(value: float) -> str:
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"

    lines = [f"  {cols(result.columns)} {'measured':>12} {'simulated':>12} {'error':>8}  note"]
    for c in result.cells:
        mark = " !" if c.beyond else ""
        lines.append(f"  {cols(c.key)} {num(c.measured):>12} {num(c.simulated):>12} {c.error:>+8.1%}  {c.note}{mark}")
    return "\n".join(lines)


@sim_app.command("fleet-whatif")
def fleet_whatif(
    replicas: Annotated[int, typer.Option(min=1, help="Replicas (1 GPU each).")] = 32,
    users: Annotated[int, typer.Option(min=1, help="Users, each with its own document.")] = 1024,
    skew: Annotated[float, typer.Option(min=0.0, help="Zipf exponent of user activity (0: even).")] = 1.0,
    rate: Annotated[float, typer.Option(min=0.01, help="Requests per second offered by all users.")] = 64.0,
    context_tokens: Annotated[int, typer.Option(min=16, help="Tokens of each user's document.")] = 16000,
    turns: Annotated[int, typer.Option(min=1, help="Turns per conversation.")] = 4,
    duration: Annotated[float, typer.Option(min=1.0, help="Measured window (virtual seconds).")] = 60.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Unmeasured lead-in (virtual seconds).")] = 30.0,
    target_utilization: Annotated[float, typer.Option(min=0.01, max=1.0, help="Busy share a GPU may reach.")] = 0.7,
    model: Annotated[str, typer.Option(help="Model profile.")] = "llama-3.1-8b",
    hardware: Annotated[str, typer.Option(help="Hardware profile.")] = "h100-sxm",
    seed: Annotated[int, typer.Option(help="Seed of arrivals and think times.")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for fleet-whatif.csv/.png/.md.")] = Path(
        "fleet-whatif"
    ),
) -> None:
    """Fleet what-if: round robin + shared tier vs session affinity vs prefix-aware routing (and round robin
    with per-replica tiers) at N simulated replicas: returning-user TTFT (same vs moved), hotspots, GPUs needed."""
    from harness.calibrate import fleet_whatif as fleet

    traffic = fleet.Traffic(
        users=users,
        skew=skew,
        rate=rate,
        context_tokens=context_tokens,
        turns=turns,
        duration_s=duration,
        warmup_s=warmup,
        seed=seed,
    )
    try:
        results, utilisation = fleet.run_fleet_whatif(
            replicas, traffic, target_utilization=target_utilization, model=model, hardware=hardware
        )
    except ValueError as error:
        raise _fail(str(error)) from None
    out.mkdir(parents=True, exist_ok=True)
    table = fleet.markdown_table(results)
    fleet.write_csv(results, out / "fleet-whatif.csv")
    (out / "fleet-whatif.md").write_text(table, encoding="utf-8")
    title = (
        f"{replicas} replicas of {model} on 1x {hardware}; {users} users (Zipf {skew:g}), {rate:g} req/s, "
        f"{context_tokens} tokens"
    )
    fleet.plot(results, utilisation, out / "fleet-whatif.png", title)
    typer.echo(f"Simulated ({title}; modelled times, not measurements):\n")
    typer.echo(table)
    typer.echo(f"Wrote {out / 'fleet-whatif.csv'}, {out / 'fleet-whatif.md'} and {out / 'fleet-whatif.png'}")
