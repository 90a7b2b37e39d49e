"""User-chosen names (scenarios, arms, stages, paths) shown in Rich consoles and Markdown reports.

A name is data, never formatting: ``[/]`` or ``[bold]`` in a scenario name must print as written
and never raise a Rich ``MarkupError``; ``*``, ``_``, ``|`` or a backtick must not restyle a
Markdown report or break its tables.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.markup import escape as _rich_escape

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|<>~])")


def console_text(text: object) -> str:
    """``text`` as literal characters inside a Rich markup string."""
    return _rich_escape(str(text))


def md_text(text: object) -> str:
    """``text`` as literal characters in Markdown prose or a table cell (one line)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def md_table(header: Sequence[object], body: Sequence[Sequence[str]]) -> list[str]:
    """A right-aligned Markdown table: ``header`` escaped (:func:`md_text`), ``body`` cells as given
    (numbers and marks the caller formatted); ``(none)`` when there is no row."""
    if not body:
        return ["(none)"]
    return [
        "| " + " | ".join(md_text(title) for title in header) + " |",
        "|" + "|".join("---:" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]
