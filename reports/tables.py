"""Markdown tables as the reports write them: a header row, an alignment row, one line per row.

The first ``text_columns`` columns are left-aligned (names: arms, routing policies), the rest
right-aligned (numbers). Cells are written as given: the caller formats numbers and escapes text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_rows(header: Sequence[str], body: Iterable[Sequence[str]], *, text_columns: int = 1) -> list[str]:
    """The table's lines (no trailing newline); an empty ``body`` gives the header and alignment rows alone."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]
