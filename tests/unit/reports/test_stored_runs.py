"""The kept run directories still load, and re-aggregate and re-render to exactly what is committed.

Each kept run directory (probe, sweep, soak, replay and agentic; the product's in the unit tier, the lab's under
the ``lab`` marker) is aggregated from its stored files alone, as ``kvbench report`` does, without writing into
it: its result file (and a fleet's ``fleet.json``) must equal the committed one byte for byte, and every Markdown
and CSV output, rendered into a temporary folder, must equal the committed one in ``report/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runs.kinds import results_of
from harness.store.jsonl import read_stored_bytes
from harness.store.rundir import RunDir
from reports.outputs import write_outputs
from tests.kept_runs import PRODUCT_RUNS, kept_runs

STORED = kept_runs(lambda path: (path / "scenario.yaml").exists())
TEXT_OUTPUTS = {".md", ".csv"}


@pytest.mark.parametrize("stored", STORED)
def test_a_committed_run_rebuilds_to_the_same_files(stored: Path, tmp_path: Path) -> None:
    run_dir = RunDir.open(stored)
    results = results_of(run_dir)

    kept = read_stored_bytes(stored / results.result.FILE_NAME) or b""  # a lab run keeps it packed
    assert results.result.file_text() == kept.decode("utf-8"), (
        f"{results.result.FILE_NAME} differs from what its records give: kvbench report --rewrite {stored}"
    )
    kept_fleet = read_stored_bytes(run_dir.fleet_file)  # packed in a lab run
    assert (results.fleet is not None) is (kept_fleet is not None)
    if results.fleet is not None and kept_fleet is not None:
        assert results.fleet.file_text() == kept_fleet.decode("utf-8")
    written = write_outputs(run_dir, results=results, into=tmp_path)
    texts = [path for path in written if path.suffix in TEXT_OUTPUTS]
    # a soak's reports are the console verdict and the HTML case study: it registers no text file
    assert texts or run_dir.kind == "soak", "no Markdown or CSV output was written"
    for path in texts:
        assert path.read_bytes() == read_stored_bytes(stored / "report" / path.relative_to(tmp_path)), path.name


def test_every_kind_of_committed_result_is_covered() -> None:
    kinds = {RunDir.open(path).kind for path in PRODUCT_RUNS.iterdir() if (path / "scenario.yaml").exists()}
    assert {"probe", "sweep", "replay"} <= kinds
