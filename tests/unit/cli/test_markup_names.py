"""Names with Rich markup or Markdown syntax print literally and never crash a command."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from common.markup import console_text, md_text
from kvbench.cli import app
from tests.resultfiles import probe_scenario
from tests.unit.gate.test_compare import make_run

NASTY = "x [/] [bold]y[/bold] *z* | `q` _w_"


def nasty_scenario() -> dict[str, object]:
    return probe_scenario(NASTY, conversations=8)


def test_validate_prints_a_markup_name_literally(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(nasty_scenario()), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert NASTY in result.output


def test_error_naming_a_markup_path_prints_literally(tmp_path: Path) -> None:
    missing = tmp_path / "[/]oops[bold].yaml"
    result = CliRunner().invoke(app, ["validate", str(missing)])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "[/]oops[bold].yaml" in result.output


def test_report_and_compare_with_a_markup_name(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", seed=1, scenario=nasty_scenario())
    current = make_run(tmp_path / "b", seed=2, scenario=nasty_scenario())
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(current), "-o", str(tmp_path / "tables")])
    assert result.exit_code == 0, result.output
    assert NASTY in result.output  # the console table's title, literally
    markdown = (tmp_path / "tables" / "ttft_table.md").read_text(encoding="utf-8")
    assert markdown.splitlines()[0] == "# " + md_text(NASTY)
    result = runner.invoke(app, ["compare", str(base), str(current)])
    assert result.exit_code == 0, result.output
    assert f"* scenario: {md_text(NASTY)}" in result.output


def test_md_text_escapes_every_markdown_metacharacter() -> None:
    escaped = md_text("a|b*c_d`e[f](g)#h<i>\\j\nk")
    assert escaped == "a\\|b\\*c\\_d\\`e\\[f\\]\\(g\\)\\#h\\<i\\>\\\\j k"


def test_console_text_round_trips_through_rich() -> None:
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(console_text(NASTY))
    assert console.export_text().strip() == NASTY
