"""The kept run directories still load, and re-render to the same tables.

``kvbench report`` on a copy of each kept run directory (probe, sweep, soak and replay; the product's in the unit
tier, the lab's under the ``lab`` marker) rebuilds its result
file from the stored records alone and writes every output registered for its kind; the Markdown
and CSV outputs must equal the committed ones byte for byte, and every field of the committed result
file must come back unchanged except ``run_id`` (the directory was renamed when it was committed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.runs.kinds import summarize
from harness.store.rundir import RunDir
from reports.outputs import RESULT_FILES, write_outputs
from tests.kept_runs import PRODUCT_RUNS, kept_runs

STORED = kept_runs(lambda path: (path / "scenario.yaml").exists())
TEXT_OUTPUTS = {".md", ".csv"}


def contains(rebuilt: object, committed: object) -> bool:
    """``committed`` is ``rebuilt`` with at most some (nested) mapping keys left out."""
    if isinstance(committed, dict):
        return isinstance(rebuilt, dict) and all(
            key in rebuilt and contains(rebuilt[key], value) for key, value in committed.items()
        )
    if isinstance(committed, list):
        return (
            isinstance(rebuilt, list)
            and len(rebuilt) == len(committed)
            and all(contains(new, old) for new, old in zip(rebuilt, committed, strict=True))
        )
    return rebuilt == committed


@pytest.mark.parametrize("stored", STORED)
def test_a_committed_run_rebuilds_to_the_same_reports(stored: Path, tmp_path: Path) -> None:
    copy = tmp_path / stored.name
    shutil.copytree(stored, copy, ignore=shutil.ignore_patterns("report"))
    run_dir = RunDir.open(copy)
    result_file = RESULT_FILES[run_dir.kind].FILE_NAME

    summarize(run_dir)
    written = write_outputs(run_dir)

    rebuilt = json.loads((copy / result_file).read_text())
    committed = json.loads((stored / result_file).read_text())
    # fields added since (validity, the streaming check) may appear; every committed field comes back unchanged
    committed.pop("run_id")
    assert contains(rebuilt, committed)
    texts = [path for path in written if path.suffix in TEXT_OUTPUTS]
    # a soak's reports are the console verdict and the HTML case study: it registers no text file
    assert texts or run_dir.kind == "soak", "no Markdown or CSV output was written"
    for path in texts:
        assert path.read_bytes() == (stored / "report" / path.name).read_bytes(), path.name


def test_every_kind_of_committed_result_is_covered() -> None:
    kinds = {RunDir.open(path).kind for path in PRODUCT_RUNS.iterdir() if (path / "scenario.yaml").exists()}
    assert {"probe", "sweep", "replay"} <= kinds
