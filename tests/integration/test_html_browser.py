"""The HTML case study in a real headless browser (Debian's chromium, driven by Playwright over CDP).

The page must render with its charts, log no console errors, make no network request, and show a
scenario named ``<script>alert(1)</script>`` as text without running it. A screenshot is kept.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reports.outputs import report_html
from tests.resultfiles import make_probe_run, make_soak_dir

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("KVBENCH_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
XSS = "<script>alert(1)</script>"


def _skip_reason() -> str | None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        return f"no chromium at {CHROMIUM} (scripts/test.sh installs Debian's chromium with apt-get)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    executable = CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser: Any, html: Path) -> tuple[Any, list[str], list[str], list[str]]:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    dialogs: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))

    def dismiss(dialog: Any) -> None:  # an alert() would block the page; record it and close it
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    page.goto(html.resolve().as_uri(), wait_until="load")
    return page, errors, requests, dialogs


def assert_shot_and_no_errors_or_requests(page: Any, shot: Path, errors: list[str], requests: list[str]) -> None:
    """A full-page screenshot saved at ``shot`` (a PNG over 20 kB: the page drew), no console or page error, and
    no request beyond the page's own file and inline data."""
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    assert errors == []
    assert all(url.startswith(("file:", "data:")) for url in requests), requests


def test_case_study_renders_with_charts(browser: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = report_html([make_probe_run(runs), make_soak_dir(runs, error_burst=True)], out=tmp_path / "case.html")
    page, errors, requests, _ = open_page(browser, out)
    try:
        assert page.title().endswith("kvbench case study")
        charts = page.locator("svg.chart")
        assert charts.count() == 5
        for index in range(charts.count()):
            box = charts.nth(index).bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100
        assert page.locator("#chart-poc [id^='chart-poc-patch_']").count() >= 8  # bars: 2 arms x 2 turns x 2 lengths
        assert page.locator("#chart-soak-latency [id^='chart-soak-latency-line2d_']").count() >= 3  # and lines
        assert "TTFT p99" in page.locator("#chart-soak-latency").text_content()  # the legend is text
        assert page.locator("#soak-verdict").inner_text() == "FAIL"
        assert page.locator("section#raw-data a").count() > 5
        assert_shot_and_no_errors_or_requests(page, tmp_path / "case-study.png", errors, requests)
    finally:
        page.close()


def test_script_in_scenario_name_renders_as_text(browser: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = report_html([make_probe_run(runs, name=XSS), make_soak_dir(runs, name=XSS)], out=tmp_path / "xss.html")
    page, errors, _, dialogs = open_page(browser, out)
    try:
        assert page.locator("#report-title").inner_text() == XSS
        assert page.evaluate("document.querySelectorAll('script').length") == 0
        assert page.title().startswith(XSS)
        page.screenshot(path=str(tmp_path / "xss.png"))
        assert dialogs == [] and errors == []
    finally:
        page.close()
