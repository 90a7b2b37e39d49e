"""A published table beside kvbench's runs (``kvbench versus``), from the committed 70B run directories."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.engines.modeldir import shape_config
from harness.results.run_result import RunResult
from reports.published import PublishedError, expectation, load_spec, render_published, side_by_side

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "docs" / "published" / "seed-llama70b.yaml"
FP8 = ROOT / "docs" / "results" / "gpu-seed-llama70b-tp4-fp8-h200"
BF16 = ROOT / "docs" / "results" / "gpu-seed-llama70b-tp4-fp16-h200"
HASH_MISS = ROOT / "lab" / "runs" / "gpu-seed-llama70b-tp4-fp16-h200-hash-miss"


def test_the_committed_page_is_what_the_spec_renders_today() -> None:
    assert (SPEC.parent / "seed-llama70b.md").read_text(encoding="utf-8") == render_published(SPEC)


def test_columns_carry_the_runs_medians_and_reject_the_turns_the_verdict_rejects() -> None:
    spec = load_spec(SPEC)
    headers, rows, notes = side_by_side(spec, SPEC.parent)
    assert headers[1:] == [f"{column.name} (published / kvbench)" for column in spec.columns]
    fp8 = RunResult.read_file(FP8 / "summary.json")
    by_tokens = {row[0]: row for row in rows}
    on_t2 = fp8.cell("AMG-ON-LMCache", 128000, 2)
    assert on_t2 is not None and on_t2.ttft is not None
    assert by_tokens["128,000"][5] == f"254.8 / {on_t2.ttft.median_ms:,.1f}"
    assert by_tokens["2,000"][5].startswith("— / ")  # measured where the seed printed nothing
    bf16 = RunResult.read_file(BF16 / "summary.json").cell("AMG-ON-LMCache", 128000, 2)
    assert bf16 is not None and bf16.ttft is not None
    assert by_tokens["128,000"][2] == f"301.5 / {bf16.ttft.median_ms:,.1f}"
    assert not any("✗" in cell for row in rows for cell in row) and not any(n.startswith("✗") for n in notes)


@pytest.mark.lab
def test_turns_the_verdict_rejects_are_crossed_out(tmp_path: Path) -> None:
    """The first BF16 run's LMCache arm never hit the tier (hash seeds per process): its turn 2 is
    rejected, its turn 1 (a real turn 1) is kept."""
    text = SPEC.read_text(encoding="utf-8").replace("../results/gpu-seed-llama70b-tp4-fp16-h200", str(HASH_MISS))
    text = text.replace("../results/", str(ROOT / "docs" / "results") + "/")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text, encoding="utf-8")
    _headers, rows, notes = side_by_side(load_spec(spec_path), tmp_path)
    assert all(row[2].endswith("/ ✗") for row in rows)
    assert not any(row[1].endswith("✗") for row in rows)
    assert any(note.startswith("✗ FP16 ON t2") and "external prefix hits 0" in note for note in notes)


def test_expectation_fits_one_rate_and_reports_the_load_rate_reached() -> None:
    spec = load_spec(SPEC)
    wanted = next(run for run in spec.expectation if "FP8" in run.label)
    _headers, rows, notes = expectation(spec, SPEC.parent, wanted)
    fp8 = RunResult.read_file(FP8 / "summary.json")

    def median(arm: str, tokens: int, turn: int) -> float:
        cell = fp8.cell(arm, tokens, turn)
        assert cell is not None and cell.ttft is not None
        return cell.ttft.median_ms

    first, last = rows[0], rows[-1]
    assert first[1] == first[2] and last[1] == last[2]  # the two lengths the rate and t_fixed come from
    config = shape_config("llama-3.1-70b")
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    kv_per_gpu = 2 * config["num_hidden_layers"] * (config["num_key_value_heads"] // 4) * head_dim * 2  # bf16, TP 4
    load_s = (median("AMG-ON-LMCache", 128000, 2) - median("AMG-OFF", 50, 1)) / 1000
    assert last[6] == f"{128000 * kv_per_gpu / load_s / 1e9:.1f}"
    assert any("TFLOP/s per GPU" in note for note in notes)


def test_a_row_with_the_wrong_number_of_values_names_the_file_and_row(tmp_path: Path) -> None:
    data = yaml.safe_load(SPEC.read_text())
    data["rows"][8000] = [1.0, 2.0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(PublishedError, match=r"bad\.yaml: rows\.8000: 2 values for 6 columns"):
        load_spec(bad)
    data = yaml.safe_load(SPEC.read_text())
    data["colums"] = data.pop("columns")
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(PublishedError, match=r"bad\.yaml: col"):
        load_spec(bad)
