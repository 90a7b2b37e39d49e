"""One chart style and one chart implementation (matplotlib) for every figure kvbench draws.

The sweep's capacity and TTFT curves (:mod:`reports.curves`), the replay's timeline
(:mod:`reports.replay`) and every chart of the HTML case study (:mod:`reports.charts`,
:mod:`reports.html`) are matplotlib figures made by :func:`new_figure` under :data:`STYLE`: one
palette (Okabe-Ito, told apart with the common colour-vision deficiencies), one sans-serif font
and set of sizes, the legend outside the data (:func:`legend_outside`, right of the axes), the
SLO drawn one way (:func:`slo_band`: a dashed limit line, the allowed side lightly shaded) and the
provenance line (measured on what, or simulated) under the axes (:func:`caption`).

Files (``report/*.svg``) come from :func:`save`: SVG only, the format every Markdown report links and the HTML
page embeds (a PNG beside it drew the same figure again, a second copy in every kept run). The HTML page embeds
each figure as inline SVG (:func:`inline_svg`) rather than a PNG data URI:

* crisp at any zoom and in print (vectors), where a PNG blurs or must be rendered at 2-3x;
* smaller for these charts (a few hundred paths and labels: tens of kB, against ~100 kB of
  base64 per chart for a PNG sharp on a high-density screen);
* accessible: text stays text (``svg.fonttype = none``: selectable, searchable, read by screen
  readers), and each chart carries ``role="img"`` with a ``<title>`` and a ``<desc>`` that says what
  it shows (bar charts list their values).

Every label is escaped: matplotlib writes text as XML character data (``<``, ``>``, ``&`` escaped),
math parsing is off (``text.parse_math``: a ``$`` in an arm name is a dollar sign; log axes are
labelled with plain numbers by :func:`log_scale`), and the title
and description are escaped here. Element ids are salted with (or prefixed by) the chart's id, so
several charts on one page never share an id or a clip path.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from markupsafe import Markup, escape
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import FuncFormatter
from matplotlib.typing import RcKeyType

PALETTE = ("#0072B2", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#882255", "#44AA99")
"""Series colours in order (Okabe-Ito, with its green kept for the SLO)."""
SLO_COLOR = "#009E73"
BAD = "#C00000"
"""Markers of intervals that broke a criterion."""
MUTED = "#6B7280"
BAND = "#E5E7EB"
"""A span set apart (a soak's warm-up)."""
STYLE: dict[RcKeyType, object] = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "legend.frameon": False,
    "axes.grid": True,
    "axes.grid.which": "both",
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "text.parse_math": False,
    "svg.fonttype": "none",
}
LEGEND_WRAP = 34
"""Legend labels wrap at this many characters, so the legend beside the axes stays narrow."""


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


@contextmanager
def styled() -> Iterator[None]:
    """The shared style while a figure is drawn (axes and texts read it when made: use ``@styled()`` on a function
    that draws one) and saved (the SVG settings are read then)."""
    with rc_context(STYLE):
        yield


def new_figure(width_in: float, height_in: float, *, dpi: int = 120) -> Figure:
    """A figure whose layout keeps the legend and caption clear of the axes (draw it under :func:`styled`)."""
    return Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")


def format_number(value: float, _position: float | None = None) -> str:
    """Compact tick label: 1 200 -> '1.2k', 0.05 -> '0.05'."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}k"
    if magnitude >= 100 or value == 0:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _minor_log_label(value: float, _position: float | None = None) -> str:
    """Minor ticks of a log axis labelled at 2 and 5 times a power of ten, so a range under a decade has labels."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return format_number(value) if mantissa in (2.0, 5.0) else ""


def log_scale(ax: Axes, axis: Literal["x", "y"] = "y") -> None:
    """A log axis labelled with plain numbers (math text is off in the shared style)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target.set_major_formatter(FuncFormatter(format_number))
    target.set_minor_formatter(FuncFormatter(_minor_log_label))


def legend_outside(ax: Axes, title: str | None = None) -> None:
    """The axes' legend to the right of the data, labels wrapped; nothing when no artist is labelled."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    wrapped = [textwrap.fill(label, LEGEND_WRAP) for label in labels]
    legend = ax.legend(handles, wrapped, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if title:
        legend.set_title(textwrap.fill(title, LEGEND_WRAP))


def slo_band(
    ax: Axes,
    limit: float,
    label: str,
    allowed: Literal["below", "above", "right"],
    *,
    shade: bool = True,
    dash: str = "--",
) -> None:
    """An SLO limit: a ``dash``-styled line at ``limit`` and, with ``shade``, the allowed side lightly shaded (drawn
    after the data, so the shading spans the data's range; several limits on one chart shade none, as their
    regions would overlap)."""
    if allowed == "right":
        low, high = ax.get_xlim()
        if shade:
            ax.axvspan(limit, max(high, limit), color=SLO_COLOR, alpha=0.08, linewidth=0)
        ax.axvline(limit, color=SLO_COLOR, linewidth=0.9, linestyle=dash, label=label)
        ax.set_xlim(low, max(high, limit))
        return
    low, high = ax.get_ylim()
    top, bottom = max(high, limit), min(low, limit)
    if shade:
        ax.axhspan(*((bottom, limit) if allowed == "below" else (limit, top)), color=SLO_COLOR, alpha=0.08, linewidth=0)
    ax.axhline(limit, color=SLO_COLOR, linewidth=0.9, linestyle=dash, label=label)
    ax.set_ylim(bottom, top)


def caption(fig: Figure, provenance: str) -> None:
    """The provenance line (measured on what, or simulated) under the axes."""
    if provenance:
        fig.text(0.01, 0.01, provenance, fontsize=7, color=MUTED, ha="left", va="bottom", wrap=True)
        engine = fig.get_layout_engine()
        if isinstance(engine, ConstrainedLayoutEngine):
            engine.set(rect=(0.0, 0.05, 1.0, 0.95))


_DECIMALS = re.compile(r"-?\d+\.\d{3,}")
_ATTRIBUTE = re.compile(r'="([^"]*)"')
_INDENT = re.compile(r"\n[ \t]+")


def _hundredths(number: re.Match[str]) -> str:
    text = f"{float(number.group()):.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def compact(svg: str) -> str:
    """matplotlib's SVG drawing the same in about a fifth fewer bytes: its coordinates (points, written to six
    decimals) to hundredths of a point in attribute values, and no indentation. Text content is left alone."""
    rounded = _ATTRIBUTE.sub(lambda value: '="' + _DECIMALS.sub(_hundredths, value.group(1)) + '"', svg)
    return _INDENT.sub("\n", rounded)


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.svg, :func:`compact`; identical input gives identical SVG (fixed ids, no date)."""
    svg = stem.with_suffix(".svg")
    buffer = io.StringIO()
    with styled(), rc_context({"svg.hashsalt": "kvbench"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg.write_text(compact(buffer.getvalue()), encoding="utf-8")
    return [svg]


_OPEN = re.compile(r"<svg\b[^>]*>")
_SIZE = re.compile(r'\s(?:width|height)="[^"]*"')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_GROUP_ID = re.compile(r'<g id="([^"]+)"')
"""matplotlib's ids of groups (figure_1, axes_1, patch_3): the same in every chart, so prefixed with the chart's."""


def inline_svg(fig: Figure, chart_id: str, title: str, description: str) -> Markup:
    """The figure as an ``<svg>`` element for an HTML page: sized by CSS, labelled by its title and description."""
    buffer = io.StringIO()
    with styled(), rc_context({"svg.hashsalt": chart_id}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = compact(buffer.getvalue())
    opening = _OPEN.search(text)
    if opening is None:
        raise ValueError("matplotlib wrote no <svg> element")
    ident = escape(chart_id)
    tag = _SIZE.sub("", opening.group(0)).removesuffix(">")
    head = (
        f'{tag} class="chart" id="{ident}" role="img" aria-labelledby="{ident}-title {ident}-desc">'
        f'<title id="{ident}-title">{escape(title)}</title><desc id="{ident}-desc">{escape(description)}</desc>'
    )
    # the XML prolog and the metadata go; matplotlib escaped its own text, the title and description are escaped above
    body = _GROUP_ID.sub(lambda match: f'<g id="{ident}-{match.group(1)}"', text[opening.end() :])
    return Markup(head + _METADATA.sub("", body, count=1))
