"""The one chart implementation: matplotlib figures in the shared style, embedded in the page as escaped inline SVG."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

from matplotlib.figure import Figure

from reports.charts import PALETTE, BarSeries, Limit, LineSeries, bar_chart, line_chart
from reports.figures import compact, format_number
from tests.unit.reports.test_html import parse

XSS = "<script>alert(1)</script> & $x$"


def test_every_label_reaching_the_svg_is_escaped_and_a_dollar_is_a_dollar() -> None:
    series = [BarSeries(XSS, [1.0, 2.0], PALETTE[0], " ms")]
    chart = bar_chart("chart-x", f"title {XSS}", f"about {XSS}", ["1,000", XSS], series, x_label=XSS, y_label="ms")
    page = parse(str(chart.svg))
    assert "script" not in page.tags and "<script>" not in str(chart.svg)
    text = " ".join(page.text)
    assert XSS in text  # the legend, the tick label, the axis label, title and description: as text, math off
    assert f"{XSS} @ 1,000: 1 ms; {XSS} @ {XSS}: 2 ms" in text  # the description lists every bar
    assert str(chart.svg).startswith("<svg") and 'role="img"' in str(chart.svg) and "<?xml" not in str(chart.svg)


def test_two_charts_share_no_element_id() -> None:
    series = [LineSeries("p99", [0.0, 1.0, 2.0], [1.0, None, 3.0], PALETTE[1])]
    first = line_chart("chart-a", "a", "a", series, x_label="s", y_label="ms", limits=[Limit(2.0, "SLO 2 ms")])
    second = line_chart("chart-b", "b", "b", series, x_label="s", y_label="ms")
    ids = [re.findall(r'\bid="([^"]+)"', str(chart.svg)) for chart in (first, second)]
    assert ids[0] and ids[1] and not set(ids[0]) & set(ids[1])
    assert "SLO 2 ms" in " ".join(parse(str(first.svg)).text)


def test_tick_labels_are_compact_plain_numbers() -> None:
    assert [format_number(v) for v in (0.0, 0.05, 12.5, 150.0, 20_000.0, 3e6)] == [
        "0",
        "0.05",
        "12.5",
        "150",
        "20k",
        "3M",
    ]


def test_a_compact_svg_draws_the_same_elements_and_text_within_a_hundredth_of_a_point() -> None:
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0.0, 1 / 3, 2 / 3], [1 / 7, 2 / 7, 0.9583333], marker="o", label="0.9583333 ms")
    ax.legend()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    raw = buffer.getvalue()

    compacted = compact(raw)

    assert len(compacted) < len(raw)
    before, after = list(ET.fromstring(raw).iter()), list(ET.fromstring(compacted).iter())
    assert [(e.tag, sorted(e.attrib), (e.text or "").strip()) for e in before] == [
        (e.tag, sorted(e.attrib), (e.text or "").strip()) for e in after
    ]
    assert "0.9583333 ms" in compacted  # text content keeps every digit
    number = re.compile(r"-?\d+(?:\.\d+)?")
    moved = [
        abs(float(old) - float(new))
        for old_element, new_element in zip(before, after, strict=True)
        for name, value in old_element.attrib.items()
        for old, new in zip(number.findall(value), number.findall(new_element.attrib[name]), strict=True)
    ]
    assert moved and max(moved) <= 0.005 + 1e-9  # half a hundredth, give or take the float that printed it
