"""A CSV file written in one call: a header row, then one row per item, in UTF-8 with the ``csv`` module's
``\\r\\n`` line ends (``newline=""`` lets the writer choose them), its folder made first."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path


def write_csv_rows(path: Path, header: Sequence[object], body: Iterable[Sequence[object]]) -> None:
    """Write ``header`` and the rows of ``body`` to ``path`` (replacing it), making its folder if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(body)
