"""The JSON Schemas kvbench ships (``kvbench schema NAME``): equal to what the models generate, and every kept run
and calibration validates against them with ``jsonschema`` (a validator that knows nothing of kvbench's models).

``jsonschema`` is pure Python (~3-6 ms per record here), so the unit tier validates every file but ``records.jsonl``
in full and, of each records file, its first and last lines, every failed request and every 50th line; the
``lab`` tier validates every line. A packed file (``records.jsonl.xz``, a kept run's) is read as the plain one.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from harness.results.file_schemas import SCHEMA_DIR, STORED_FILES, StoredFile, render, shipped, write_all
from harness.sim.calibration import SHIPPED_DIR
from harness.store.jsonl import PACKED_SUFFIX, read_stored_bytes, stored_file
from tests.kept_runs import PRODUCT_RUNS, kept_runs

BY_FILE: dict[str, StoredFile] = {row.file: row for row in STORED_FILES.values()}
RUNS = kept_runs(lambda path: (path / "scenario.yaml").is_file())
EVERY = 50
"""Unit tier: every EVERY-th record (besides the first and last lines and every failed request)."""


@cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads(shipped(name))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problems(name: str, document: object, where: str) -> list[str]:
    return [f"{where}: {error.json_path}: {error.message[:200]}" for error in validator(name).iter_errors(document)]


def documents(path: Path, row: StoredFile, every: int) -> list[tuple[str, object]]:
    """(where, document) of a stored file: its lines (a sample of records unless ``every`` is 1) or its mapping."""
    data = read_stored_bytes(path)
    assert data is not None, f"{path}: missing"
    text = data.decode("utf-8")
    if not row.lines:
        return [(str(path), yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text))]
    lines = text.splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        sample = row.name != "records" or every == 1 or number in (1, len(lines)) or number % every == 0
        if line.strip() and (sample or '"ok":false' in line.replace(" ", "")):
            kept.append((f"{path}:{number}", json.loads(line)))
    return kept


def test_the_shipped_schemas_are_the_generated_ones() -> None:
    stale = [name for name in STORED_FILES if shipped(name) != render(name)]
    assert not stale, f"regenerate with: python3 -m harness.results.file_schemas (stale: {', '.join(stale)})"
    assert sorted(p.name for p in SCHEMA_DIR.iterdir()) == sorted(f"{n}.schema.json" for n in STORED_FILES)


def test_write_all_writes_what_ships(tmp_path: Path) -> None:
    for path in write_all(tmp_path):
        assert path.read_text(encoding="utf-8") == (SCHEMA_DIR / path.name).read_text(encoding="utf-8")


def test_the_schemas_cover_the_files_the_issue_names() -> None:
    names = {"records", "manifest", "summary", "sweep", "soak", "replay", "fleet", "calibration"}
    assert names <= set(STORED_FILES)


@pytest.mark.parametrize("run", RUNS)
def test_every_stored_file_of_a_kept_run_validates(run: Path) -> None:
    names = sorted({path.name.removesuffix(PACKED_SUFFIX) for path in run.iterdir()})
    found = [(run / name, BY_FILE[name]) for name in names if name in BY_FILE]
    assert {"scenario", "manifest", "records"} <= {row.name for _, row in found}
    bad = [
        p for path, row in found for where, doc in documents(path, row, EVERY) for p in problems(row.name, doc, where)
    ]
    assert not bad, "\n".join(bad[:20])


@pytest.mark.lab
@pytest.mark.parametrize("run", [p for p in sorted(PRODUCT_RUNS.iterdir()) if stored_file(p / "records.jsonl")])
def test_every_record_line_of_a_product_run_validates(run: Path) -> None:
    path = run / "records.jsonl"
    bad = [p for where, doc in documents(path, STORED_FILES["records"], 1) for p in problems("records", doc, where)]
    assert not bad, "\n".join(bad[:20])


@pytest.mark.parametrize("path", sorted(SHIPPED_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_calibration_validates(path: Path) -> None:
    # (lab/calibrations holds schema_version 1 files, which this kvbench refuses to read too)
    bad = [
        p for where, doc in documents(path, STORED_FILES["calibration"], 1) for p in problems("calibration", doc, where)
    ]
    assert not bad, "\n".join(bad[:20])


def test_a_broken_file_does_not_validate() -> None:
    """The check above can fail: a summary with a field of the wrong type, an unknown field or a missing one."""
    summary = json.loads((PRODUCT_RUNS / "quickstart-sim" / "summary.json").read_text(encoding="utf-8"))
    assert not problems("summary", summary, "kept")
    for change in ("type", "extra", "missing"):
        broken = copy.deepcopy(summary)
        if change == "type":
            broken["cells"][0]["ttft"]["median_ms"] = "fast"
        elif change == "extra":
            broken["surprise"] = 1
        else:
            del broken["arms"]
        assert problems("summary", broken, change), change
    records = read_stored_bytes(PRODUCT_RUNS / "quickstart-sim" / "records.jsonl")
    assert records is not None
    record = json.loads(records.splitlines()[0])
    assert not problems("records", record, "kept")
    assert problems("records", {**record, "ttft_ns": -1}, "negative")
    assert problems("records", {**record, "turn": "1"}, "a string")
