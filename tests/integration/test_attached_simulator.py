"""An endpoint kvbench attaches to, declared with its offload tier, and known for what it is.

Against ``kvbench sim serve --offload cpu`` (an endpoint with a CPU tier, reached by URL):

* ``kvbench run --base-url URL`` declares no tier (profile hbm), so turn 2's tier hits contradict it: the
  run is INCONCLUSIVE (exit 3) and the verdict line names the flag that declares the tier, ``--offload cpu``;
  with ``--offload cpu`` the same run is valid (exit 0) and its scenario says the arm offloads to cpu;
* the endpoint says it is kvbench's simulator (``owned_by: kvbench-sim``), so a flags-only run and a
  flags-only sweep are SIMULATED, never measured: in their result files (``provenance``), the console, the
  Markdown reports, the HTML case study, and the playbook, whose production stage does not close on such a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.gate.playbook import attach_run, playbook_status, save_playbook, starter_playbook
from tests.support import SimulatorLauncher, attached_sweep_args, kvbench

pytestmark = pytest.mark.integration

SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1")
ATTACHED_SIM = "simulated: kvbench simulator attached at"
PROBE = ("--conversations", "1", "--answer-tokens", "4")


def probe(base_url: str, out: Path, *extra: str, contexts: str = "1000") -> tuple[int, str, Path | None]:
    """A flags-only ``kvbench run`` of ``base_url``: (exit code, stdout + stderr, its run directory)."""
    before = set(out.iterdir()) if out.exists() else set()
    done = kvbench(
        "run", "--base-url", f"{base_url}/v1", "--contexts", contexts, *PROBE, *extra, "-o", str(out), cwd=out.parent
    )
    made = sorted(set(out.iterdir()) - before) if out.exists() else []
    return done.returncode, done.stdout + done.stderr, made[0] if made else None


def test_an_undeclared_tier_names_the_flag_and_offload_declares_it(
    simulator: SimulatorLauncher, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    with simulator(*SERVE, "--offload", "cpu") as base_url:
        undeclared_code, undeclared, _ = probe(base_url, runs)
        declared_code, declared, run_dir = probe(base_url, runs, "--offload", "cpu")
    assert undeclared_code == 3, undeclared[-3000:]
    verdict = " ".join(undeclared[undeclared.index("INCONCLUSIVE: ") :].split())  # the console may wrap it
    assert "offload tier" in verdict and "declare the endpoint's tier: --offload cpu" in verdict
    assert "Traceback" not in undeclared

    assert declared_code == 0, declared[-3000:]
    assert run_dir is not None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["validity"]["verdict"] == "valid"
    stored = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    assert [(arm["name"], arm["offload"]) for arm in stored["arms"]] == [("endpoint", "cpu")]


def test_an_attached_simulator_is_simulated_everywhere(simulator: SimulatorLauncher, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with simulator(*SERVE, "--offload", "off") as off, simulator(*SERVE, "--offload", "cpu") as on:
        base_code, base_out, baseline = probe(off, runs, "--offload", "off", contexts="8000")
        prod_code, prod_out, production = probe(on, runs, "--offload", "cpu", contexts="8000")
        sweep = kvbench(
            *attached_sweep_args(on, "1", "-o", str(tmp_path / "sweeps"), offload="cpu", duration_s=2), cwd=tmp_path
        )
    assert base_code == 0, base_out[-3000:]
    assert prod_code == 0, prod_out[-3000:]
    assert sweep.returncode == 0, (sweep.stdout + sweep.stderr)[-3000:]
    assert baseline is not None and production is not None
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()

    # the result files (what --json prints)
    summary = json.loads((production / "summary.json").read_text())
    swept = json.loads((sweep_dir / "sweep.json").read_text())
    for result in (summary, swept):
        assert result["provenance"]["origin"] == "simulated" and ATTACHED_SIM in result["provenance"]["label"]
    assert json.loads((baseline / "summary.json").read_text())["provenance"]["origin"] == "simulated"

    # console and Markdown: the provenance line says simulator, never "measured"
    for output in (prod_out, sweep.stdout + sweep.stderr):
        assert ATTACHED_SIM in " ".join(output.split()) and "measured: OpenAI-compatible" not in output
    for report in (production / "report" / "ttft_table.md", sweep_dir / "report" / "capacity.md"):
        assert ATTACHED_SIM in report.read_text(), report
    details = json.loads((production / "manifest.json").read_text())["engines"]["endpoint"]["details"]
    assert details["served_by"] == "kvbench-sim"

    # the HTML case study of the sweep counts nothing as measured
    html = tmp_path / "case.html"
    done = kvbench("report", "--html", str(sweep_dir), "--out", str(html), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = html.read_text()
    assert ATTACHED_SIM in page and "Nothing on this page was measured on a real engine" in page

    # the playbook: a production run against the simulator is no evidence for production
    playbook = tmp_path / "playbook.yaml"
    save_playbook(starter_playbook("Acme"), playbook)
    attach_run(playbook, "baseline", baseline)
    attach_run(playbook, "production", production)
    stage = playbook_status(playbook).stage("production")
    assert stage.provenance == "simulated" and ATTACHED_SIM in stage.provenance_label
    assert stage.state == "pending" and stage.evidence.startswith("SIMULATED"), stage.evidence
