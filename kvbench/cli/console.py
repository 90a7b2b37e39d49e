"""The CLI's consoles and its one way to fail: a one-line, redacted error and an exit code.

``--json`` (:func:`json_stdout`): while a command runs, everything it, its libraries and the processes it starts
write to stdout goes to stderr instead (the Python stream and file descriptor 1 both), and the result files the
command names (:func:`emit_json`) are printed to the real stdout when it ends with a verdict (exit 0, 1 or 3):
one file as is, several (or none) as a JSON array of them. So ``json.loads(stdout)`` reads the result and nothing
else; after exit 2 stdout stays empty.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import typer
from rich.console import Console
from rich.markup import escape

from common.markup import console_text
from common.redact import redact_text

if TYPE_CHECKING:
    from harness.results.verdict import Outcome

PIPE_WIDTH = 1_000_000
"""Columns of a console that is not a terminal (a pipe, a file, CI logs, tests): wider than any line kvbench
prints, so such output is never wrapped or cut; a terminal keeps its own width."""


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): a terminal's width on a terminal, :data:`PIPE_WIDTH` anywhere else."""
    made = Console(stderr=stderr)
    if not made.is_terminal:
        made.width = PIPE_WIDTH
    return made


console = make_console()
err_console = make_console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    message = redact_text(message)  # the last net: URL passwords, tokens, the API key kvbench sent
    # soft_wrap: a one-line error stays one line however long its paths are
    err_console.print(f"[bold red]error:[/] {console_text(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def os_error(error: OSError) -> str:
    where = error.filename if error.filename is not None else "output"
    return f"{where}: {error.strerror or error}"


VALID_REASON = "every validity gate passed"
"""What the verdict line of a valid run says when its result file gives no reason of its own."""


def verdict_exit(outcomes: list[Outcome], where: str = "") -> None:
    """Print the verdict line (on stderr, so ``--json`` keeps stdout for the result): ``VALID: ...``, then exit 1
    (``FAILED: ...``) or 3 (``INCONCLUSIVE: ...``) when a run measured nothing trustworthy; the reports say why."""
    from harness.results.verdict import worst

    outcome = worst(outcomes)
    if not outcome.exit_code:
        err_console.print(
            f"[bold green]VALID:[/] {escape(outcome.reason or VALID_REASON)}{escape(where)}", highlight=False
        )
        return
    err_console.print(
        f"[bold red]{outcome.status.upper()}:[/] {escape(outcome.reason)}{escape(where)}",
        highlight=False,
    )
    raise typer.Exit(outcome.exit_code)


STDOUT_FD = 1
VERDICT_EXITS = (0, 1, 3)
"""Exit codes after which a command's result file holds its verdict (valid, FAILED, INCONCLUSIVE); after 2 it
measured or read nothing to print."""


class JsonResults:
    """The JSON texts a ``--json`` command prints when it ends (in the order they were emitted)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def text(self) -> str:
        parts = [text.strip() for text in self.texts]
        if not parts:
            return "[]\n"  # a verdict without a result file (report --html --playbook): still one JSON document
        return (parts[0] if len(parts) == 1 else "[\n" + ",\n".join(parts) + "\n]") + "\n"


_results: list[JsonResults] = []  # the open --json scope, if any (a list: no module-level rebinding)


def emit_json(source: Path | str) -> None:
    """Print this result file (a path) or JSON text on stdout when the ``--json`` command ends; nothing without
    ``--json``."""
    if _results:
        _results[-1].texts.append(source.read_text(encoding="utf-8") if isinstance(source, Path) else source)


def _fd(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a test runner's in-memory stream
        return None


@contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """With ``enabled`` (the command's ``--json``): stdout goes to stderr while the block runs, then the emitted
    results are printed on the real stdout if the block ends with a verdict (:data:`VERDICT_EXITS`)."""
    if not enabled:
        yield
        return
    real = sys.stdout
    real.flush()
    err_fd = _fd(sys.__stderr__) if sys.__stderr__ is not None else None
    saved = None
    if err_fd is not None:
        # engines, C code and child processes write to descriptor 1 itself, not through sys.stdout
        saved = os.dup(STDOUT_FD)
        os.dup2(err_fd, STDOUT_FD)
    results = JsonResults()
    _results.append(results)
    sys.stdout = sys.stderr
    stdout_width = console.width
    console.width = err_console.width  # the tables now go to stderr: its width (a terminal's, or no limit)
    verdict = False
    try:
        yield
        verdict = True
    except typer.Exit as stop:
        verdict = stop.exit_code in VERDICT_EXITS
        raise
    finally:
        sys.stderr.flush()
        sys.stdout = real
        console.width = stdout_width
        if saved is not None:
            os.dup2(saved, STDOUT_FD)
            os.close(saved)
        _results.remove(results)
        if verdict:
            real.write(results.text())
            real.flush()
