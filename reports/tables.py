"""Tables as the reports write them: Markdown (:func:`md_rows`) and CSV cells (:func:`csv_cell`).

A Markdown table is a header row, an alignment row and one line per row; its first
``text_columns`` columns are left-aligned (names: arms, routing policies), the rest right-aligned
(numbers). Cells are written as given: the caller formats numbers and escapes text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


def md_rows(header: Sequence[str], body: Iterable[Sequence[str]], *, text_columns: int = 1) -> list[str]:
    """The table's lines (no trailing newline); an empty ``body`` gives the header and alignment rows alone."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]


_QUANTILE = re.compile(r"^(?P<attribute>\w+?)_(?P<field>p\d+_ms)$")


def csv_cell(item: object, column: str) -> object:
    """The CSV cell of ``column`` for ``item``: its attribute of that name, or, for ``NAME_pNN_ms``, the ``pNN_ms``
    of its quantiles ``NAME`` (as a float); blank ("") where the value, or the quantiles, are None."""
    if hasattr(item, column):
        value = getattr(item, column)
        return "" if value is None else value
    match = _QUANTILE.match(column)
    if match is None:
        raise AttributeError(f"{type(item).__name__} has no {column!r} and no quantiles it names")
    quantiles = getattr(item, match["attribute"])
    return "" if quantiles is None else float(getattr(quantiles, match["field"]))
