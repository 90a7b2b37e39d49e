"""The committed case study's inputs rendered and opened in headless chromium at 1280 px (the browser tier).

Built from docs/results (the 1× H100 POC, sweep and soak, and the 1× H200 agentic sweep): no table scrolls
sideways, the decision card is the page's first section, and a full-page screenshot is taken. Skips with
one line where chromium or Playwright is missing (tests/integration/test_html_browser.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from reports.outputs import report_html
from tests.integration.test_html_browser import (  # noqa: F401  (browser is a fixture)
    assert_shot_and_no_errors_or_requests,
    browser,
    open_page,
)

pytestmark = pytest.mark.integration

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
INPUTS = (
    "gpu-llama8b-lmcache-h100",
    "gpu-sweep-llama8b-h100",
    "gpu-soak-llama8b-lmcache-h100",
    "gpu-agentic-llama8b-h200",
)
WIDTH = 1280

# every table, and every box that wraps one, whose content is wider than the box (a sideways scroll bar)
OVERFLOWING = """() => Array.from(document.querySelectorAll('table, .table-wrap, section, main'))
  .filter(e => e.scrollWidth > e.clientWidth + 1)
  .map(e => `${e.tagName}.${e.className}#${e.closest('section') ? e.closest('section').id : ''}: `
            + `${e.scrollWidth} > ${e.clientWidth}`)"""

# per chart: its id, the left edge of its legend, the right edge of its axes, and whether every text is in the shared
# style's font (reports/figures.py: one style, the legend beside the data)
CHARTS = """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => {
  const legend = svg.querySelector('g[id$="-legend_1"]');
  const axes = svg.querySelector('g[id$="-axes_1"] > g[id*="-patch_"]');
  const texts = Array.from(svg.querySelectorAll('text'));
  return [svg.id, legend ? legend.getBoundingClientRect().left : null, axes.getBoundingClientRect().right,
          texts.length > 0 && texts.every(t => (t.getAttribute('style') || '').includes('DejaVu Sans'))];
})"""


def test_committed_case_study_fits_1280px_and_opens_with_the_decision(
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = report_html([RESULTS / name for name in INPUTS], out=tmp_path / "case.html")
    page, errors, requests, _ = open_page(browser, out)
    try:
        page.set_viewport_size({"width": WIDTH, "height": 900})
        assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH  # the page itself
        assert page.locator("table").count() > 10
        assert page.evaluate(OVERFLOWING) == []
        first = page.locator("main > section").first
        assert first.get_attribute("id") == "decision"
        call = page.locator("#decision-call").inner_text()
        assert call in ("ROLL OUT", "DO NOT ROLL OUT YET", "NOT ENOUGH EVIDENCE")
        headline = page.locator("#decision-headline").inner_text()
        assert "× faster at" in headline  # the speed-up range over the lengths that matter
        assert page.locator("section#agents").count() == 1
        charts = page.evaluate(CHARTS)
        assert len(charts) >= 8
        for chart_id, legend_left, axes_right, shared_font in charts:
            assert legend_left is not None and legend_left >= axes_right, chart_id  # the legend is off the data
            assert shared_font, chart_id
        body = page.inner_text("body")
        assert "1 GPU saved" in body and re.search(r"(?<![\d.,])1 GPUs", body) is None  # AMG-ON-native saves 1
        assert_shot_and_no_errors_or_requests(page, tmp_path / "case-study-1280.png", errors, requests)
    finally:
        page.close()
