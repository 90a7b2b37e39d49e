"""The CLI's consoles and its one way to fail: a one-line, redacted error and an exit code."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from common.markup import console_text
from common.redact import redact_text

if TYPE_CHECKING:
    from harness.results.verdict import Outcome

console = Console()
err_console = Console(stderr=True)
for _stream in (console, err_console):
    if not _stream.is_terminal:
        # piped or captured output (CI logs, tests) keeps whole lines instead of wrapping at 80 columns
        _stream.width = 200


def fail(message: str, code: int = 2) -> typer.Exit:
    message = redact_text(message)  # the last net: URL passwords, tokens, the API key kvbench sent
    # soft_wrap: a one-line error stays one line however long its paths are
    err_console.print(f"[bold red]error:[/] {console_text(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def os_error(error: OSError) -> str:
    where = error.filename if error.filename is not None else "output"
    return f"{where}: {error.strerror or error}"


def verdict_exit(outcomes: list[Outcome], where: str = "") -> None:
    """Exit 1 (FAILED) or 3 (INCONCLUSIVE) when a run measured nothing trustworthy; the reports say why."""
    from harness.results.verdict import worst

    outcome = worst(outcomes)
    if outcome.exit_code:
        err_console.print(
            f"[bold red]{outcome.status.upper()}:[/] {escape(outcome.reason)}{escape(where)}",
            highlight=False,
        )
        raise typer.Exit(outcome.exit_code)
