"""The regression gate's outputs: Markdown summary, JUnit XML, JSON result and the console view.

Registered in :mod:`reports.outputs` under result kind ``compare``; each reads the
:class:`~harness.gate.compare.CompareResult` alone. All say the same verdict as the exit code:
PASS (0), REGRESSION (1), CANNOT COMPARE (2), INCONCLUSIVE (3, with the requests per cell the
gate's threshold needs). In JUnit a regression is a failure, an inconclusive metric a skipped case,
and an inconclusive or incomparable verdict one error case, so a CI job never shows it green.
Values: TTFT in milliseconds, changes in % (TTFT) or percentage points (error and hit rates).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from common.markup import md_text
from harness.gate.compare import CompareResult, MetricComparison
from harness.scenario.spec import GateSpec

STATUS_MARK = {
    "pass": "✅ pass",
    "regression": "❌ REGRESSION",
    "improvement": "🟢 improvement",
    "inconclusive": "⚪ inconclusive",
}
TITLE = {
    "pass": "✅ PASS: no regression",
    "regression": "❌ REGRESSION",
    "inconclusive": "⚪ INCONCLUSIVE: the gate cannot tell",
    "incomparable": "⚠️ CANNOT COMPARE",
}


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.{digits}f}"


def _value(c: MetricComparison, value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f} ms" if c.unit == "ms" else f"{value * 100:.2f}%"


def _change(c: MetricComparison) -> str:
    if c.change is None or math.isinf(c.change):
        return "—"
    if c.change_unit == "%":
        ci = f" [{_fmt(c.ci_low, 1)}, {_fmt(c.ci_high, 1)}]" if c.ci_low is not None else ""
        return f"{c.change:+.1f}%{ci}"
    return f"{c.change * 100:+.2f} pts"


def _threshold(c: MetricComparison) -> str:
    if c.metric == "ttft":
        return f"+{c.threshold:g}%"
    return f"{'-' if c.metric == 'hit_rate' else '+'}{c.threshold * 100:g} pts"


def _detectable(c: MetricComparison) -> str:
    """The smallest change the test could detect here ("∞": none at all)."""
    if c.min_detectable_change is None:
        return "∞" if c.status == "inconclusive" else "—"
    if c.change_unit == "%":
        return f"+{c.min_detectable_change:.1f}%"
    sign = "-" if c.metric == "hit_rate" else "+"
    return f"{sign}{c.min_detectable_change * 100:.1f} pts"


def describe_rules(rules: GateSpec) -> str:
    return (
        f"one-sided tests at alpha {rules.alpha:g}; TTFT median +{rules.ttft_max_increase_pct:g}% "
        f"and +{rules.ttft_min_increase_ms:g} ms; error rate +{rules.error_rate_max_increase * 100:g} pts; "
        f"hit rate −{rules.hit_rate_max_decrease * 100:g} pts"
    )


def need_line(result: CompareResult) -> str:
    """What an inconclusive verdict needs, in one sentence."""
    needed = result.needed_ttft_n
    if needed is not None:
        return f"need n ≥ {needed} per cell (requests of one arm, context length and turn, on each side)"
    return "more requests per cell (see the inconclusive rows)"


def render_markdown(result: CompareResult) -> str:
    """The Markdown summary ``kvbench compare`` prints (and a CI job can post)."""
    lines = [
        f"## kvbench compare — {TITLE[result.verdict]}",
        "",
        f"* scenario: {md_text(result.scenario_name)}",
        f"* baseline: {md_text(result.baseline)}",
        f"* current: {md_text(result.current)}",
        f"* rules: {describe_rules(result.rules)}",
        "",
    ]
    if result.verdict == "incomparable":
        lines.append("The result sets are not comparable:")
        lines.append("")
        lines.extend(f"* {md_text(reason)}" for reason in result.reasons)
        return "\n".join(lines) + "\n"
    if result.verdict == "inconclusive":
        undetectable = len(result.inconclusive)
        lines += [f"The gate cannot tell: {undetectable} metrics cannot detect their threshold; {need_line(result)}."]
        lines.append("")
    counts = {status: sum(c.status == status for c in result.comparisons) for status in STATUS_MARK}
    lines.append(", ".join(f"{n} {status}" for status, n in counts.items()))
    lines.append("")
    header = (
        "| metric | arm | tokens | turn | baseline | current | change [95% CI] | p | threshold | detectable | status |"
    )
    lines.append(header)
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    order = {"regression": 0, "inconclusive": 1, "improvement": 2, "pass": 3}
    for c in sorted(result.comparisons, key=lambda c: order[c.status]):
        cells = [
            c.metric,
            md_text(c.arm),
            str(c.context_tokens or "—"),
            str(c.turn or "—"),
            f"{_value(c, c.baseline_value)} (n={c.baseline_n})",
            f"{_value(c, c.current_value)} (n={c.current_n})",
            _change(c),
            _fmt(c.p_value, 4) if c.p_value is not None else "—",
            _threshold(c),
            _detectable(c),
            STATUS_MARK[c.status],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for heading, rows in (("Regressions:", result.regressions), ("Cannot tell:", result.inconclusive)):
        if rows:
            lines += ["", heading, ""]
            lines += [f"* **{md_text(c.name)}**: {md_text(c.detail)}" for c in rows]
    return "\n".join(lines) + "\n"


def render_junit(result: CompareResult) -> str:
    """JUnit XML: one case per comparison (regression: failure, inconclusive: skipped) and a verdict error."""
    suite = ET.Element("testsuite", name=f"kvbench.compare.{result.scenario_name}")
    props = ET.SubElement(suite, "properties")
    for key, value in (("baseline", result.baseline), ("current", result.current), ("verdict", result.verdict)):
        ET.SubElement(props, "property", name=key, value=value)
    tests = failures = errors = skipped = 0
    if result.verdict == "incomparable":
        case = ET.SubElement(suite, "testcase", classname="kvbench.compare", name="comparable")
        error = ET.SubElement(case, "error", message="result sets are not comparable", type="incomparable")
        error.text = "\n".join(result.reasons)
        tests, errors = 1, 1
    if result.verdict == "inconclusive":
        # skipped cases alone leave a CI job green: the verdict itself is an error, as exit 3 is
        case = ET.SubElement(suite, "testcase", classname="kvbench.compare", name="conclusive")
        message = f"INCONCLUSIVE: the gate cannot tell; {need_line(result)}"
        error = ET.SubElement(case, "error", message=message, type="inconclusive")
        error.text = "\n".join(f"{c.name}: {c.detail}" for c in result.inconclusive)
        tests, errors = 1, 1
    for c in result.comparisons:
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=f"kvbench.compare.{c.metric}", name=c.name)
        if c.status == "regression":
            failures += 1
            failure = ET.SubElement(case, "failure", message=c.detail, type="regression")
            failure.text = c.detail
        elif c.status == "inconclusive":
            skipped += 1
            ET.SubElement(case, "skipped", message=c.detail)
        else:
            ET.SubElement(case, "system-out").text = c.detail
    for name, count in (("tests", tests), ("failures", failures), ("errors", errors), ("skipped", skipped)):
        suite.set(name, str(count))
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def render_json(result: CompareResult) -> str:
    """The versioned result itself (``schema_version``), as ``--json`` writes it."""
    return result.model_dump_json(indent=2) + "\n"
