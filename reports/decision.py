"""The case study's decision card: one recommendation derived from the verdicts present.

:func:`decide` is pure: :mod:`reports.html` reads the stored files into a :class:`DecisionInputs`
(the POC's speed-ups and validity verdict, the stability window's verdict, the playbook's failed
stages, the sweeps' GPUs saved, each part's provenance) and renders the :class:`Decision`.

Speed-up at a context length = baseline median TTFT / arm median TTFT at the target turn (× faster;
the seed's % diff = (speed-up − 1) × 100). The lengths that matter are the longest run of lengths,
ending at the longest one measured, whose speed-up is at least :data:`MATERIAL`; the headline gives
the speed-up range over them ("3.1–11× at 32k–128k") and the rest separately.

The call, first match wins:

* **do not roll out yet** when evidence says no: the POC's validity verdict is ``failed``, the
  stability window FAILed, a playbook stage failed, the arm is no faster at any length, or a sweep
  needs more GPUs with it;
* **not enough evidence** when evidence is missing or cannot tell: no POC speed-up, a POC that is
  simulated or ``inconclusive``, no stability window, one that is INCOMPLETE or simulated;
* **roll out** otherwise: a measured, valid POC faster at the lengths that matter and a measured
  stability window that PASSed.

GPUs saved (a sweep's) count only for the recommended arm (the POC's first offload arm), and say SIMULATED
when the sweep ran on the simulator.

Caveats list what the call rests on but does not settle: simulated parts, verdicts that could not
tell, coarse grids (fewer than :data:`COARSE_CONTEXTS` context lengths, fewer than
:data:`COARSE_LOADS` load points per arm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.results.provenance import Origin

MATERIAL = 1.5
"""A speed-up (×) from which a length counts as one that matters."""
COARSE_CONTEXTS = 3
COARSE_LOADS = 4

Call = Literal["roll out", "do not roll out yet", "not enough evidence"]
TONES: dict[Call, str] = {"roll out": "good", "do not roll out yet": "bad", "not enough evidence": "neutral"}


@dataclass(frozen=True)
class Evidence:
    """One part of the case study: its verdict as stored and where its figures came from."""

    name: str
    verdict: str
    """valid | failed | inconclusive (a run), PASS | FAIL | INCOMPLETE (a stability window), or "" (none)."""
    origin: Origin
    label: str
    """The provenance in words: engine and version, GPU × count, or simulated."""


@dataclass(frozen=True)
class Saving:
    """GPUs a sweep saves with an arm at a target load (negative: the arm needs more)."""

    arm: str
    baseline: str
    gpus_saved: int
    target_rps: float
    origin: Origin


@dataclass(frozen=True)
class SpeedupRange:
    low: float
    high: float
    first_context: int
    last_context: int

    def text(self, verb: str = "") -> str:
        """``3.1–11× at 32k–128k``, or with ``verb`` "faster" ``3.1–11× faster at 32k–128k`` (one value and one
        length when they coincide)."""
        low, high = fmt_times(self.low), fmt_times(self.high)
        value = low if low == high else f"{low}–{high}"
        first, last = fmt_tokens(self.first_context), fmt_tokens(self.last_context)
        where = first if first == last else f"{first}–{last}"
        return f"{value}× {verb} at {where}" if verb else f"{value}× at {where}"


@dataclass(frozen=True)
class DecisionInputs:
    arm: str | None
    baseline: str | None
    turn: int
    speedups: tuple[tuple[int, float], ...] = ()
    """(context tokens, baseline / arm median TTFT at ``turn``), by context length."""
    poc: Evidence | None = None
    soak: Evidence | None = None
    sweeps: tuple[Evidence, ...] = ()
    savings: tuple[Saving, ...] = ()
    failed_stages: tuple[str, ...] = ()
    coarse: tuple[str, ...] = ()
    """Grids too coarse to place a result, in words (computed by the caller from :data:`COARSE_*`)."""


@dataclass(frozen=True)
class Decision:
    call: Call
    headline: str
    measured: list[str] = field(default_factory=list)
    simulated: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    @property
    def tone(self) -> str:
        return TONES[self.call]


def fmt_times(value: float) -> str:
    """A speed-up with two significant figures: 14.9 -> '15', 3.14 -> '3.1', 0.75 -> '0.75'."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def fmt_tokens(tokens: int) -> str:
    """128000 -> '128k', 1500 -> '1.5k', 500 -> '500'."""
    return f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


def gpus(count: int) -> str:
    """'1 GPU', '2 GPUs' (and '-1 GPU')."""
    return f"{count} GPU" if abs(count) == 1 else f"{count} GPUs"


def speedup_ranges(speedups: Sequence[tuple[int, float]]) -> tuple[SpeedupRange | None, SpeedupRange | None]:
    """(the lengths that matter, the shorter rest): each the min–max speed-up over its lengths, or None."""
    ordered = sorted(speedups)
    start = len(ordered)
    while start > 0 and ordered[start - 1][1] >= MATERIAL:
        start -= 1

    def span(part: Sequence[tuple[int, float]]) -> SpeedupRange | None:
        if not part:
            return None
        values = [v for _, v in part]
        return SpeedupRange(min(values), max(values), part[0][0], part[-1][0])

    return span(ordered[start:]), span(ordered[:start])


def _part(evidence: Evidence) -> str:
    verdict = f" ({evidence.verdict})" if evidence.verdict else ""
    # the list it goes in already says measured or simulated
    label = evidence.label.removeprefix(f"{evidence.origin}: ")
    return f"{evidence.name}{verdict}: {label}"


def decide(inputs: DecisionInputs) -> Decision:
    """The recommendation and its caveats (see the module docstring for the rules)."""
    parts = [e for e in (inputs.poc, inputs.soak, *inputs.sweeps) if e is not None]
    measured = [_part(e) for e in parts if e.origin == "measured"]
    simulated = [_part(e) for e in parts if e.origin == "simulated"]
    caveats = [
        f"{e.name} is SIMULATED: its figures are a model's, not a measurement" for e in parts if e.origin == "simulated"
    ]
    caveats += [
        f"the provenance of {e.name} is unknown (no engine facts in its manifest)"
        for e in parts
        if e.origin == "unknown"
    ]
    caveats += [
        f"{e.name} verdict {e.verdict}: it could not tell" for e in parts if e.verdict in ("inconclusive", "INCOMPLETE")
    ]
    caveats += list(inputs.coarse)
    setups = sorted({e.label for e in parts if e.origin == "measured"})
    if len(setups) > 1:
        caveats.append(f"the parts were measured on {len(setups)} different setups: compare each only with itself")
    arm = inputs.arm or (inputs.savings[0].arm if inputs.savings else "the offload arm")
    turn = inputs.turn
    matter, rest = speedup_ranges(inputs.speedups)
    speed = ""
    if matter is not None:
        speed = f"turn-{turn} TTFT {matter.text('faster')}"
        if rest is not None:
            caveats.append(f"below {fmt_tokens(matter.first_context)}: {rest.text()} (under {MATERIAL:g}×)")
    elif rest is not None:
        speed = f"turn-{turn} TTFT {rest.text()}, under {MATERIAL:g}× at every length"
    if inputs.poc is not None and inputs.poc.origin == "simulated" and speed:
        speed = "SIMULATED " + speed
    # only the recommended arm's savings count: another arm's GPUs are not this one's
    arm_savings = [s for s in inputs.savings if s.arm == arm]
    saved = [
        f"{gpus(s.gpus_saved)} saved at {s.target_rps:g} req/s vs {s.baseline}"
        + (" (SIMULATED sweep)" if s.origin == "simulated" else "")
        for s in arm_savings
        if s.gpus_saved > 0
    ]

    blockers: list[str] = []
    if inputs.poc is not None and inputs.poc.verdict == "failed":
        blockers.append("the POC run's validity verdict is failed")
    if inputs.soak is not None and inputs.soak.verdict == "FAIL":
        blockers.append("the stability window FAILed")
    blockers += [f"playbook stage {stage} failed" for stage in inputs.failed_stages]
    if inputs.speedups and max(v for _, v in inputs.speedups) <= 1.0:
        blockers.append(f"{arm} is no faster than {inputs.baseline or 'the baseline'} at any length (turn {turn})")
    blockers += [
        f"{s.arm} needs {gpus(-s.gpus_saved)} more than {s.baseline} at {s.target_rps:g} req/s"
        for s in arm_savings
        if s.gpus_saved < 0
    ]
    if blockers:
        headline = f"do not roll out {arm} yet: " + "; ".join(blockers)
        return Decision("do not roll out yet", headline, measured, simulated, blockers, caveats)

    missing: list[str] = []
    if not inputs.speedups:
        missing.append("no POC run with a baseline arm and an offload arm")
    elif inputs.poc is not None and inputs.poc.origin != "measured":
        missing.append(f"the POC is {inputs.poc.origin.upper()}, not measured on a real engine")
    elif inputs.poc is not None and inputs.poc.verdict == "inconclusive":
        missing.append("the POC run's validity verdict is inconclusive")
    if inputs.soak is None:
        missing.append("no stability window (kvbench soak)")
    elif inputs.soak.verdict != "PASS":
        missing.append(f"the stability window is {inputs.soak.verdict or 'without a verdict'}")
    elif inputs.soak.origin != "measured":
        missing.append(f"the stability window is {inputs.soak.origin.upper()}, not measured on a real engine")
    if missing:
        found = [text for text in (speed, *saved) if text]
        so_far = f" (so far: {', '.join(found)})" if found else ""
        headline = f"not enough evidence to roll out {arm}: " + "; ".join(missing) + so_far
        return Decision("not enough evidence", headline, measured, simulated, missing, caveats)

    reasons = [speed, "stability window PASS", *saved]
    headline = f"roll out {arm}: " + ", ".join(reasons)
    return Decision("roll out", headline, measured, simulated, reasons, caveats)
