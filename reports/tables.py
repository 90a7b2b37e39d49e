"""Tables as the reports write them: Markdown (:func:`md_rows`), CSV cells (:func:`csv_cell`) and console tables
that never cut a number (:func:`print_table`).

A Markdown table is a header row, an alignment row and one line per row; its first
``text_columns`` columns are left-aligned (names: arms, routing policies), the rest right-aligned
(numbers). Cells are written as given: the caller formats numbers and escapes text.

A console table wider than the terminal (widths in terminal columns, padding included) is given, per column,

    width_i = floor_i + spare * (natural_i - floor_i) / sum(natural - floor)

``spare`` = terminal width - borders - sum(floor). The floor is the first of these that fits: every number cell
(``1144.5``, ``8.03 B``, ``12.3 %``, ``2,048 / 4,096``) whole and every other word whole; then header words
folded (to :data:`HEADER_FOLD` columns at least); then other text folded to each of :data:`TEXT_FOLDS`
columns; then a number's unit on its own line. Before the formula shares the room, columns are lifted to the
looser floor before theirs where the room allows (a header word whole), the smallest lifts first. Where none
fits, the table is printed as column groups, each led by its first column (packed with every
word whole); a group that still cannot fit is drawn wider than the terminal, numbers whole, rather than cut.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Sequence

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from common.markup import console_text


def text_table(table: Table, header: Sequence[str], body: Iterable[Sequence[str]], *, text_columns: int = 1) -> Table:
    """``table`` with the columns of ``header`` (its first ``text_columns`` left-aligned, the rest right-aligned) and
    the rows of ``body``; every header and cell shown as plain text (:func:`~common.markup.console_text`)."""
    for index, column in enumerate(header):
        table.add_column(console_text(column), justify="left" if index < text_columns else "right")
    for row in body:
        table.add_row(*(console_text(cell) for cell in row))
    return table


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


MEASURE_WIDTH = 1_000_000
"""Columns to measure a cell in: wider than any cell, so a measurement is the cell's own width."""
TEXT_FOLDS = (10, 6)
"""The widths (columns) a column of names may fold to, in turn, before a number's unit leaves its line."""
HEADER_FOLD = 4
"""The narrowest (columns) a header word may fold to: ``Requ`` / ``ests`` rather than one letter a line."""
_NUMBER = r"[-+−~≈<>≤≥]?\d[\d.,:/]*\s?(?:%|×|[A-Za-zµ/]{1,5})?"
NUMBER_CELL = re.compile(rf"^{_NUMBER}(?: / {_NUMBER})*$")
"""A cell that is a number, with its unit, or several joined by `` / ``: kept on one line while anything else can
give way."""


def print_table(out: Console, table: Table) -> None:
    """Print a rich table at the console's width without cutting a number (on a terminal; a console that is not
    one is wide enough for any table)."""
    out.print(WholeCells(table), crop=False)  # a column too wide for the terminal is drawn wider, never cropped


class WholeCells:
    """A rich table fitted to its width by the module's formula, or split into column groups (each led by the
    table's first column) where even its floors do not fit; its columns are restored after drawing."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table
        fit = Floors(table, console, options)
        if fit.fits(fit.natural) or any(column.width is not None for column in table.columns):
            yield table
            return
        if not fit.fits(fit.levels[-1]) and len(table.columns) > 2:
            for group in fit.groups():
                yield WholeCells(_columns_of(table, group))
            if table.caption is not None:  # below the groups at the console's width, not the last group's
                caption = table.caption
                yield caption if isinstance(caption, Text) else console.render_str(caption, style="table.caption")
            return
        widths = fit.widths()
        saved = [(column.width, column.overflow) for column in table.columns]
        for index, (column, width) in enumerate(zip(table.columns, widths, strict=True)):
            # table._get_padding_width: rich's own count of the padding beside this column's text
            column.width = width - table._get_padding_width(index)
            column.overflow = "fold"  # a word longer than its column (a header, a name) folds, whole, never "…"
        drawn = max(options.max_width, sum(widths) + table._extra_width)
        try:
            yield from console.render(table, options.update_width(drawn))
        finally:
            for column, (kept_width, kept_overflow) in zip(table.columns, saved, strict=True):
                column.width, column.overflow = kept_width, kept_overflow


class Floors:
    """A table's natural column widths and its floors (padding included), tightest last: numbers and words whole;
    headers folded; other text folded to each of :data:`TEXT_FOLDS`; a number's unit on its own line."""

    def __init__(self, table: Table, console: Console, options: ConsoleOptions) -> None:
        self.table = table
        self.console = console
        self.options = options
        self.unbounded = options.update_width(MEASURE_WIDTH)  # a cell's own width, not clipped to the terminal
        self.pads = [table._get_padding_width(index) for index in range(len(table.columns))]
        self.natural = [
            max(self.measure(cell).maximum for cell in [column.header, *column.cells]) + pad
            for column, pad in zip(table.columns, self.pads, strict=True)
        ]
        self.levels = [
            self.floors(headers=True, text_fold=None, units=True),
            self.floors(headers=False, text_fold=None, units=True),
            *(self.floors(headers=False, text_fold=fold, units=True) for fold in TEXT_FOLDS),
            self.floors(headers=False, text_fold=TEXT_FOLDS[-1], units=False),
        ]

    def measure(self, cell: RenderableType) -> Measurement:
        return Measurement.get(self.console, self.unbounded, cell)

    def fits(self, widths: Sequence[int]) -> bool:
        return sum(widths) + self.table._extra_width <= self.options.max_width  # _extra_width: borders, separators

    def floors(self, *, headers: bool, text_fold: int | None, units: bool) -> list[int]:
        widths = []
        for column, pad in zip(self.table.columns, self.pads, strict=True):
            header = self.measure(column.header).minimum
            cells = [header if headers else min(header, HEADER_FOLD)]
            for cell in column.cells:
                size = self.measure(cell)
                if NUMBER_CELL.match(_plain(self.console, cell).strip()):
                    cells.append(size.maximum if units else size.minimum)
                else:
                    cells.append(size.minimum if text_fold is None else min(size.minimum, text_fold))
            widths.append(max(cells, default=1) + pad)
        return widths

    def widths(self) -> list[int]:
        """The first floor that fits (else the tightest), its columns lifted to the looser floor where the room
        allows (the smallest lifts first), then the room left shared by the module's formula."""
        level = next((index for index, floors in enumerate(self.levels) if self.fits(floors)), len(self.levels) - 1)
        least = list(self.levels[level])
        spare = self.options.max_width - self.table._extra_width - sum(least)
        if spare <= 0:
            return least
        if level > 0:  # first lift the columns that need least to reach the looser floor (a header word whole)
            looser = self.levels[level - 1]
            for index in sorted(range(len(least)), key=lambda i: looser[i] - least[i]):
                lift = looser[index] - least[index]
                if 0 < lift <= spare:
                    least[index] += lift
                    spare -= lift
        wanted = [width - floor for width, floor in zip(self.natural, least, strict=True)]
        given = [spare * want // sum(wanted) for want in wanted]
        for index in sorted(range(len(wanted)), key=lambda i: wanted[i] - given[i], reverse=True)[: spare - sum(given)]:
            given[index] += 1  # the rounding's few columns go to those still furthest from their natural width
        return [floor + extra for floor, extra in zip(least, given, strict=True)]

    def groups(self) -> list[list[int]]:
        """Column indexes per group: the first column, then as many more as fit beside it with every number, word
        and header word whole (at least one)."""
        floors = self.levels[0]
        separator = 1 if self.table.box else 0
        edges = self.table._extra_width - separator * (len(floors) - 1)

        def fits(group: list[int]) -> bool:
            return sum(floors[i] for i in group) + edges + separator * (len(group) - 1) <= self.options.max_width

        groups: list[list[int]] = []
        for index in range(1, len(floors)):
            if groups and fits([*groups[-1], index]):
                groups[-1].append(index)
            else:
                groups.append([0, index])
        return groups


def _columns_of(table: Table, indexes: Sequence[int]) -> Table:
    """The table with only these columns (the title above the first group, no caption)."""
    group = copy.copy(table)
    group.columns = [dataclasses.replace(table.columns[index], _index=place) for place, index in enumerate(indexes)]
    group.title = table.title if 1 in indexes else None
    group.caption = None
    return group


def _plain(console: Console, cell: RenderableType) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return console.render_str(cell).plain if isinstance(cell, str) else ""
