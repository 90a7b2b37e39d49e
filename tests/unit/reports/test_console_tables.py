"""Console tables keep every number whole: at 80 columns (a terminal's width) labels and headers wrap, a table too
wide for its floors is split into column groups led by its first column, and no line passes 80 columns; on a
console that is not a terminal (:data:`kvbench.cli.console.PIPE_WIDTH`) nothing is wrapped or cut.

Every console view of every kept run in ``docs/results`` (probe, sweep, agentic, replay, soak, fleet) is drawn
both ways; each number standing alone in the wide drawing must stand, whole, as often in the 80-column one."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from harness.store.rundir import RunDir
from kvbench.cli.console import PIPE_WIDTH
from reports.outputs import write_outputs
from reports.tables import print_table

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
KEPT = sorted(path for path in RESULTS.iterdir() if (path / "manifest.json").is_file())
NUMBER = re.compile(r"(?<![\w.,/-])[-+]?\d[\d.,]*\d(?![\w.,/-])|(?<![\w.,/-])\d(?![\w.,/-])")


def drawn(run_dir: Path, width: int) -> str:
    out = io.StringIO()
    write_outputs(RunDir(run_dir), Console(file=out, width=width), formats={"console"})
    return out.getvalue()


def numbers(text: str) -> Counter[str]:
    return Counter(match.rstrip(".,") for match in NUMBER.findall(text))


@pytest.mark.parametrize("run_dir", KEPT, ids=[path.name for path in KEPT])
def test_kept_runs_keep_every_number_at_80_columns(run_dir: Path) -> None:
    wide = drawn(run_dir, PIPE_WIDTH)
    narrow = drawn(run_dir, 80)
    assert "…" not in wide and "…" not in narrow
    assert max(cell_len(line) for line in narrow.splitlines()) <= 80
    missing = numbers(wide) - numbers(narrow)
    assert not missing, f"numbers cut or lost at 80 columns: {dict(missing)}"


def test_a_table_too_wide_for_the_terminal_is_split_into_groups_led_by_its_first_column() -> None:
    table = Table(title="wide", caption="a caption")
    table.add_column("arm")
    for index in range(12):
        table.add_column(f"metric {index}", justify="right")
    table.add_row("AMG-OFF", *(f"{1144.5 + index:.1f}" for index in range(12)))
    out = io.StringIO()
    print_table(Console(file=out, width=60), table)
    text = out.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 60
    rows = [line for line in text.splitlines() if "AMG-OFF" in line]
    assert len(rows) >= 2  # one per group, each led by the first column
    for index in range(12):
        assert f" {1144.5 + index:.1f} " in text
    assert text.count("wide") == 1 and text.count("a caption") == 1
    assert table.columns[0].width is None  # the caller's table is left as it was


def test_a_console_that_is_not_a_terminal_draws_the_table_whole() -> None:
    table = Table(title="one line per row")
    for index in range(30):
        table.add_column(f"column {index}", justify="right")
    table.add_row(*(f"{index * 1000.25:.2f}" for index in range(30)))
    out = io.StringIO()
    print_table(Console(file=out, width=PIPE_WIDTH), table)
    (row,) = [line for line in out.getvalue().splitlines() if "29007.25" in line]
    assert all(f"{index * 1000.25:.2f}" in row for index in range(30))
