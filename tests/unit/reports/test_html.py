"""The HTML case study: built from stored files only, self-contained, every string escaped."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.gate.playbook import attach_run
from kvbench.cli import app
from reports.html import collect_sources, render_html
from reports.outputs import report_html
from tests.resultfiles import make_playbook, make_probe_run, make_soak_dir

XSS = "<script>alert(1)</script>"


class Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Collector:
    collector = Collector()
    collector.feed(html)
    return collector


def test_full_report_sections_charts_and_links(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    probe = make_probe_run(runs, speedup=4.0)
    soak = make_soak_dir(runs, error_burst=True)
    out = report_html([probe, soak], out=tmp_path / "site" / "case.html")
    html = out.read_text(encoding="utf-8")
    page = parse(html)
    for section in ("summary", "setup", "poc", "capacity", "stability", "predicted", "methodology", "raw-data"):
        assert f'<section id="{section}">' in html
    # POC, three soak charts, predicted vs measured: matplotlib's SVG, each titled and described
    charts = re.findall(r'<svg\b[^>]*\bclass="chart" id="([a-z0-9-]+)" role="img"', html)
    assert charts == ["chart-poc", "chart-soak-latency", "chart-soak-health", "chart-soak-rps", "chart-predicted"]
    for chart in charts:
        assert f'<title id="{chart}-title">' in html and f'<desc id="{chart}-desc">' in html
    assert len(set(re.findall(r'\bid="([^"]+)"', html))) == len(re.findall(r'\bid="([^"]+)"', html))  # ids unique
    assert "script" not in page.tags and "img" not in page.tags
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # links are relative paths to stored files that exist
    links = [u for u in page.urls if not u.startswith(("#", "data:"))]
    assert links and all("://" not in u for u in links)
    for link in links:
        assert (out.parent / link).resolve().is_file(), link
    text = " ".join(page.text)
    assert "FAIL" in text and "HTTP 503" in text  # the soak verdict and its reason
    assert "4.0" in text and "× faster" in text  # executive summary: speedup computed from records
    assert "***" in text and "--api-key" in text  # the engine command is shown redacted


def test_numbers_come_from_the_stored_files(tmp_path: Path) -> None:
    fast = report_html([make_probe_run(tmp_path / "a", speedup=8.0)], out=tmp_path / "a.html").read_text()
    slow = report_html([make_probe_run(tmp_path / "b", speedup=2.0)], out=tmp_path / "b.html").read_text()
    assert re.search(r"[78]\.\d\d× faster", fast) and re.search(r"[12]\.\d\d× faster", slow)


def test_scenario_name_is_escaped(tmp_path: Path) -> None:
    probe = make_probe_run(tmp_path / "runs", name=XSS)
    soak = make_soak_dir(tmp_path / "runs", name=XSS)
    html = render_html(collect_sources([probe, soak]), tmp_path)
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "script" not in parse(html).tags
    assert XSS in " ".join(parse(html).text)  # the reader sees the name as text


def test_playbook_report_and_cli(tmp_path: Path) -> None:
    playbook, runs = make_playbook(tmp_path, "Acme <b>chat</b>", baseline_run="base")
    attach_run(playbook, "poc", make_probe_run(runs, name="poc", speedup=6.0))
    attach_run(playbook, "staging", make_soak_dir(runs))
    result = CliRunner().invoke(app, ["report", "--html", "--playbook", str(playbook)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "case-study.html").read_text(encoding="utf-8")
    assert "Acme &lt;b&gt;chat&lt;/b&gt;" in html
    assert "Rollout playbook" in html and "PASS" in html
    status = CliRunner().invoke(app, ["playbook", "status", str(playbook)])
    assert "production" in status.output.lower()


def test_report_requires_inputs(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--html"])
    assert result.exit_code == 2
    (tmp_path / "x").mkdir()
    result = CliRunner().invoke(app, ["report", "--html", str(tmp_path / "x")])
    assert result.exit_code == 2


def test_simulated_cards_say_so_and_different_setups_warn(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    probe = make_probe_run(runs, speedup=4.0)  # the simulator
    soak = make_soak_dir(runs)  # an attached endpoint: a measurement
    html = render_html(collect_sources([probe, soak]), tmp_path)
    text = " ".join(parse(html).text)
    assert "SIMULATED" in text and "not a measurement" in text
    assert 'id="different-setups"' in html and "Different setups" in text
    alone = render_html(collect_sources([probe]), tmp_path)
    assert 'id="different-setups"' not in alone


def test_fp8_and_bf16_weights_are_different_setups(tmp_path: Path) -> None:
    """The committed 70B runs (4x H200): the same model, host and engine, FP8 vs BF16 weights."""
    results = Path(__file__).resolve().parents[3] / "docs" / "results"
    fp8 = results / "gpu-seed-llama70b-tp4-fp8-h200"
    bf16 = results / "gpu-seed-llama70b-tp4-fp16-h200"
    alone = render_html(collect_sources([fp8]), tmp_path)
    text = " ".join(parse(alone).text)
    assert "bfloat16, weights quantized to fp8" in text
    assert "measured: vLLM 0.26.0 + LMCache 0.5.3, 4× NVIDIA H200" in text
    assert 'id="different-setups"' not in alone
    both = render_html(collect_sources([fp8, bf16]), tmp_path)
    assert 'id="different-setups"' in both


def test_the_measured_h100_case_study_shows_every_setup(tmp_path: Path) -> None:
    """The committed 1x H100 POC, sweep and soak: each has its setup, and the soak lists only the arm it ran."""
    results = Path(__file__).resolve().parents[3] / "docs" / "results"
    runs = [
        results / name
        for name in ("gpu-llama8b-lmcache-h100", "gpu-sweep-llama8b-h100", "gpu-soak-llama8b-lmcache-h100")
    ]
    html = render_html(collect_sources(runs), tmp_path)
    text = " ".join(parse(html).text)
    assert "SIMULATED" not in text and 'id="different-setups"' not in html
    capacity = text[text.index("Capacity: offload profiles") : text.index("Stability window: offload profiles")]
    assert "vllm-native-cpu-60g" in capacity and "lmcache-cpu-100g" in capacity
    soak = text[text.index("Stability window: offload profiles") : text.index("POC: turn-1")]
    assert "AMG-ON-LMCache" in soak and "AMG-OFF" not in soak and "AMG-ON-native" not in soak
    assert "2 GPUs saved" in text and "PASS" in text
    assert "hit rate (/metrics counters)" in text  # recorded during the window, before usage came first


@pytest.mark.lab
def test_a_measured_lmcache_run_shows_where_its_turn_2_goes(tmp_path: Path) -> None:
    """The lab's 70B FP8 graphs run (4x H200): LMCache's timeline as a table and a stacked chart of turn 2."""
    from harness.results.run_result import RunResult

    run = Path(__file__).resolve().parents[3] / "lab" / "runs" / "gpu-seed-llama70b-tp4-fp8-graphs-h200"
    html = render_html(collect_sources([run]), tmp_path)
    text = " ".join(parse(html).text)
    assert "Where the TTFT goes" in text and "Ranks' spread" in text and 'id="chart-lmcache-turn2"' in html
    chart = html[html.index('id="chart-lmcache-turn2"') : html.index("</desc>", html.index('id="chart-lmcache-turn2"'))]
    result = RunResult.read_file(run / "summary.json")
    for cell in result.lmcache_timeline:
        if cell.turn == 2 and cell.lookup_to_loaded_ms is not None:
            # each stacked part is the stored median, one bar per context length, listed in the chart's description
            assert (
                f"lookup to KV loaded (slowest rank) @ {cell.context_tokens:,}: {cell.lookup_to_loaded_ms:.4g} ms"
                in chart
            )
    assert "report/lmcache_timeline.csv" in html  # the raw appendix links the table's file
    assert "Worker_TP3" in text and "report/lmcache_ranks.csv" in html  # each rank's loads
    # under the spread table: how far its third pass still moved the medians, and the file with every pass's
    assert "Passes: the last of 3 moved" in text and "report/pass_medians.csv" in html
    simulated = render_html(collect_sources([make_probe_run(tmp_path / "sim", speedup=4.0)]), tmp_path)
    assert "chart-lmcache-turn2" not in simulated  # the simulator logs no LMCache lines


def test_the_measured_agentic_sweep_has_its_agents_section(tmp_path: Path) -> None:
    """The committed 1x H200 agentic sweep: agents at SLO per tier and arm, with NVML energy labelled measured."""
    run = Path(__file__).resolve().parents[3] / "docs" / "results" / "gpu-agentic-llama8b-h200"
    html = render_html(collect_sources([run]), tmp_path)
    text = " ".join(parse(html).text)
    assert 'id="agents"' in html and "SIMULATED" not in text
    agents = text[text.index("Agents at SLO") :]
    for arm in ("AMG-OFF", "AMG-ON-LMCache", "AMG-ON-native"):
        assert arm in agents
    assert "J/token (measured (NVML))" in agents and "interactive" in agents and "none met" in agents
