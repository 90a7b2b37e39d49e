"""Every reader of a JSON (or YAML) document kvbench stores or is handed, over a document nested 100,000 deep:
one line naming the file, never a ``RecursionError`` (``json.loads`` and PyYAML's composer recurse per level).

The CLI paths (``trace stats``, ``report``) are in ``tests/unit/cli/test_hostile_files.py``; these are the readers
without a command of their own to reach them by.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import CalibrationError, RunDirError
from common.jsonfile import MAX_DEPTH, JsonProblem, parse_json, short_repr
from harness.results.modelshape import hf_config
from harness.results.run_result import RunResult
from harness.sim.calibration import Calibration
from harness.sim.faults import load_faults
from harness.store.lock import _holder
from harness.store.manifest import read_manifest
from harness.store.records import read_records

DEEP = "[" * 100_000 + "]" * 100_000


def deep_file(tmp_path: Path, name: str, text: str = DEEP) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_one_line(error: BaseException, *needles: str) -> None:
    message = str(error)
    assert "\n" not in message and len(message) < 400, message[:1000]
    for needle in needles:
        assert needle in message, message


def test_the_parser_refuses_nesting_past_its_limit_and_reads_up_to_it() -> None:
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    for deeper in (MAX_DEPTH + 1, 900, 100_000):  # 900: json.loads reads it, a later repr or walk would not
        with pytest.raises(JsonProblem) as caught:
            parse_json("[" * deeper + "]" * deeper)
        assert_one_line(caught.value, f"nested deeper than {MAX_DEPTH} levels")
    with pytest.raises(JsonProblem) as caught:
        parse_json('{"a": [1, 2}')
    assert_one_line(caught.value, "at line 1 column 12")


def test_an_echoed_value_is_capped_however_large_or_deep() -> None:
    nested: object = 1
    for _ in range(5000):
        nested = [nested]
    assert len(short_repr(nested)) <= 120 and len(short_repr("x" * 10**6)) <= 120
    assert short_repr(3) == "3"


def test_a_manifest(tmp_path: Path) -> None:
    path = deep_file(tmp_path, "manifest.json")
    with pytest.raises(RunDirError) as caught:
        read_manifest(path)
    assert_one_line(caught.value, str(path), "nested deeper than")


def test_a_result_file(tmp_path: Path) -> None:
    path = deep_file(tmp_path, "summary.json")
    with pytest.raises(RunDirError) as caught:
        RunResult.read_file(path)
    assert_one_line(caught.value, str(path), "nested deeper than")


def test_a_result_file_that_is_not_an_object_or_not_valid(tmp_path: Path) -> None:
    with pytest.raises(RunDirError) as caught:
        RunResult.read_file(deep_file(tmp_path, "summary.json", "[1]"))
    assert_one_line(caught.value, "not a JSON object: got list")
    with pytest.raises(RunDirError) as caught:
        current = RunResult.model_fields[
            "schema_version"
        ].default  # the version this kvbench reads: the fields are wrong
        RunResult.read_file(deep_file(tmp_path, "summary.json", f'{{"schema_version": {current}, "cells": 7}}'))
    assert_one_line(caught.value, "not a valid RunResult")


def test_a_records_line(tmp_path: Path) -> None:
    path = deep_file(tmp_path, "records.jsonl", DEEP + "\n")
    with pytest.raises(RunDirError) as caught:
        list(read_records(path))
    assert_one_line(caught.value, f"{path}:1", "recursion limit")


def test_a_calibration_file(tmp_path: Path) -> None:
    path = deep_file(tmp_path, "cal.yaml", "a: " + DEEP)
    with pytest.raises(CalibrationError) as caught:
        Calibration.load(path)
    assert_one_line(caught.value, str(path), "nested too deeply")


def test_a_fault_file(tmp_path: Path) -> None:
    for name in ("faults.json", "faults.yaml"):
        path = deep_file(tmp_path, name)
        with pytest.raises(ValueError) as caught:
            load_faults(path)
        assert_one_line(caught.value, str(path))


def test_a_model_config_and_a_lock_holder(tmp_path: Path) -> None:
    deep_file(tmp_path, "config.json")
    data, problem = hf_config(str(tmp_path))
    assert data is None and "nested deeper than" in problem
    assert _holder(deep_file(tmp_path, ".attempt.lock")) == "holder unknown"
