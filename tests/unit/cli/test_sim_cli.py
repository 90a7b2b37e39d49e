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
