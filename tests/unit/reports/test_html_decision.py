"""The case study's decision card: each branch of reports.decision.decide, and the card first on the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.decision import DecisionInputs, Evidence, Saving, decide, fmt_times, fmt_tokens, gpus, speedup_ranges
from reports.html import collect_sources, decision_inputs, render_html
from tests.resultfiles import make_probe_run

H100 = "measured: vLLM 0.26.0 + LMCache 0.5.3, 1× NVIDIA H100 80GB HBM3"
SPEEDUPS = ((1000, 0.7), (8000, 2.1), (32000, 3.14), (128000, 11.2))


def inputs(**changes: object) -> DecisionInputs:
    base: dict[str, object] = {
        "arm": "AMG-ON",
        "baseline": "AMG-OFF",
        "turn": 2,
        "speedups": SPEEDUPS,
        "poc": Evidence("POC", "valid", "measured", H100),
        "soak": Evidence("stability window", "PASS", "measured", H100),
        "savings": (Saving("AMG-ON", "AMG-OFF", 2, 10.0, "measured"),),
    }
    base.update(changes)
    return DecisionInputs(**base)  # type: ignore[arg-type]


def test_formats() -> None:
    assert [fmt_times(v) for v in (14.9, 3.14, 0.75, 1.0)] == ["15", "3.1", "0.75", "1"]
    assert [fmt_tokens(t) for t in (128000, 1500, 500)] == ["128k", "1.5k", "500"]
    assert [gpus(n) for n in (1, 2, 0, -1)] == ["1 GPU", "2 GPUs", "0 GPUs", "-1 GPU"]


def test_lengths_that_matter_are_the_material_tail() -> None:
    matter, rest = speedup_ranges([(32000, 3.14), (1000, 0.7), (128000, 11.2), (8000, 2.1)])
    assert matter is not None and rest is not None
    assert matter.text("faster") == "2.1–11× faster at 8k–128k" and rest.text() == "0.7× at 1k"
    # a dip above the threshold's start ends the tail there: the range never hides a slow length
    matter, rest = speedup_ranges([(8000, 2.0), (16000, 1.2), (32000, 4.0)])
    assert matter is not None and matter.text() == "4× at 32k" and rest is not None and rest.high == 2.0
    assert speedup_ranges([(8000, 1.1)]) == (None, speedup_ranges([(8000, 1.1)])[1])
    assert speedup_ranges([]) == (None, None)


def test_roll_out_when_a_measured_valid_poc_and_soak_pass() -> None:
    d = decide(inputs())
    assert d.call == "roll out" and d.tone == "good"
    assert d.headline == (
        "roll out AMG-ON: turn-2 TTFT 2.1–11× faster at 8k–128k, stability window PASS, 2 GPUs saved at 10 req/s "
        "vs AMG-OFF"
    )
    assert d.simulated == [] and d.measured[0] == "POC (valid): vLLM 0.26.0 + LMCache 0.5.3, 1× NVIDIA H100 80GB HBM3"
    assert d.caveats == ["below 8k: 0.7× at 1k (under 1.5×)"]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"poc": Evidence("POC", "failed", "measured", H100)}, "the POC run's validity verdict is failed"),
        ({"soak": Evidence("stability window", "FAIL", "measured", H100)}, "the stability window FAILed"),
        ({"failed_stages": ("staging",)}, "playbook stage staging failed"),
        ({"speedups": ((8000, 0.9), (32000, 1.0))}, "AMG-ON is no faster than AMG-OFF at any length (turn 2)"),
        ({"savings": (Saving("AMG-ON", "AMG-OFF", -1, 10.0, "measured"),)}, "AMG-ON needs 1 GPU more than AMG-OFF"),
    ],
)
def test_do_not_roll_out_when_evidence_says_no(changes: dict[str, object], reason: str) -> None:
    d = decide(inputs(**changes))
    assert d.call == "do not roll out yet" and d.tone == "bad"
    assert d.headline.startswith("do not roll out AMG-ON yet: ") and reason in d.headline


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"speedups": (), "poc": None}, "no POC run with a baseline arm and an offload arm"),
        ({"poc": Evidence("POC", "valid", "simulated", "simulated: sim")}, "the POC is SIMULATED"),
        ({"poc": Evidence("POC", "inconclusive", "measured", H100)}, "validity verdict is inconclusive"),
        ({"soak": None}, "no stability window"),
        ({"soak": Evidence("stability window", "INCOMPLETE", "measured", H100)}, "stability window is INCOMPLETE"),
        ({"soak": Evidence("stability window", "PASS", "simulated", "simulated: sim")}, "window is SIMULATED"),
    ],
)
def test_not_enough_evidence_when_missing_or_cannot_tell(changes: dict[str, object], reason: str) -> None:
    d = decide(inputs(**changes))
    assert d.call == "not enough evidence" and d.tone == "neutral"
    assert d.headline.startswith("not enough evidence to roll out AMG-ON: ") and reason in d.headline


def test_simulated_speedups_never_read_as_measured() -> None:
    d = decide(inputs(poc=Evidence("POC", "valid", "simulated", "simulated: sim profile")))
    assert "SIMULATED turn-2 TTFT" in d.headline and d.call != "roll out"
    assert d.simulated == ["POC (valid): sim profile"]
    assert any("POC is SIMULATED" in c for c in d.caveats)


def test_a_simulated_sweep_alone_is_not_enough_and_says_so() -> None:
    sweep = Evidence("capacity sweep s", "", "simulated", "simulated: kvbench simulator")
    d = decide(DecisionInputs(None, None, 2, sweeps=(sweep,), savings=(Saving("ON", "OFF", 1, 5.0, "simulated"),)))
    assert d.call == "not enough evidence"
    assert d.headline == (
        "not enough evidence to roll out ON: no POC run with a baseline arm and an offload arm; no stability window "
        "(kvbench soak) (so far: 1 GPU saved at 5 req/s vs OFF (SIMULATED sweep))"
    )
    assert d.measured == [] and d.simulated == ["capacity sweep s: kvbench simulator"]


def test_caveats_name_inconclusive_coarse_and_mixed_setups() -> None:
    sweep = Evidence("capacity sweep s", "", "measured", "measured: vLLM 0.26.0, 1× NVIDIA H200")
    d = decide(inputs(sweeps=(sweep,), coarse=("sweep s has 2 load point(s) per arm",)))
    assert "sweep s has 2 load point(s) per arm" in d.caveats
    assert any("2 different setups" in c for c in d.caveats)
    d = decide(inputs(soak=Evidence("stability window", "INCOMPLETE", "measured", H100)))
    assert "stability window verdict INCOMPLETE: it could not tell" in d.caveats


def test_the_page_opens_with_the_decision_derived_from_its_runs(tmp_path: Path) -> None:
    probe = make_probe_run(tmp_path / "runs", speedup=4.0)  # the simulator: never a roll-out
    sources = collect_sources([probe])
    facts = decision_inputs(sources)
    assert facts.poc is not None and facts.poc.origin == "simulated" and facts.speedups
    html = render_html(sources, tmp_path)
    main = html[html.index("<main>") :]
    assert main.removeprefix("<main>").lstrip().startswith('<section id="decision"')  # the first section
    assert "NOT ENOUGH EVIDENCE" in html and "SIMULATED turn-2 TTFT" in html and "no stability window" in html
