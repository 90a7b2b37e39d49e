"""Stored result files for report and playbook tests, written through the harness's own writers.

A probe run directory is built from synthetic per-request records and aggregated by
:func:`harness.results.aggregate.summarize_run_dir`, exactly as ``kvbench report`` does; a soak
directory holds intervals appended by :meth:`RunDir.append_interval` and a soak.json from
:func:`summarize_soak`. Nothing here hard-codes a result: every number is computed from records.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from harness.gate.playbook import attach_run, save_playbook, starter_playbook
from harness.results.aggregate import summarize_run_dir
from harness.results.soak import summarize_soak
from harness.scenario.spec import parse_scenario
from harness.store.events import GroupDone, IntervalStats, MetricsDelta
from harness.store.records import RecordWriter, RequestRecord
from harness.store.rundir import RunDir


def probe_scenario(name: str = "probe", conversations: int = 4) -> dict[str, Any]:
    """A fresh two-arm (AMG-OFF baseline, AMG-ON on the CPU tier) probe scenario on the simulator,
    contexts 1,000 and 8,000 tokens, two turns; a new dict every call, so a test may change it."""
    return {
        "name": name,
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "AMG-OFF", "offload": "off"}, {"name": "AMG-ON", "offload": "cpu"}],
        "compare": {"baseline": "AMG-OFF"},
        "workload": {
            "kind": "multi_round_qa",
            "context_tokens": [1000, 8000],
            "conversations": conversations,
            "turns": 2,
        },
    }


def request_record(arm: str, context_tokens: int, conversation: int, turn: int, **fields: object) -> RequestRecord:
    """One request's record for a test: a successful measured chat request of attempt 0, repetition 0, started at
    0 ns, with ``fields`` (any RequestRecord field) set or replacing those; its id names arm, attempt and cell."""
    attempt = fields.get("attempt", 0)
    identity = {"arm": arm, "context_tokens": context_tokens, "conversation": conversation, "turn": turn}
    defaults = {"attempt": 0, "phase": "measure", "repetition": 0, "api": "chat", "started_ns": 0, "ok": True}
    request_id = f"{arm}-{attempt}-{context_tokens}-{conversation}-{turn}"
    return RequestRecord.model_validate({**defaults, "request_id": request_id, **identity, **fields})


def probe_ttft_ms(arm: str, ctx: int, turn: int, speedup: float) -> float:
    """A plausible TTFT: prefill ~0.06 ms/token; the offload arm's turn 2 is ``speedup`` times faster."""
    cold = 5.0 + 0.06 * ctx
    return cold / speedup if (arm != "AMG-OFF" and turn == 2) else cold


def make_probe_run(
    parent: Path,
    *,
    name: str = "probe",
    speedup: float = 4.0,
    arms: list[dict[str, object]] | None = None,
    seed: int = 0,
    error_share: float = 0.0,
) -> Path:
    data = probe_scenario(name)
    if arms is not None:
        data["arms"] = arms
        data["compare"] = {"baseline": arms[0]["name"]}
    scenario = parse_scenario(data, "test")
    run_dir = RunDir.create(parent, scenario)
    manifest = {
        "run_id": run_dir.run_id,
        "scenario_name": scenario.name,
        "scenario": scenario.model_dump(mode="json"),
        "kvbench_version": "test",
        "host": {"platform": "test", "python": "3.11", "cpu_count": 2, "gpus": []},
        "engines": {
            a.name: {"kind": "sim", "version": "test", "command": ["kvbench", "sim", "--api-key", "***"]}
            for a in scenario.arms
        },
        "attempts": [{"attempt": 0, "status": "completed"}],
    }
    run_dir.manifest_file.write_text(json.dumps(manifest))
    rng = random.Random(seed)
    contexts = [1000, 8000]
    with RecordWriter(run_dir.records_file) as writer:
        for arm in scenario.arms:
            offload = arm.profile.offload_enabled
            for ctx in contexts:
                for conv in range(4):
                    for turn in (1, 2):
                        failed = rng.random() < error_share
                        ttft = probe_ttft_ms(arm.name, ctx, turn, speedup if offload else 1.0) * rng.uniform(0.97, 1.03)
                        writer.append(
                            request_record(
                                arm.name,
                                ctx,
                                conv,
                                turn,
                                request_id=f"{arm.name}{ctx}{conv}{turn}",
                                ttft_ns=None if failed else int(ttft * 1e6),
                                e2e_ns=None if failed else int((ttft + 50) * 1e6),
                                ok=not failed,
                                error_kind="timeout" if failed else None,
                                prompt_tokens=ctx + 40 * turn,
                                cached_tokens=int(ctx * 0.97) if offload and turn == 2 else 0,
                            )
                        )
                run_dir.mark_group_done(GroupDone(arm=arm.name, repetition=0, context_tokens=ctx, attempt=0))
                if offload:
                    run_dir.append_metrics(
                        MetricsDelta(
                            arm=arm.name,
                            attempt=0,
                            repetition=0,
                            context_tokens=ctx,
                            turn=2,
                            values={
                                "gpu_prefix_queries": 4.0 * ctx,
                                "gpu_prefix_hits": 0.0,
                                "external_prefix_hits": 3.8 * ctx,
                                "prompt_tokens": 4.0 * ctx,
                            },
                        )
                    )
    summarize_run_dir(run_dir)
    return run_dir.path


def make_playbook(tmp_path: Path, customer: str, *, baseline_run: str = "baseline") -> tuple[Path, Path]:
    """The starter playbook for ``customer`` at ``tmp_path/playbook.yaml`` with a stored probe run named
    ``baseline_run`` attached as its baseline; the playbook, and the folder its runs are in (``tmp_path/runs``)."""
    path = tmp_path / "playbook.yaml"
    save_playbook(starter_playbook(customer), path)
    runs = tmp_path / "runs"
    attach_run(path, "baseline", make_probe_run(runs, name=baseline_run))
    return path, runs


SOAK = {
    "name": "soak",
    "engine": {"kind": "openai", "model": "llama-3.1-8b", "base_url": "http://127.0.0.1:9", "hardware": "h100-sxm"},
    "arms": [{"name": "AMG-ON", "offload": "cpu"}],
    "workload": {"kind": "multi_user_qa", "users": 8, "rounds": 3, "context_tokens": 2000},
    "sweep": {"mode": "concurrency", "values": [4]},
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
    "soak": {"window": "10m", "interval": "30s", "criteria": {"hit_rate_floor": 0.5}},
}


def make_soak_dir(parent: Path, *, name: str = "soak", error_burst: bool = False, intervals: int = 20) -> Path:
    data = json.loads(json.dumps(SOAK))
    data["name"] = name
    scenario = parse_scenario(data, "test")
    run_dir = RunDir.create(parent, scenario)
    run_dir.manifest_file.write_text(
        json.dumps(
            {
                "scenario_name": name,
                "scenario": scenario.model_dump(mode="json"),
                "engines": {"AMG-ON": {"kind": "openai", "version": "test"}},
                "attempts": [{"attempt": 0}],
                "host": {},
            }
        )
    )
    rng = random.Random(1)
    for index in range(intervals):
        p99 = 180 + rng.uniform(-15, 15)
        run_dir.append_interval(
            soak_interval(
                index,
                interval_s=30,
                start_unix_s=1_700_000_000,
                requests=60,
                errors=12 if error_burst and index in (12, 13) else 0,
                p99=p99,
                p50=p99 / 3,
                tpot_ms=(12.0, 25.0),
                hit=0.8 + rng.uniform(-0.05, 0.05),
                kv_usage=0.4,
                counters={"prompt_tokens": 1000.0 * (index + 1)},
            ),
        )
    summarize_soak(run_dir)
    return run_dir.path


def soak_interval(
    index: int,
    *,
    interval_s: int = 10,
    start_unix_s: int = 0,
    requests: int = 100,
    errors: int = 0,
    p99: float = 200.0,
    p50: float | None = None,
    tpot_ms: tuple[float, float] = (10.0, 20.0),
    hit: float | None = 0.8,
    slo_met: int | None = None,
    restarts: int = 0,
    counters: dict[str, float] | None = None,
    kinds: dict[str, int] | None = None,
    kv_usage: float | None = None,
) -> IntervalStats:
    """Interval ``index`` (attempt 0) of ``interval_s`` seconds of a soak window that began at ``start_unix_s``:
    ``requests`` completed of which ``errors`` failed (HTTP 503, unless ``kinds`` tallies them otherwise) and the
    rest met the SLO unless ``slo_met`` says how many did; TTFT p99 ``p99`` ms and p50 ``p50`` (half the p99 when
    None), TPOT p50 and p99 ``tpot_ms``, the /metrics hit rate ``hit``; ``counters`` default to
    ``{"prompt_tokens": index}``."""
    return IntervalStats(
        index=index,
        attempt=0,
        start_unix_ns=(start_unix_s + index * interval_s) * 10**9,
        duration_ns=interval_s * 10**9,
        requests=requests,
        ok=requests - errors,
        errors=errors,
        errors_by_kind=kinds or ({"http_status": errors} if errors else {}),
        http_statuses={"503": errors} if errors else {},
        rps=requests / interval_s,
        ttft_p50_ms=p99 / 2 if p50 is None else p50,
        ttft_p99_ms=p99,
        tpot_p50_ms=tpot_ms[0],
        tpot_p99_ms=tpot_ms[1],
        slo_met=requests - errors if slo_met is None else slo_met,
        hit_rate=hit,
        hit_rate_source="metrics",
        kv_usage=kv_usage,
        restarts=restarts,
        counters={"prompt_tokens": float(index)} if counters is None else counters,
    )
