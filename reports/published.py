"""A published TTFT table (a vendor's or a paper's) beside kvbench's runs, with the analytical expectation.

A spec file (YAML, :class:`PublishedSpec`) holds the published numbers as printed, names the run
directory, arm and turn that measure each of its columns, and lists the runs to explain with the
analytical model (:mod:`offload.analytical`). :func:`render_published` reads only stored result
files (``summary.json``, ``manifest.json``, ``scenario.yaml``) and returns Markdown; ``kvbench
versus SPEC`` writes it. Nothing is re-measured, so a page built from it can be rebuilt offline.

Expectation per run and prompt length N (ms; all per GPU, TP ranks work in parallel):

* turn 1, compute: ``t1(N) = t_fixed + (N·F(N) − N_0·F(N_0)) / (TP·X)`` with ``F(N) = 2·P + 2·L·d_attn·N``
  FLOP per token (:func:`offload.analytical.flops_per_token`), ``N_0`` the run's shortest length,
  ``t_fixed`` the baseline arm's turn 1 there, and ``X`` the FLOP/s per GPU its turn 1 reached at the
  longest length (``X = (N_max·F(N_max) − N_0·F(N_0)) / (TP·(t1(N_max) − t_fixed))``): one measured rate,
  every length in between predicted from FLOPs.
* turn 2, load: ``t2(N) = t_fixed + N·|KV_tok| / BW`` with ``|KV_tok|`` the KV bytes per token per GPU
  (``2·L·kv_heads/TP·head_dim·bytes``), ``BW`` the host-to-GPU link per GPU in GB/s
  (``host_link_gbps``) and ``t_fixed`` as above (one short prefill: the request's fixed cost plus the
  question's compute).
* the effective load rate the offload arm reached: ``N·|KV_tok| / (t2_measured(N) − t_fixed)`` GB/s.

A cell whose run's verdict names its arm (e.g. the tier served no token) is shown as ``✗`` with
the reason below the table: an invalid measurement is not a number to compare.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError

from common.errors import KvbenchError
from common.markup import md_table
from common.schema import StrictModel, first_problem
from common.yamlfile import read_yaml_mapping
from harness.results.capacity import engine_shapes
from harness.results.provenance import provenance
from harness.results.run_result import RunResult
from harness.results.verdict import outcome_of_result
from harness.store.manifest import read_manifest
from harness.store.rundir import RunDir
from offload import analytical

_TURN = re.compile(r"\bturn (\d+)\b")


class PublishedError(KvbenchError):
    """A spec that cannot be read, or a run it names that cannot be compared."""


class PublishedColumn(StrictModel):
    name: str = Field(description="The column's heading as published, e.g. 'FP16 ON t2'.")
    run: str = Field(description="Run directory (relative to the spec file) that measures it.")
    arm: str
    turn: int = Field(ge=1)


class ExpectedRun(StrictModel):
    label: str = Field(description="Short name in the expectation table, e.g. 'FP16'.")
    run: str = Field(description="Run directory (relative to the spec file).")
    offload_arm: str = Field(description="The arm whose turn 2 loads from the tier.")


class PublishedSpec(StrictModel):
    title: str
    source: str = Field(description="Where the published numbers come from, and what they do not say.")
    columns: list[PublishedColumn] = Field(min_length=1)
    rows: dict[int, list[float | None]] = Field(
        description="Prompt length (tokens) -> the published values (ms) in column order; null where none."
    )
    expectation: list[ExpectedRun] = Field(default_factory=list)
    host_link_gbps: float = Field(
        default=55.0, gt=0, description="Host-to-GPU bandwidth per GPU (GB/s) in the turn-2 expectation."
    )


@dataclass(frozen=True)
class _Run:
    path: Path
    result: RunResult
    label: str
    invalid: dict[tuple[str, int | None], str]
    """(arm, turn) -> why the run's verdict rejects those cells; turn None: every turn of the arm."""

    def why_invalid(self, arm: str, turn: int) -> str | None:
        return self.invalid.get((arm, turn)) or self.invalid.get((arm, None))


def load_spec(path: Path) -> PublishedSpec:
    data = read_yaml_mapping(path, PublishedError)
    try:
        spec = PublishedSpec.model_validate(data)
    except ValidationError as error:
        raise PublishedError(f"{path}: {first_problem(error)}") from None
    for tokens, values in spec.rows.items():
        if len(values) != len(spec.columns):
            raise PublishedError(
                f"{path}: rows.{tokens}: {len(values)} values for {len(spec.columns)} columns "
                f"({', '.join(column.name for column in spec.columns)})"
            )
    return spec


def _open_run(base: Path, relative: str, cache: dict[Path, _Run]) -> _Run:
    path = (base / relative).resolve()
    if path in cache:
        return cache[path]
    try:
        result = RunResult.read_file(path / "summary.json")
        manifest = read_manifest(path / "manifest.json")
    except (OSError, KvbenchError) as error:
        raise PublishedError(f"{relative}: not a readable run directory ({error})") from None
    outcome = outcome_of_result(result)
    invalid: dict[tuple[str, int | None], str] = {}
    if outcome.status != "completed":
        for reason in outcome.reasons:
            for arm in result.arms:
                if reason.startswith(f"{arm} "):
                    turn = _TURN.search(reason)
                    invalid.setdefault((arm, int(turn.group(1)) if turn else None), reason)
    run = _Run(path, result, provenance(manifest).label, invalid)
    cache[path] = run
    return run


def _median(result: RunResult, arm: str, tokens: int, turn: int) -> float | None:
    cell = result.cell(arm, tokens, turn)
    return None if cell is None or cell.ttft is None else cell.ttft.median_ms


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.1f}" if value < 10_000 else f"{value:,.0f}"


def side_by_side(spec: PublishedSpec, base: Path) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, rows, notes): every published column as 'published / kvbench' per length."""
    cache: dict[Path, _Run] = {}
    runs = [_open_run(base, column.run, cache) for column in spec.columns]
    measured_lengths = {c.context_tokens for run in runs for c in run.result.cells}
    lengths = sorted(set(spec.rows) | measured_lengths)
    notes: list[str] = []
    rows: list[list[str]] = []
    for tokens in lengths:
        row = [f"{tokens:,}"]
        published = spec.rows.get(tokens, [None] * len(spec.columns))
        for column, run, value in zip(spec.columns, runs, published, strict=True):
            if run.why_invalid(column.arm, column.turn):
                ours = "✗"
            else:
                ours = _fmt(_median(run.result, column.arm, tokens, column.turn))
            row.append(f"{_fmt(value)} / {ours}")
        rows.append(row)
    for column, run in zip(spec.columns, runs, strict=True):
        why = run.why_invalid(column.arm, column.turn)
        if why:
            notes.append(f"✗ {column.name} ({run.path.name}): not a valid measurement -- {why}")
    for run in {id(run): run for run in runs}.values():
        notes.append(f"{run.path.name}: {run.label}")
    headers = ["Tokens", *[f"{column.name} (published / kvbench)" for column in spec.columns]]
    return headers, rows, notes


def expectation(spec: PublishedSpec, base: Path, wanted: ExpectedRun) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, rows, notes) of the analytical expectation for one run (see the module docstring)."""
    run = _open_run(base, wanted.run, {})
    result = run.result
    scenario = RunDir.open(run.path).scenario()
    shapes = engine_shapes(scenario.engine)
    if shapes.model is None:
        raise PublishedError(f"{wanted.run}: model shape unknown ({'; '.join(shapes.notes)})")
    model, tp = shapes.model, shapes.tp
    baseline = result.baseline_arm
    lengths = sorted(result.context_tokens)
    longest, shortest = lengths[-1], lengths[0]
    t1_long = _median(result, baseline, longest, 1)
    t_fixed = _median(result, baseline, shortest, 1)
    if t1_long is None or t_fixed is None:
        raise PublishedError(f"{wanted.run}: {baseline} has no turn-1 median at {shortest} or {longest} tokens")

    def total_flops(n: int) -> float:
        return n * analytical.flops_per_token(model.param_count, model.layers, model.effective_attention_dim, n)

    # the shortest prompt's TTFT is the fixed cost; what the longer prompts add is compute
    rate = (total_flops(longest) - total_flops(shortest)) / (tp * (t1_long - t_fixed) / 1000.0)  # FLOP/s per GPU
    kv = analytical.model_kv_bytes_per_token(model, tp)
    why = run.why_invalid(wanted.offload_arm, 2)
    rows = []
    for n in lengths:
        t1_measured = _median(result, baseline, n, 1)
        t2_measured = None if why else _median(result, wanted.offload_arm, n, 2)
        t1_expected = t_fixed + (total_flops(n) - total_flops(shortest)) / (tp * rate) * 1000.0
        t2_expected = t_fixed + n * kv / (spec.host_link_gbps * 1e9) * 1000.0
        load_ms = None if t2_measured is None else t2_measured - t_fixed
        effective = n * kv / (load_ms / 1000.0) / 1e9 if load_ms is not None and load_ms > 0 else None
        rows.append(
            [
                f"{n:,}",
                _fmt(t1_measured),
                _fmt(t1_expected),
                "✗" if why else _fmt(t2_measured),
                _fmt(t2_expected),
                f"{n * kv / 1e9:.2f}",
                "—" if effective is None else f"{effective:.1f}",
            ]
        )
    headers = [
        "Tokens",
        f"{baseline} t1 measured",
        "t1 expected (FLOPs)",
        f"{wanted.offload_arm} t2 measured",
        f"t2 expected ({spec.host_link_gbps:g} GB/s)",
        "KV per GPU (GB)",
        "effective load GB/s per GPU",
    ]
    notes = [
        f"{run.label}",
        f"{model.name}: {model.param_count / 1e9:.1f}B parameters multiplied per token, {model.layers} layers, "
        f"{kv / 1024:.0f} KiB of KV per token per GPU at TP {tp}",
        f"measured prefill rate at {longest:,} tokens: {rate / 1e12:.0f} TFLOP/s per GPU; "
        f"t_fixed = {baseline} t1 at {shortest:,} tokens = {t_fixed:.1f} ms",
    ]
    if why:
        notes.append(f"✗ {wanted.offload_arm} turn 2: {why}")
    return headers, rows, notes


def render_published(spec_path: Path) -> str:
    """The Markdown page: side-by-side table, then one expectation table per listed run."""
    spec = load_spec(spec_path)
    base = spec_path.parent
    headers, rows, notes = side_by_side(spec, base)
    lines = [f"## {spec.title}", "", f"Published: {spec.source}", "", *md_table(headers, rows), ""]
    lines += [f"- {note}" for note in notes]
    for wanted in spec.expectation:
        headers, rows, notes = expectation(spec, base, wanted)
        lines += ["", f"### {wanted.label}: measured vs the analytical expectation", "", *md_table(headers, rows), ""]
        lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"
