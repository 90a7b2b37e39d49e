"""Chart geometry for the HTML report: numbers in, pixel coordinates and tick labels out.

Nothing here writes markup. The Jinja2 templates draw these shapes as inline SVG with autoescaping
on, so every label (arm names, scenario strings) reaches the page escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
BAD = "#dc2626"


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    color: str
    title: str


@dataclass(frozen=True)
class Polyline:
    points: str
    color: str
    name: str
    dashed: bool = False


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    color: str
    title: str
    r: float = 3.5


@dataclass(frozen=True)
class HLine:
    y: float
    label: str
    color: str


@dataclass(frozen=True)
class LegendItem:
    name: str
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Chart:
    """One SVG chart; every coordinate is in pixels of a ``width`` × ``height`` view box."""

    id: str
    title: str
    description: str
    x_label: str
    y_label: str
    width: int = 760
    height: int = 300
    left: int = 72
    right: int = 20
    top: int = 30
    bottom: int = 56
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    rects: list[Rect] = field(default_factory=list)
    bands: list[Rect] = field(default_factory=list)
    lines: list[Polyline] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    hlines: list[HLine] = field(default_factory=list)
    legend: list[LegendItem] = field(default_factory=list)
    x_tick_rotate: bool = False

    @property
    def plot_right(self) -> float:
        return float(self.width - self.right)

    @property
    def plot_bottom(self) -> float:
        return float(self.height - self.bottom)

    @property
    def plot_width(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def plot_height(self) -> float:
        return float(self.height - self.top - self.bottom)


def format_number(value: float) -> str:
    """Compact tick label: 1 200 -> '1.2k', 0.05 -> '0.05'."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}k"
    if magnitude >= 100 or value == 0:
        return f"{value:.0f}"
    return f"{value:.3g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1-2-5 steps)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten (with 2 and 5 between them when the range is short) covering [low, high]."""
    low = max(low, 1e-9)
    high = max(high, low * 1.0001)
    first = math.floor(math.log10(low))
    last = math.ceil(math.log10(high))
    mantissas = (1.0, 2.0, 5.0) if last - first <= 3 else (1.0,)
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in mantissas]
    inside = [t for t in ticks if low / 1.0001 <= t <= high * 1.0001]
    below = [t for t in ticks if t < low]
    above = [t for t in ticks if t > high]
    return ([below[-1]] if below else []) + inside + ([above[0]] if above else [])


class YScale:
    """Maps values to pixel rows, linear or log10."""

    def __init__(self, values: Sequence[float], top: float, bottom: float, *, log: bool, zero: bool = True) -> None:
        finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
        self.log = log and bool(finite)
        if self.log:
            ticks = log_ticks(min(finite), max(finite))
        else:
            low = min(finite, default=0.0)
            high = max(finite, default=1.0)
            if zero:
                low = min(low, 0.0)
            ticks = nice_ticks(low, high)
        self.ticks = ticks
        self.low, self.high = ticks[0], ticks[-1]
        self.top, self.bottom = top, bottom

    def _t(self, value: float) -> float:
        if self.log:
            return math.log10(max(value, 1e-12))
        return value

    def __call__(self, value: float) -> float:
        low, high = self._t(self.low), self._t(self.high)
        span = (high - low) or 1.0
        frac = (self._t(value) - low) / span
        return self.bottom - frac * (self.bottom - self.top)

    def tick_marks(self) -> list[Tick]:
        return [Tick(round(self(t), 2), format_number(t)) for t in self.ticks]


@dataclass(frozen=True)
class BarSeries:
    name: str
    values: Sequence[float | None]
    color: str
    unit: str = ""


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
) -> Chart:
    """Grouped bars: one group per label in ``groups``, one bar per series in each group."""
    base = Chart(chart_id, title, description, x_label, y_label)
    values = [v for s in series for v in s.values if v is not None]
    scale = YScale(values, base.top, base.plot_bottom, log=log)
    rects = []
    group_w = base.plot_width / max(len(groups), 1)
    bar_w = group_w * 0.8 / max(len(series), 1)
    x_ticks = []
    floor_value = scale.low
    for g, group in enumerate(groups):
        x0 = base.left + g * group_w + group_w * 0.1
        x_ticks.append(Tick(round(base.left + (g + 0.5) * group_w, 2), group))
        for s_index, item in enumerate(series):
            value = item.values[g] if g < len(item.values) else None
            if value is None:
                continue
            y = scale(value)
            bottom = scale(floor_value)
            label = f"{item.name} @ {group}: {value:.4g}{item.unit}"
            x = round(x0 + s_index * bar_w, 2)
            rects.append(
                Rect(x, round(min(y, bottom), 2), round(bar_w * 0.92, 2), round(abs(bottom - y), 2), item.color, label)
            )
    return Chart(
        chart_id, title, description, x_label, y_label + (" (log scale)" if scale.log else ""),
        x_ticks=x_ticks, y_ticks=scale.tick_marks(), rects=rects,
        legend=[LegendItem(s.name, s.color) for s in series],
    )  # fmt: skip


def stacked_bar_chart(
    chart_id: str,
    title: str,
    description: str,
    groups: Sequence[str],
    series: Sequence[BarSeries],
    *,
    x_label: str,
    y_label: str,
) -> Chart:
    """Stacked bars on a linear scale: one bar per label in ``groups``, the series' values stacked bottom to top in
    their order (a missing value adds nothing)."""
    base = Chart(chart_id, title, description, x_label, y_label)
    totals = [sum(s.values[g] or 0.0 for s in series if g < len(s.values)) for g in range(len(groups))]
    scale = YScale(totals, base.top, base.plot_bottom, log=False)
    group_w = base.plot_width / max(len(groups), 1)
    rects = []
    x_ticks = []
    for g, group in enumerate(groups):
        x = round(base.left + g * group_w + group_w * 0.2, 2)
        x_ticks.append(Tick(round(base.left + (g + 0.5) * group_w, 2), group))
        below = 0.0
        for item in series:
            value = item.values[g] if g < len(item.values) else None
            if value is None or value <= 0:
                continue
            y_low, y_high = scale(below), scale(below + value)
            label = f"{item.name} @ {group}: {value:.4g}{item.unit}"
            height = round(y_low - y_high, 2)
            rects.append(Rect(x, round(y_high, 2), round(group_w * 0.6, 2), height, item.color, label))
            below += value
    return Chart(
        chart_id, title, description, x_label, y_label,
        x_ticks=x_ticks, y_ticks=scale.tick_marks(), rects=rects,
        legend=[LegendItem(s.name, s.color) for s in series],
    )  # fmt: skip


@dataclass(frozen=True)
class LineSeries:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str
    dashed: bool = False
    unit: str = ""


@dataclass(frozen=True)
class Highlight:
    """A point to mark (e.g. an interval that broke a criterion)."""

    x: float
    y: float
    title: str


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
    hlines: Sequence[tuple[float, str]] = (),
    x_range: tuple[float, float] | None = None,
    log_x: bool = False,
) -> Chart:
    """Lines over a shared x axis; gaps (None) split a line; highlights are red markers."""
    base = Chart(chart_id, title, description, x_label, y_label)
    ys = [y for s in series for y in s.ys if y is not None] + [h.y for h in highlights] + [v for v, _ in hlines]
    scale = YScale(ys, base.top, base.plot_bottom, log=log, zero=not log)
    xs = [x for s in series for x in s.xs]
    if x_range is not None:
        x_low, x_high = x_range
    else:
        x_low, x_high = min(xs, default=0.0), max(xs, default=1.0)
    use_log_x = log_x and x_low > 0
    x_tick_values = log_ticks(x_low, x_high) if use_log_x else nice_ticks(x_low, x_high)
    x_low, x_high = min(x_tick_values[0], x_low), max(x_tick_values[-1], x_high)

    def tx(value: float) -> float:
        if use_log_x:
            lo, hi, v = math.log10(x_low), math.log10(x_high), math.log10(max(value, 1e-12))
        else:
            lo, hi, v = x_low, x_high, value
        return base.left + (v - lo) / ((hi - lo) or 1.0) * base.plot_width

    lines = []
    markers = []
    for item in series:
        run: list[str] = []
        for x, y in zip(item.xs, item.ys, strict=True):
            if y is None:
                if len(run) > 1:
                    lines.append(Polyline(" ".join(run), item.color, item.name, item.dashed))
                run = []
                continue
            px, py = round(tx(x), 2), round(scale(y), 2)
            run.append(f"{px},{py}")
            markers.append(Marker(px, py, item.color, f"{item.name}: {y:.4g}{item.unit} at {x:.4g}", r=2.2))
        if len(run) > 1:
            lines.append(Polyline(" ".join(run), item.color, item.name, item.dashed))
    for point in highlights:
        markers.append(Marker(round(tx(point.x), 2), round(scale(point.y), 2), BAD, point.title, r=5.0))
    band_rects = [
        Rect(round(tx(x0), 2), float(base.top), round(max(tx(x1) - tx(x0), 1.0), 2), base.plot_height, color, label)
        for x0, x1, color in bands
        for label in ("",)
    ]
    return Chart(
        chart_id, title, description, x_label, y_label + (" (log scale)" if scale.log else ""),
        x_ticks=[Tick(round(tx(v), 2), format_number(v)) for v in x_tick_values],
        y_ticks=scale.tick_marks(), lines=lines, markers=markers, bands=band_rects,
        hlines=[HLine(round(scale(v), 2), label, "#6b7280") for v, label in hlines],
        legend=[LegendItem(s.name, s.color, s.dashed) for s in series],
    )  # fmt: skip
