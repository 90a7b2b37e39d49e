"""A run directory is validated when it is read: a bad manifest or an impossible record is refused.

One real ``kvbench run`` of a small simulator scenario writes the run directory; copies of it are
then damaged the way the issue found them, and ``kvbench report`` and ``kvbench compare`` must
refuse each with exit 2 and one line naming the file, the line (for records) and the field:

* R8: ``manifest.json`` replaced by ``{"manifest_version": 99}`` (and a version-1 manifest missing
  its fields);
* R3: a record with ``ttft_ns`` -5e9, 1e18, the string ``"12"``, or ``ok: true`` with a null TTFT.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvbench.cli import app
from tests.support import kvbench

pytestmark = pytest.mark.integration

WORKLOAD = {"kind": "multi_round_qa", "context_tokens": [1000], "conversations": 2, "turns": 2, "answer_tokens": 4}
SCENARIO = {
    "name": "validated-on-load",
    "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
    "arms": [{"name": "AMG-ON", "offload": "cpu"}],
    "workload": {**WORKLOAD, "warmup_requests": 0},
    "seed": 3,
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    (tmp / "small.yaml").write_text(yaml.safe_dump(SCENARIO))
    done = kvbench("run", str(tmp / "small.yaml"), "-o", str(tmp / "runs"), cwd=tmp)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (path,) = (tmp / "runs").iterdir()
    return path


def damaged(run_dir: Path, tmp: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp / "damaged" / run_dir.name
    shutil.copytree(run_dir, copy)
    damage(copy)
    return copy


def refused(run_dir: Path, copy: Path, *expected: str) -> None:
    """``report`` and ``compare`` both exit 2 with one error line that names ``expected``.

    In process: a refusal is the reading code's, which is the same there, and the undamaged run above is read by
    the ``kvbench`` a user starts (about 3 s of interpreter and imports per call saved, 20 calls here)."""
    runner = CliRunner()
    report = runner.invoke(app, ["report", str(copy)])
    compare = runner.invoke(app, ["compare", str(run_dir), str(copy)])
    for done in (report, compare):
        assert done.exit_code == 2, done.output
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
        for text in expected:
            assert text in lines[0], lines[0]
        assert "PASS" not in done.stdout


def test_the_undamaged_run_reports_and_compares(run_dir: Path) -> None:
    assert kvbench("report", str(run_dir), cwd=run_dir.parent).returncode == 0
    assert kvbench("compare", str(run_dir), str(run_dir), cwd=run_dir.parent).returncode in (0, 3)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({"manifest_version": 99}, ("manifest.json", "manifest_version 99", "reads 1")),
        ({"manifest_version": 1}, ("manifest.json", "run_id: missing")),
        ({"manifest_version": "1"}, ("manifest.json", "manifest_version '1'")),
    ],
)
def test_a_manifest_of_another_version_or_without_its_fields_is_refused(
    run_dir: Path, tmp_path: Path, manifest: dict[str, Any], expected: tuple[str, ...]
) -> None:
    def replaced(path: Path) -> None:
        (path / "manifest.json").write_text(json.dumps(manifest))

    copy = damaged(run_dir, tmp_path, replaced)
    refused(run_dir, copy, *expected)


def test_a_manifest_field_of_the_wrong_type_is_refused(run_dir: Path, tmp_path: Path) -> None:
    def engines_as_list(path: Path) -> None:
        data = json.loads((path / "manifest.json").read_text())
        data["engines"] = []
        (path / "manifest.json").write_text(json.dumps(data))

    refused(run_dir, damaged(run_dir, tmp_path, engines_as_list), "manifest.json", "engines: must be an object")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ttft_ns", -5e9, "ttft_ns: Input should be a valid integer"),
        ("ttft_ns", -5_000_000_000, "ttft_ns: Input should be greater than or equal to 0"),
        ("ttft_ns", 10**18, "ttft_ns: Input should be less than or equal to 86400000000000"),
        ("ttft_ns", "12", "ttft_ns: Input should be a valid integer"),
        ("ttft_ns", None, "ok: Value error, true needs a TTFT"),
        ("cached_tokens", -1, "cached_tokens: Input should be greater than or equal to 0"),
    ],
)
def test_an_impossible_record_is_refused_with_file_line_and_field(
    run_dir: Path, tmp_path: Path, field: str, value: object, expected: str
) -> None:
    def corrupt_a_measured_record(path: Path) -> None:
        lines = (path / "records.jsonl").read_text().splitlines()
        index = next(i for i, line in enumerate(lines) if json.loads(line)["phase"] == "measure")
        record = json.loads(lines[index])
        assert record["ok"] is True
        record[field] = value
        lines[index] = json.dumps(record)
        (path / "records.jsonl").write_text("\n".join(lines) + "\n")
        (path / "line").write_text(str(index + 1))

    copy = damaged(run_dir, tmp_path, corrupt_a_measured_record)
    refused(run_dir, copy, f"records.jsonl:{(copy / 'line').read_text()}:", expected)
