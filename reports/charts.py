"""The HTML case study's charts: grouped or stacked bars and lines over time, drawn by matplotlib.

Each builder draws one figure in the shared style (:mod:`reports.figures`: palette, fonts, legend
beside the data, SLO limits as a dashed line over the allowed side shaded) and returns a
:class:`Chart`, whose ``svg`` the page embeds as it is (:func:`reports.figures.inline_svg`: every
label escaped, a title and a description for screen readers). Series take colours in their order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from markupsafe import Markup
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .figures import (
    BAD,
    BAND,
    PALETTE,
    format_number,
    inline_svg,
    legend_outside,
    log_scale,
    new_figure,
    slo_band,
    styled,
)

__all__ = [
    "PALETTE",
    "BarSeries",
    "Chart",
    "Highlight",
    "Limit",
    "LineSeries",
    "bar_chart",
    "figure_chart",
    "line_chart",
]
WIDTH_IN, HEIGHT_IN = 8.0, 3.4
"""Every chart of the page: wide and short, as the page's column is."""


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    description: str
    svg: Markup


@dataclass(frozen=True)
class BarSeries:
    name: str
    values: Sequence[float | None]
    color: str
    unit: str = ""


@dataclass(frozen=True)
class LineSeries:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Highlight:
    """A point to mark (e.g. an interval that broke a criterion)."""

    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Limit:
    """An SLO limit (or floor) drawn across the chart; ``allowed`` is the side that meets it."""

    value: float
    label: str
    allowed: Literal["below", "above"] = "below"


def figure_chart(fig: Figure, chart_id: str, title: str, description: str) -> Chart:
    """A drawn figure as a chart of the page."""
    return Chart(chart_id, title, description, inline_svg(fig, chart_id, title, description))


def _axes(title: str, x_label: str, y_label: str, *, log: bool) -> tuple[Figure, Axes]:
    fig = new_figure(WIDTH_IN, HEIGHT_IN)
    ax = fig.add_subplot()
    ax.set_title(title, loc="left")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label + (" (log scale)" if log else ""))
    if log:
        log_scale(ax)
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(format_number))
    return fig, ax


def _values_text(groups: Sequence[str], series: Sequence[BarSeries]) -> str:
    """Every bar as text (``name @ group: value unit``), for the chart's description."""
    values = [
        f"{item.name} @ {group}: {value:.4g}{item.unit}"
        for item in series
        for group, value in zip(groups, item.values, strict=False)
        if value is not None
    ]
    return "; ".join(values)


@styled()
def bar_chart(
    chart_id: str,
    title: str,
    description: str,
    groups: Sequence[str],
    series: Sequence[BarSeries],
    *,
    x_label: str,
    y_label: str,
    log: bool = False,
    stacked: bool = False,
) -> Chart:
    """One group of bars per label in ``groups``: side by side, or ``stacked`` bottom to top in the series' order
    (a missing value adds nothing); the description lists every value."""
    fig, ax = _axes(title, x_label, y_label, log=log and not stacked)
    width = 0.6 if stacked else 0.8 / max(len(series), 1)
    below = [0.0] * len(groups)
    for index, item in enumerate(series):
        values = [value if value is not None and math.isfinite(value) else 0.0 for value in item.values]
        values += [0.0] * (len(groups) - len(values))
        if stacked:
            ax.bar(range(len(groups)), values, width, bottom=below, color=item.color, label=item.name)
            below = [low + value for low, value in zip(below, values, strict=True)]
        else:
            xs = [g - 0.4 + width * (index + 0.5) for g in range(len(groups))]
            ax.bar(xs, values, width * 0.92, color=item.color, label=item.name)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.grid(False, axis="x")
    positive = [v for item in series for v in item.values if v is not None and v > 0]
    if log and not stacked and positive:  # bars start at the power of ten below the smallest, not mid-bar
        ax.set_ylim(bottom=10 ** math.floor(math.log10(min(positive))))
    legend_outside(ax)
    return figure_chart(fig, chart_id, title, f"{description} Values: {_values_text(groups, series)}.")


@styled()
def line_chart(
    chart_id: str,
    title: str,
    description: str,
    series: Sequence[LineSeries],
    *,
    x_label: str,
    y_label: str,
    log: bool = False,
    highlights: Sequence[Highlight] = (),
    bands: Sequence[tuple[float, float, str]] = (),
    limits: Sequence[Limit] = (),
    x_range: tuple[float, float] | None = None,
) -> Chart:
    """Lines over a shared x axis (a None splits a line), ``highlights`` as red markers, ``bands`` (start, end,
    label) shaded behind the data, ``limits`` as SLO lines with the allowed side shaded."""
    fig, ax = _axes(title, x_label, y_label, log=log)
    for start, end, label in bands:
        ax.axvspan(start, end, color=BAND, alpha=0.7, linewidth=0, label=label)
    for item in series:
        ys = [math.nan if y is None else y for y in item.ys]
        style = "--" if item.dashed else "-"
        ax.plot(item.xs, ys, style, color=item.color, linewidth=1.6, marker=".", markersize=3, label=item.name)
    if highlights:
        ax.plot(
            [h.x for h in highlights],
            [h.y for h in highlights],
            "o",
            color=BAD,
            markersize=6,
            label="broke a criterion",
        )
    if x_range is not None:
        ax.set_xlim(*x_range)
    values = [y for item in series for y in item.ys if y is not None]
    if not log and values and min(values) >= 0:
        ax.set_ylim(bottom=0)
    for limit, dash in zip(limits, ("--", ":", "-."), strict=False):
        slo_band(ax, limit.value, limit.label, limit.allowed, shade=len(limits) == 1, dash=dash)
    legend_outside(ax)
    if highlights:
        description += " Marked: " + "; ".join(h.title for h in highlights) + "."
    return figure_chart(fig, chart_id, title, description)
