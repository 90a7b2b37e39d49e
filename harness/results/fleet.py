"""Fleet results (``fleet.json``): same-replica vs moved turns, per-replica hits and load, fleet capacity.

A pure function of the run directory's files (:func:`fleet_result_of`): ``records.jsonl``
(``replica``, ``moved``), ``replica_metrics.jsonl`` (per-replica counter totals at each scrape),
``points.jsonl`` (sweeps) and the scenario. Definitions, per arm (measured records only; of a probe,
those of the attempt that completed each context length, as in the TTFT table -- a length re-run by
``--resume`` after a failure counts once, and scrape deltas spanning a superseded request are left out):

* **same vs moved** (turns >= 2, per context length of a probe or per load level of a sweep/soak):
  median TTFT (ms) and count of the turns served
  by the replica that served the conversation's previous turn (``moved = false``) and of those
  served by another (``moved = true``); ``moved share`` = moved / (same + moved);
* **per-replica load**: requests served, ``busy_s`` = Σ e2e seconds of those requests (time the
  replica spent on kvbench's requests, overlapping ones counted each), ``share`` = requests /
  all the arm's requests (1/N everywhere = no hotspot), ``imbalance`` = max share × N (1 = even),
  ``peak_in_flight`` = most of its requests open at once (queued or running: the queue a hotspot
  builds) and ``ttft_p90_ms`` = the 90th percentile of their TTFT (linear interpolation, as in sweeps);
* **hit tokens by source** per replica, from consecutive scrapes of that arm and attempt
  (Δ of running totals): ``own_gpu`` = Δ gpu_prefix_hits; tier hits = Δ external_prefix_hits, split
  by the engine's per-tier counters where it has them (``tier_hits:<kind>``: the ``shared`` kind is
  the shared tier, the others the replica's own tier), otherwise all to ``own_tier`` -- or to
  ``shared_tier`` when every tier is shared: the arm's tiers are all ``shared``, or the manifest says
  the fleet's shared tier serves all tiers (``shared_tier_serves``: vLLM ``lmcache-mp`` with a shared
  tier, one LMCache server); cross-checked by ``usage_cached_tokens`` = Σ ``cached_tokens`` the
  engine reported in the responses that replica served;
* **fleet capacity** (sweeps): per load point, completed measured requests / window seconds, ÷ the
  fleet's GPUs (replicas × gpus_per_replica) = RPS per GPU.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from typing import Literal

import pandas as pd
from pydantic import Field

from common.schema import VersionedFile
from harness.engines.replicas import ReplicaFields
from harness.store.manifest import read_manifest
from harness.store.records import RequestRecord
from harness.store.rundir import RunDir
from workloads.config import MultiRoundQAProbe

from .aggregate import keep_chosen
from .run_result import Frozen

NS_PER_MS = 1_000_000


class MovedCell(Frozen):
    """Turns >= 2 of one probe context length, or of one load level (sweep point, soak)."""

    context_tokens: int | None
    """The probe's context length; None for load runs, whose users have many lengths."""
    load: float | None = None
    """Load runs: the point's users or requests/s."""
    same_count: int
    moved_count: int
    same_ttft_ms: float | None
    moved_ttft_ms: float | None

    @property
    def moved_share(self) -> float | None:
        total = self.same_count + self.moved_count
        return None if total == 0 else self.moved_count / total


class ReplicaLoad(Frozen):
    replica: int
    requests: int
    busy_s: float
    share: float
    usage_cached_tokens: int | None = None
    """Σ usage.prompt_tokens_details.cached_tokens of the requests it served (the cross-check of the hits);
    None when none of them reported usage details."""
    peak_in_flight: int = 0
    """Most of its requests in flight at once (each from ``started_ns`` to ``started_ns + e2e_ns``; one
    attempt at a time, as each has its own clock): queued, prefilling or decoding there. A hotspot's
    queue shows here, and in its TTFT p90."""
    ttft_p90_ms: float | None = None
    """90th percentile TTFT of its successful requests; None when it served none."""
    own_gpu_hits: float | None = None
    own_tier_hits: float | None = None
    shared_tier_hits: float | None = None


class CapacityPoint(Frozen):
    point: int
    load: float
    rps: float
    rps_per_gpu: float


class ArmFleet(Frozen):
    arm: str
    routing: str
    replicas: int
    gpus: int
    moved: list[MovedCell]
    load: list[ReplicaLoad]
    imbalance: float | None
    capacity: list[CapacityPoint] = Field(default_factory=list)
    unattributed: int = 0
    """Measured requests whose replica is unknown (external routing: the router did not say, or, with
    metrics attribution, the request overlapped another); they are in no column above."""


class FleetResult(VersionedFile):
    FILE_NAME = "fleet.json"
    schema_version: Literal[1] = 1
    scenario: str
    arms: list[ArmFleet]


def _median_ms(values: list[int]) -> float | None:
    return statistics.median(values) / NS_PER_MS if values else None


def _hits_by_source(
    run_dir: RunDir, arm: str, shared_only: bool, replicas: int, superseded: list[RequestRecord]
) -> list[dict[str, float] | None]:
    """Per replica: Σ over consecutive scrapes of Δ hits, by source (None: no counters for it).

    A Δ whose window (the two scrapes' ``at_ns``, same attempt: the monotonic clock restarts with
    the machine) saw a ``superseded`` request start is left out, as those requests are.
    """
    totals: list[dict[str, float] | None] = [None] * replicas
    by_attempt: dict[int, list[tuple[int, list[dict[str, float] | None]]]] = defaultdict(list)
    for event in run_dir.replica_counters():
        if event.arm == arm:
            by_attempt[event.attempt].append((event.at_ns, event.counters))
    for attempt, scrapes in by_attempt.items():
        dropped = [r.started_ns for r in superseded if r.attempt == attempt]
        for (start_ns, before), (end_ns, after) in itertools.pairwise(scrapes):
            if any(start_ns < started <= end_ns for started in dropped):
                continue
            for replica in range(min(replicas, len(before), len(after))):
                old, new = before[replica], after[replica]
                if old is None or new is None:
                    continue
                into = totals[replica] = totals[replica] or {"own_gpu": 0.0, "own_tier": 0.0, "shared_tier": 0.0}
                diff = {key: new[key] - old.get(key, 0.0) for key in new}
                into["own_gpu"] += diff.get("gpu_prefix_hits", 0.0)
                tiers = {key.split(":", 1)[1]: value for key, value in diff.items() if key.startswith("tier_hits:")}
                external = diff.get("external_prefix_hits", 0.0)
                if tiers:
                    into["shared_tier"] += tiers.get("shared", 0.0)
                    into["own_tier"] += sum(value for kind, value in tiers.items() if kind != "shared")
                elif shared_only:
                    into["shared_tier"] += external
                else:
                    into["own_tier"] += external
    return totals


def fleet_result_of(run_dir: RunDir) -> FleetResult | None:
    """The fleet result of a run directory (None when its engine is a single replica); writes nothing."""
    scenario = run_dir.scenario()
    engine = scenario.engine
    if not isinstance(engine, ReplicaFields) or engine.fleet_size <= 1:
        return None
    replicas, gpus = engine.fleet_size, engine.fleet_gpus
    measured = [record for record in run_dir.records() if record.phase == "measure"]
    # a probe counts each group's completing attempt only (as its TTFT table does); a load run's
    # points are its own account of what a resumed attempt re-ran
    probe = isinstance(scenario.workload, MultiRoundQAProbe)
    records = keep_chosen(measured, run_dir.groups_done()) if probe else measured
    kept = {id(record) for record in records}
    points = run_dir.points()
    manifest = read_manifest(run_dir.manifest_file)
    arms: list[ArmFleet] = []
    for arm in scenario.arms:
        mine = [record for record in records if record.arm == arm.name]
        if not mine:  # an arm not run yet (--arm, or a run stopped early) has nothing to split
            continue
        cells: list[MovedCell] = []
        # a probe splits by context length; a load run's users have many lengths, so by load level
        groups: dict[tuple[int | None, float | None], list[RequestRecord]] = defaultdict(list)
        for r in mine:
            if r.turn >= 2 and r.ok and r.ttft_ns is not None:
                groups[(r.context_tokens, None) if probe else (None, r.load)].append(r)
        for (context, level), later in sorted(groups.items(), key=lambda item: (item[0][0] or 0, item[0][1] or 0.0)):
            same = [r.ttft_ns for r in later if r.moved is False and r.ttft_ns is not None]
            moved = [r.ttft_ns for r in later if r.moved is True and r.ttft_ns is not None]
            cells.append(
                MovedCell(
                    context_tokens=context,
                    load=level,
                    same_count=len(same),
                    moved_count=len(moved),
                    same_ttft_ms=_median_ms(same),
                    moved_ttft_ms=_median_ms(moved),
                )
            )
        # without per-tier counters, external hits are the shared tier's when every tier is shared: the
        # profile's tiers are all 'shared', or the fleet served them from one shared server (manifest)
        details = ((manifest.get("engines") or {}).get(arm.name) or {}).get("details") or {}
        shared_only = bool(arm.profile.tiers) and (
            all(tier.kind == "shared" for tier in arm.profile.tiers) or details.get("shared_tier_serves") == "all tiers"
        )
        superseded = [r for r in measured if r.arm == arm.name and id(r) not in kept]
        hits = _hits_by_source(run_dir, arm.name, shared_only, replicas, superseded)
        served = [r for r in mine if r.replica is not None]
        load: list[ReplicaLoad] = []
        for replica in range(replicas):
            own = [r for r in served if r.replica == replica]
            source = hits[replica]
            load.append(
                ReplicaLoad(
                    replica=replica,
                    requests=len(own),
                    busy_s=sum((r.e2e_ns or 0) for r in own) / 1e9,
                    share=len(own) / len(served) if served else 0.0,
                    usage_cached_tokens=_usage_cached(own),
                    peak_in_flight=_peak_in_flight(own),
                    ttft_p90_ms=_p90_ms([r.ttft_ns for r in own if r.ok]),
                    own_gpu_hits=None if source is None else source["own_gpu"],
                    own_tier_hits=None if source is None else source["own_tier"],
                    shared_tier_hits=None if source is None else source["shared_tier"],
                )
            )
        imbalance = max(entry.share for entry in load) * replicas if served else None
        capacity: list[CapacityPoint] = []
        for event in sorted((p for p in points if p.arm == arm.name), key=lambda p: p.point):
            window_s = (event.window_end_ns - event.window_start_ns) / 1e9
            done = sum(1 for r in mine if r.point == event.point and r.ok)
            rps = done / window_s if window_s > 0 else 0.0
            capacity.append(CapacityPoint(point=event.point, load=event.load, rps=rps, rps_per_gpu=rps / gpus))
        policy = (arm.routing or scenario.routing).policy
        arms.append(
            ArmFleet(
                arm=arm.name,
                routing=policy,
                replicas=replicas,
                gpus=gpus,
                moved=cells,
                load=load,
                imbalance=imbalance,
                capacity=capacity,
                unattributed=len(mine) - len(served),
            )
        )
    return FleetResult(scenario=scenario.name, arms=arms)


def summarize_fleet(run_dir: RunDir) -> FleetResult | None:
    """fleet_result_of, written to fleet.json when the engine is a fleet."""
    result = fleet_result_of(run_dir)
    if result is not None:
        result.write_file(run_dir.fleet_file)
    return result


def _peak_in_flight(records: list[RequestRecord]) -> int:
    """Most requests open at once, per attempt (a sweep over start +1 / end −1 events; an end sorts first)."""
    peak = 0
    by_attempt: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        by_attempt[r.attempt] += [(r.started_ns, 1), (r.started_ns + (r.e2e_ns or 0), -1)]
    for events in by_attempt.values():
        open_now = 0
        for _, step in sorted(events):
            open_now += step
            peak = max(peak, open_now)
    return peak


def _p90_ms(ttfts: list[int | None]) -> float | None:
    """The 90th percentile as every other kvbench table takes it (pandas' linear interpolation)."""
    values = pd.Series([t for t in ttfts if t is not None], dtype="float64")
    return None if values.empty else float(values.quantile(0.9)) / NS_PER_MS


def _usage_cached(records: list[RequestRecord]) -> int | None:
    reported = [r.cached_tokens for r in records if r.cached_tokens is not None]
    return sum(reported) if reported else None
