"""The output registry: the fleet report is a row that applies when a run has a fleet.json, the HTML case study and
the gate's comparison are one-file rows written where the caller says, and ``kvbench report --format`` picks rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from common.errors import KvbenchError
from harness.gate.compare import compare_paths
from harness.store.rundir import RunDir
from kvbench.cli import app
from reports.outputs import OUTPUTS, RUN_KINDS, formats, write_output, write_outputs
from tests.resultfiles import make_probe_run

FLEET_RUN = Path(__file__).resolve().parents[3] / "docs" / "results" / "fleet-sim"


def test_the_fleet_report_is_written_when_the_run_has_a_fleet_json(tmp_path: Path) -> None:
    copy = tmp_path / FLEET_RUN.name
    shutil.copytree(FLEET_RUN, copy, ignore=shutil.ignore_patterns("report"))
    run_dir = RunDir.open(copy)
    console = Console(record=True, width=200)

    assert write_outputs(run_dir, console, formats={"fleet"}) == [run_dir.report_dir / "fleet.md"]
    assert (run_dir.report_dir / "fleet.md").read_bytes() == (FLEET_RUN / "report" / "fleet.md").read_bytes()
    assert console.export_text() == ""  # only the format asked for

    run_dir.fleet_file.unlink()
    assert write_outputs(run_dir, console, formats={"fleet"}) == []
    assert "fleet.md" not in {path.name for path in write_outputs(run_dir)}


def test_a_single_replica_run_writes_no_fleet_report(tmp_path: Path) -> None:
    written = {path.name for path in write_outputs(RunDir.open(make_probe_run(tmp_path)))}
    assert "ttft_table.md" in written and "fleet.md" not in written


def test_every_run_kind_can_ask_for_the_fleet_report_and_the_html_is_not_a_default() -> None:
    fleet = [output for output in OUTPUTS if output.format == "fleet"]
    assert len(fleet) == 1 and set(fleet[0].kinds) == set(RUN_KINDS)
    assert all(not output.default for output in OUTPUTS if output.format == "html")
    assert formats(["compare"]) == ["markdown", "junit", "json", "console"]


def test_the_gate_comparison_goes_through_the_registry(tmp_path: Path) -> None:
    baseline = make_probe_run(tmp_path / "a", speedup=4.0)
    current = make_probe_run(tmp_path / "b", speedup=4.0)
    result = compare_paths(baseline, current)
    junit = write_output("compare", "junit", result, tmp_path / "ci" / "gate.xml")
    assert junit == tmp_path / "ci" / "gate.xml" and junit.read_text().startswith("<?xml")
    as_json = json.loads(write_output("compare", "json", result, tmp_path / "gate.json").read_text())
    assert as_json["verdict"] == result.verdict
    assert "kvbench compare" in write_output("compare", "markdown", result, tmp_path / "gate.md").read_text()
    registered = "markdown, junit, json, console"
    with pytest.raises(KvbenchError, match=f"no 'pdf' output for a compare result; registered: {registered}"):
        write_output("compare", "pdf", result, tmp_path / "gate.pdf")


def test_report_writes_the_formats_asked_for(tmp_path: Path) -> None:
    run = make_probe_run(tmp_path / "runs", speedup=4.0)
    result = CliRunner().invoke(app, ["report", "--rewrite", "--format", "html", str(run)])
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in (run / "report").iterdir()) == ["case-study.html"]
    tables = tmp_path / "tables"
    result = CliRunner().invoke(app, ["report", "--format", "files", str(run), "-o", str(tables)])
    assert result.exit_code == 0, result.output
    assert "ttft_table.md" in {path.name for path in tables.iterdir()}
    assert "ttft_table.md" not in {path.name for path in (run / "report").iterdir()}  # read-only without --rewrite
    result = CliRunner().invoke(app, ["report", "--format", "pdf", str(run)])
    assert result.exit_code == 2
    assert "--format: unknown format 'pdf'; allowed: files, console, fleet, pd, html" in result.output
