"""What ``kvbench`` prints, as a user sees it: on an 80-column pseudo-terminal every table fits and keeps its
numbers whole; through a pipe nothing is wrapped or cut (one line per table row, however wide). The commands:
``sim profiles`` (three tables wider than 80 columns), ``trace stats`` and ``report`` of a kept probe run (the
quickstart table whose ``1144.5`` rich used to cut)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
import subprocess
import termios
from collections import Counter
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.support import REPO, kvbench, kvbench_argv, kvbench_env

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
TRACE = REPO / "workloads" / "data" / "sample-text.jsonl"
NUMBER = re.compile(r"(?<![\w.,/-])[-+]?\d[\d.,]*\d(?![\w.,/-])|(?<![\w.,/-])\d(?![\w.,/-])")


def on_terminal(args: list[str], cwd: Path, columns: int = 80, stdout_piped: bool = False) -> str:
    """``kvbench ARGS`` on a pseudo-terminal ``columns`` wide (with ``stdout_piped``, its stdout to a pipe that is
    read and dropped, as ``> file`` would); what the terminal received, colours removed."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {key: value for key, value in kvbench_env().items() if key not in ("COLUMNS", "LINES")}
    stdout = subprocess.DEVNULL if stdout_piped else follower
    process = subprocess.Popen(kvbench_argv(*args), stdin=follower, stdout=stdout, stderr=follower, env=env, cwd=cwd)
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed when the process exited
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    assert process.wait(timeout=120) == 0, received.decode(errors="replace")[-3000:]
    return ANSI.sub("", received.decode()).replace("\r\n", "\n")


def numbers(text: str) -> Counter[str]:
    return Counter(NUMBER.findall(text))


def commands(tmp_path: Path) -> list[list[str]]:
    run_dir = tmp_path / "quickstart-sim"
    shutil.copytree(REPO / "docs" / "results" / "quickstart-sim", run_dir)  # report rebuilds into its directory
    return [["sim", "profiles"], ["report", str(run_dir)], ["trace", "stats", str(TRACE)]]


def test_tables_fit_80_columns_on_a_terminal_and_are_whole_through_a_pipe(tmp_path: Path) -> None:
    for args in commands(tmp_path):
        piped = kvbench(*args, cwd=tmp_path)
        assert piped.returncode == 0, piped.stderr
        whole = piped.stdout + piped.stderr
        terminal = on_terminal(args, tmp_path)
        assert "…" not in whole and "…" not in terminal, args
        assert max(cell_len(line) for line in terminal.splitlines()) <= 80, args
        missing = numbers(whole) - numbers(terminal)
        assert not missing, f"{args}: numbers cut on the terminal: {dict(missing)}"
    profiles = kvbench("sim", "profiles", cwd=tmp_path).stdout
    rows = [line for line in profiles.splitlines() if "meta-llama/Llama-3.1-70B-Instruct" in line]
    assert len(rows) == 1 and "131072" in rows[0]  # a pipe is never wrapped: the whole row on one line
    assert max(cell_len(line) for line in profiles.splitlines()) > 80
    quickstart = kvbench("report", str(tmp_path / "quickstart-sim"), cwd=tmp_path).stdout
    (row,) = [line for line in quickstart.splitlines() if line.startswith("│  32000 ")]
    assert "1133.286" in row and "491.74" in row and "99.6" in row
    # --json > file: the result goes to the file, the tables to stderr, which is the terminal: they fit it
    beside_json = on_terminal(["report", str(tmp_path / "quickstart-sim"), "--json"], tmp_path, stdout_piped=True)
    assert "1133.286" in beside_json and max(cell_len(line) for line in beside_json.splitlines()) <= 80
