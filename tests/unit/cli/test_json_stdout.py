"""``--json``'s split (:func:`kvbench.cli.console.json_stdout`): while a command runs, whatever it, a library or a
child process writes to stdout lands on stderr; stdout gets the emitted result files only, and only after a
verdict (exit 0, 1, 3), never after exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kvbench.cli.console import console, emit_json, json_stdout


def noisy() -> None:
    print("print()")
    console.print("rich console")
    typer.echo("typer.echo")
    sys.stdout.flush()
    os.write(1, b"file descriptor 1\n")
    subprocess.run([sys.executable, "-c", "print('child process')"], check=True)


def test_everything_but_the_result_goes_to_stderr(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    result = tmp_path / "summary.json"
    result.write_text('{"schema_version": 1, "cells": []}\n', encoding="utf-8")
    with json_stdout(True):
        noisy()
        emit_json(result)
    out, err = capfd.readouterr()
    assert json.loads(out) == {"schema_version": 1, "cells": []}
    for line in ("print()", "rich console", "typer.echo", "file descriptor 1", "child process"):
        assert line in err and line not in out


@pytest.mark.parametrize(("code", "printed"), [(0, True), (1, True), (3, True), (2, False)])
def test_the_result_is_printed_after_a_verdict_only(
    code: int, printed: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit), json_stdout(True):
        emit_json('{"verdict": "x"}')
        raise typer.Exit(code)
    out, _ = capfd.readouterr()
    assert (out != "") == printed and (not printed or json.loads(out) == {"verdict": "x"})


def test_several_results_are_one_array(capfd: pytest.CaptureFixture[str]) -> None:
    with json_stdout(True):
        emit_json('{"a": 1}\n')
        emit_json('{"b": 2}')
    assert json.loads(capfd.readouterr().out) == [{"a": 1}, {"b": 2}]


def test_a_verdict_without_a_result_is_an_empty_array(capfd: pytest.CaptureFixture[str]) -> None:
    with json_stdout(True):
        print("only notes")
    assert json.loads(capfd.readouterr().out) == []


def test_without_json_nothing_changes(capfd: pytest.CaptureFixture[str]) -> None:
    with json_stdout(False):
        print("plain")
        emit_json('{"a": 1}')
    out, err = capfd.readouterr()
    assert out == "plain\n" and err == ""
