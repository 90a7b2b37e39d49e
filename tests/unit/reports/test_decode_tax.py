"""The decode tax: its formula in the versus-metric table, and its section in the sweep, agentic and HTML reports.

The points are the sweep report tests' synthetic ones (tests/unit/reports/test_curves.py), whose TPOT follows
their TPS/user; the kept agentic GPU run checks the figure on real data against its own stored TPOTs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from harness.results.agentic_result import AgenticResult
from harness.results.sweep_metrics import VERSUS_METRICS, decode_tax, decode_tax_p90, decode_taxes
from harness.results.sweep_result import Quantiles, SweepResult
from reports.agentic import print_agentic
from reports.agentic import write_markdown as agentic_markdown
from reports.curves import print_sweep, write_markdown
from reports.decode_tax import decode_tax_rows
from reports.html import agents_view

from .test_curves import point, result

ROOT = Path(__file__).resolve().parents[3]
AGENTIC = ROOT / "docs" / "results" / "gpu-agentic-llama8b-h200"


def test_decode_tax_is_the_arms_tpot_over_the_baselines_at_the_same_load() -> None:
    off = point("AMG-OFF", 0, 8, 1.0, 50, True, 500)  # TPOT p50 1000 / 50 = 20 ms, p90 22 ms
    on = point("AMG-ON", 0, 8, 1.0, 40, True, 400)  # 25 ms, p90 27.5 ms: each user's tokens 25 % slower
    assert decode_tax(on, off) == pytest.approx(25.0)
    assert decode_tax(off, on) == pytest.approx(-20.0)
    assert decode_tax_p90(on, off) == pytest.approx(25.0)
    assert VERSUS_METRICS["decode_tax"].unit == "%" and "TPOT p50 of the arm" in VERSUS_METRICS["decode_tax"].formula
    one = Quantiles(n=1, p50_ms=99.0, p90_ms=99.0, p99_ms=99.0, mean_ms=99.0, max_ms=99.0)
    assert decode_tax(on.model_copy(update={"tpot": one}), off) is None  # one request: no median to judge
    assert decode_tax(on.model_copy(update={"tpot": None}), off) is None


def test_only_loads_both_arms_measured_are_compared() -> None:
    points = [*result().points, point("AMG-ON", 3, 64, 5.0, 20, False, 2000)]
    taxes = decode_taxes(points, "AMG-OFF")
    assert [(t.arm, t.load) for t in taxes] == [("AMG-ON", 8), ("AMG-ON", 16), ("AMG-ON", 32)]
    # AMG-ON at 32 users: 30 tok/s/user against 15 on AMG-OFF: TPOT halves
    assert taxes[-1].tax_pct == pytest.approx(-50.0)
    assert decode_taxes([p for p in points if p.arm == "AMG-ON"], "AMG-OFF") == []


def test_the_sweep_markdown_and_console_show_the_decode_tax(tmp_path: Path) -> None:
    sweep = result()
    markdown = write_markdown(sweep, tmp_path / "capacity.md").read_text()
    section = markdown.split("## Decode tax", 1)[1].split("\n## ", 1)[0]
    # AMG-ON at 8 users: 61 tok/s against 60: TPOT 16.4 vs 16.7 ms
    assert "| AMG-ON | 8 | 16.4 | 16.7 | -1.6 % |" in section
    assert "AMG-ON vs AMG-OFF: p50 -50.0 % to -1.6 %" in section.replace("\\", "")
    console = Console(record=True, width=250)
    print_sweep(sweep, console)
    text = console.export_text()
    assert "Decode tax (TPOT vs the baseline at the same load)" in text and "-50.0 %" in text


def test_a_one_arm_sweep_has_no_decode_tax_section(tmp_path: Path) -> None:
    sweep = result()
    alone = sweep.model_copy(update={"points": [p for p in sweep.points if p.arm == "AMG-OFF"]})
    assert "Decode tax" not in write_markdown(alone, tmp_path / "capacity.md").read_text()


def test_the_kept_agentic_run_shows_its_tax_in_markdown_console_and_html(tmp_path: Path) -> None:
    kept = AgenticResult.read_file(AGENTIC / AgenticResult.FILE_NAME)
    stored = json.loads((AGENTIC / AgenticResult.FILE_NAME).read_text())["points"]
    tpot = {(p["arm"], p["agents"]): p["point"]["tpot"]["p90_ms"] for p in stored}
    header, rows = decode_tax_rows([p.point for p in kept.points], kept.baseline_arm, "agents")
    assert header[-1] == "decode tax p90" and len(rows) == 10
    lmcache_at_2 = next(r for r in rows if r[0] == "AMG-ON-LMCache" and r[1] == "2")
    expected = (tpot[("AMG-ON-LMCache", 2)] / tpot[("AMG-OFF", 2)] - 1) * 100
    assert lmcache_at_2[-1] == f"{expected:+.1f} %" and expected > 0  # the connector slows the slow decile
    markdown = agentic_markdown(kept, tmp_path / "agents.md").read_text()
    assert "## Decode tax" in markdown and lmcache_at_2[-1] in markdown.replace("\\", "")
    console = Console(record=True, width=250)
    print_agentic(kept, console)
    assert "decode tax p90" in console.export_text()
    view = agents_view([AGENTIC])
    assert view is not None
    assert any(table.columns == header and table.rows == rows for table in view.tables)
    assert any(line.startswith("AMG-ON-LMCache vs AMG-OFF: p50") for line in view.notes)


def test_the_html_capacity_view_of_a_kept_sweep_carries_the_tax() -> None:
    from reports.html import capacity_view

    sweep_dir = ROOT / "docs" / "results" / "gpu-sweep-llama8b-h100"
    sweep = SweepResult.read_file(sweep_dir / "sweep.json")
    view, _ = capacity_view([sweep_dir])
    assert view is not None
    _, rows = decode_tax_rows(sweep.points, sweep.baseline_arm, "users")
    assert rows and any(table.rows == rows for table in view.tables)
