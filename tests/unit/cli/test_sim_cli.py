"""``kvbench sim``: the profiles table and serve's argument checking (the server itself is tested elsewhere)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from harness.sim.timemodel import TimeModel
from kvbench.cli.sim import sim_app
from offload.shapes import Deployment

runner = CliRunner()


def test_profiles_lists_models_hardware_and_shipped_deployments() -> None:
    result = runner.invoke(sim_app, ["profiles"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("llama-3.1-8b", "llama-3.1-70b", "qwen3-14b", "tiny", "h100-sxm", "h200-sxm", "fp8"):
        assert name in result.output
    cold_128k = TimeModel(Deployment.resolve("llama-3.1-8b", "h100-sxm")).prefill_seconds(131072)
    assert f"{cold_128k:.2f} s" in result.output


def test_serve_rejects_bad_settings(tmp_path: Path) -> None:
    unknown = runner.invoke(sim_app, ["serve", "--model", "gpt-9"])
    assert unknown.exit_code == 2 and "unknown simulator model" in unknown.output
    offload = runner.invoke(sim_app, ["serve", "--offload", "nvme"])
    assert offload.exit_code == 2 and "unknown offload profile" in offload.output
    missing = runner.invoke(sim_app, ["serve", "--config", str(tmp_path / "absent.json")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "tiny", "hardware": "h100-sxm", "tp": 0}')
    invalid = runner.invoke(sim_app, ["serve", "--config", str(bad)])
    assert invalid.exit_code == 2 and "tp" in invalid.output


def test_whatif_prints_the_table_and_writes_csv_and_plot(tmp_path: Path) -> None:
    args = ["whatif", "--tokens", "8192", "--read-gbps", "2", "--read-gbps", "20", "-o", str(tmp_path)]
    result = runner.invoke(sim_app, args)
    assert result.exit_code == 0, result.output
    assert "Simulated (llama-3.1-8b on h100-sxm" in result.output and "Mean gain of bidirectional" in result.output
    lines = (tmp_path / "whatif.csv").read_text().splitlines()
    assert lines[0] == "tokens,read_gbps,mode,ttft_ms,cached_tokens,new_tokens" and len(lines) == 1 + 2 * 4
    assert (tmp_path / "whatif.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = runner.invoke(sim_app, ["whatif", "--tokens", "100", "--new-tokens", "200", "-o", str(tmp_path)])
    assert bad.exit_code == 2 and "new_tokens" in bad.output


def test_pd_whatif_prints_the_parts_labelled_simulated_and_writes_csv_and_plot(tmp_path: Path) -> None:
    args = ["pd-whatif", "--tokens", "8192", "--link-gbps", "49", "--loaded", "--rate", "1", "--users", "8"]
    result = runner.invoke(sim_app, [*args, "--context-tokens", "2000", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "simulated: llama-3.1-8b on h100-sxm" in result.output and "no held-out error band" in result.output
    assert "not fitted on any measured P/D run" in result.output
    lines = (tmp_path / "pd-whatif.csv").read_text().splitlines()
    assert lines[0].startswith("tokens,deployment,ttft_ms,queue_ms,load_ms,prefill_ms,transfer_ms,admission_ms,")
    names = [line.split(",")[1] for line in lines[1:]]
    assert names == ["colocated", "colocated + CPU tier", "1P1D 49 GB/s", "1P1D 49 GB/s + CPU tier"]
    assert (tmp_path / "pd-whatif.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = (tmp_path / "pd-whatif-loaded.csv").read_text().splitlines()
    assert len(loaded) == 1 + 4 and loaded[1].startswith("2x colocated,2,1,")
    assert "capacity at p90" in result.output


def test_pd_whatif_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    model = runner.invoke(sim_app, ["pd-whatif", "--model", "gpt-9", "-o", str(tmp_path)])
    assert model.exit_code == 2 and "unknown simulator model" in model.output
    link = runner.invoke(sim_app, ["pd-whatif", "--link-gbps", "0", "-o", str(tmp_path)])
    assert link.exit_code == 2 and "--link-gbps" in link.output
    tokens = runner.invoke(sim_app, ["pd-whatif", "--tokens", "100", "--new-tokens", "200", "-o", str(tmp_path)])
    assert tokens.exit_code == 2 and "new_tokens" in tokens.output
    assert not (tmp_path / "pd-whatif.csv").exists()


def test_pd_whatif_with_a_calibration_states_its_band_and_needs_a_backend_where_it_has_several(tmp_path: Path) -> None:
    args = ["pd-whatif", "--tokens", "8192", "--link-gbps", "49", "--calibration", "auto", "-o", str(tmp_path)]
    several = runner.invoke(sim_app, args)
    assert several.exit_code == 2 and "--backend not given" in several.output and "lmcache, native" in several.output
    result = runner.invoke(sim_app, [*args, "--backend", "native"])
    assert result.exit_code == 0, result.output
    assert "calibration llama8b-h100-graphs.yaml:" in result.output and "native" in result.output
    missing = runner.invoke(sim_app, ["pd-whatif", "--calibration", str(tmp_path / "absent.yaml"), "-o", str(tmp_path)])
    assert missing.exit_code == 2 and "cannot read" in missing.output
