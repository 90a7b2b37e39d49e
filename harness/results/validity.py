"""The validity gates: a pure function of a run's stored files -> :class:`~.verdict.Validity`.

A run that measured nothing, or measured something other than a returning user served by the
offload tier, must say so instead of printing a table (issue 11). Gates, over the records and
``/metrics`` deltas the aggregation already chose (the completing attempt of each group):

* ``no_success`` (FAILED): a (arm, context, turn) cell has no successful request, or nothing was
  measured at all;
* ``error_rate`` (FAILED): failed measured requests / measured requests > ``validity.max_error_rate``;
* ``reset_missed`` (INCONCLUSIVE): in turn ≥ 2 of a cell, ``gpu_prefix_hits / prompt_tokens >
  validity.max_reset_hit_rate`` although ``between_turns`` drops the GPU prefix cache
  (``reset_prefix_cache`` / ``disable_prefix_cache``, or ``auto`` whatever method it chose: a reset, filler
  traffic sized to evict the cache, or none possible): the reset did not happen, the filler did not evict
  turn 1's KV, or nothing could; the message names the method;
* ``off_arm_hits`` (INCONCLUSIVE): an arm without offload tiers has turn ≥ 2 ``(gpu + external
  hits) / prompt_tokens`` above the same limit with ``between_turns`` other than ``none``; where the
  external (offload-tier) hits alone pass it, the endpoint has a tier the arm does not declare, and the
  message names how to declare it (:func:`harness.scenario.flags.tier_declaration`: ``--offload cpu``,
  ``--arm NAME:cpu=URL`` or ``arms[i].offload: cpu``, after the run's command line);
* ``no_offload_hits`` (INCONCLUSIVE): an arm with offload tiers has zero offload-tier (external)
  hit tokens in turn ≥ 2 of a context of at least its ``chunk_tokens`` (shorter contexts have
  nothing to load) while the engine reports that counter, and ``between_turns`` is not ``none``;
* ``engine_restarted`` (INCONCLUSIVE): an engine's cumulative counters went down or its process
  start time moved during an arm (``engine_restarts`` in ``engine_metrics.jsonl``);
* ``reset_unavailable`` (INCONCLUSIVE): ``between_turns`` resets the GPU prefix cache but an arm's engine
  offers no reset (:func:`with_reset_unavailable`), and nothing shows whether turn ≥ 2 hit that cache: no
  ``/metrics`` cache counters and no ``usage.prompt_tokens_details.cached_tokens`` for those turns. Where the
  counters are there, the gates above judge the turns as usual (their findings then end with why the arm had
  no reset and what would make it valid); where only ``cached_tokens`` is, a share
  ``cached / prompt tokens`` (medians) above ``validity.max_reset_hit_rate`` is ``reset_missed``;
* ``warm_turn1`` (INCONCLUSIVE): in a run whose prompts carry a per-run salt (:mod:`workloads.salt`), turn 1 of
  a cell has ``(gpu + external hits) / prompt_tokens > validity.max_turn1_hit_rate``: turn 1 was served from
  KV it should not find (an earlier run's, or another arm's on the same engine), so it did not start cold
  (:func:`with_warm_turn1`). Runs with fixed prompts (``workload.prompt_salt: fixed``, or written before
  salts) are not judged: their warm start is what they measure;
* ``engine_died`` (FAILED): in the run's last attempt an arm's engine process exited, or its endpoint refused
  connections, and the arm ended there (``engine_events.jsonl``); a later attempt that finishes the arm clears it.
* ``client_limited`` (INCONCLUSIVE): a load point whose client fell behind its own schedule
  (:class:`~harness.store.events.ClientLag`, :func:`with_client_limited`): a sending process's event-loop delay p99
  over ``validity.max_client_loop_delay_ms``, send lag p99 over ``validity.max_client_send_lag_ms``, or a
  process using at least ``validity.max_client_cpu`` of one core. Points stored without the client's figures are
  not judged.

Cells without ``/metrics`` counters are not judged by the cache gates (no evidence either way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from harness.scenario.flags import tier_declaration
from harness.scenario.spec import Scenario, ValiditySpec
from harness.store.events import EngineDown

from .run_result import BetweenTurnsMethod, CacheStats, RequestCounts, TtftCell
from .sweep_result import PointResult
from .verdict import Finding, Validity, verdict_of

RESETTING_MODES = frozenset({"reset_prefix_cache", "disable_prefix_cache", "auto"})
"""Modes whose every method means turn 2 should miss the GPU prefix cache (``filler`` with a hand-sized
``filler_tokens`` is judged by the off-arm gate only)."""
UNDECLARED_TIER_PROFILE = "cpu"
"""The profile an undeclared tier's message suggests: the counters show a tier's hits, not which tier."""


def error_findings(measured: int, ok: int, errors_by_kind: Mapping[str, int], max_error_rate: float) -> list[Finding]:
    """``no_success`` when nothing succeeded, ``error_rate`` when too much failed (both name the error kinds)."""
    ranked = sorted(errors_by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
    kinds = ", ".join(f"{kind} {count}" for kind, count in ranked)
    by_kind = f" (by kind: {kinds})" if kinds else ""
    if measured == 0:
        return [Finding(gate="no_success", message="no measured request was recorded")]
    if ok == 0:
        return [Finding(gate="no_success", message=f"all {measured} measured requests failed{by_kind}")]
    rate = (measured - ok) / measured
    if rate > max_error_rate:
        return [
            Finding(
                gate="error_rate",
                message=f"{measured - ok} of {measured} measured requests failed ({rate:.1%} > "
                f"validity.max_error_rate {max_error_rate:.1%}){by_kind}",
            )
        ]
    return []


def _cell_findings(cells: Sequence[TtftCell]) -> list[Finding]:
    return [
        Finding(
            gate="no_success",
            arm=cell.arm,
            context_tokens=cell.context_tokens,
            turn=cell.turn,
            message=f"{cell.arm} {cell.context_tokens} tokens turn {cell.turn}: no successful request "
            f"({cell.errors} failed)",
        )
        for cell in cells
        if cell.ttft is None
    ]


def _cache_finding(
    scenario: Scenario, stats: CacheStats, command: Sequence[str], method: BetweenTurnsMethod | None
) -> Finding | None:
    index, arm = next((i, a) for i, a in enumerate(scenario.arms) if a.name == stats.arm)
    profile = arm.profile
    mode = scenario.probe_workload.between_turns.mode
    limit = scenario.validity.max_reset_hit_rate
    prompt = stats.prompt_tokens or stats.gpu_queries
    if stats.turn < 2 or not prompt or mode == "none":
        return None
    where = f"{stats.arm} {stats.context_tokens} tokens turn {stats.turn}"
    located = {"arm": stats.arm, "context_tokens": stats.context_tokens, "turn": stats.turn}
    gpu_share = (stats.gpu_hits or 0.0) / prompt
    chosen = method.method if method is not None and mode == "auto" else None
    how = f"{mode} ({method.describe()})" if method is not None and chosen is not None else mode
    # under auto the message names the method that ran: a reset that did not happen reads apart from filler
    if mode in RESETTING_MODES and gpu_share > limit:
        hits = f"{where}: {gpu_share:.0%} of prompt tokens were GPU prefix-cache hits"
        if chosen == "unavailable":
            message = f"{hits}; between_turns auto found no way to drop that cache (limit {limit:.0%})"
        else:
            missed = "the filler did not evict turn 1's KV" if chosen == "filler" else "the reset did not happen"
            what = missed if not profile.offload_enabled else "not from the offload tier"
            message = f"{hits} although between_turns {how} drops that cache ({what}; limit {limit:.0%})"
        return Finding(gate="reset_missed", **located, message=message)
    any_share = ((stats.gpu_hits or 0.0) + (stats.external_hits or 0.0)) / prompt
    tier_share = (stats.external_hits or 0.0) / prompt
    if not profile.offload_enabled and tier_share > limit:
        # the reset worked; the hits are an offload tier's that the arm was not declared to have
        declare = tier_declaration(command, stats.arm, index, UNDECLARED_TIER_PROFILE)
        return Finding(
            gate="off_arm_hits",
            **located,
            message=f"{where}: {tier_share:.0%} of prompt tokens came from an offload tier (external prefix-cache "
            f"hits) but the arm declares none (offload {profile.name}); declare the endpoint's tier: {declare} "
            f"(limit {limit:.0%})",
        )
    if not profile.offload_enabled and any_share > limit:
        return Finding(
            gate="off_arm_hits",
            **located,
            message=f"{where}: an arm without offload tiers served {any_share:.0%} of prompt tokens from a cache "
            f"(between_turns {how} did not make turn 2 a returning user; limit {limit:.0%})",
        )
    if (
        profile.offload_enabled
        and stats.context_tokens >= profile.chunk_tokens
        and stats.external_hits is not None
        and stats.external_hits <= 0
    ):
        return Finding(
            gate="no_offload_hits",
            **located,
            message=f"{where}: no prompt token came from the offload tier (external prefix hits 0), so this "
            "arm did not measure offloading",
        )
    return None


def stats_key(finding: Finding) -> tuple[str, int, int]:
    return (finding.arm or "", finding.context_tokens or 0, finding.turn or 0)


def judge_probe(
    scenario: Scenario,
    counts: RequestCounts,
    cells: Sequence[TtftCell],
    cache: Sequence[CacheStats],
    restarts: Mapping[str, int],
    moved_cells: Set[tuple[str, int, int]] = frozenset(),
    command: Sequence[str] = (),
    methods: Mapping[str, BetweenTurnsMethod] | None = None,
) -> Validity:
    """Every gate of a probe run (``restarts``: engine restarts seen per arm in the chosen attempts).

    ``moved_cells``: (arm, context, turn) cells of a fleet whose every request landed on another
    replica than its previous turn; a per-replica tier cannot serve them, so the offload-hit gate
    skips them (the fleet report's same-vs-moved split is the measurement there). ``command``: the run's command
    line (the manifest's), which says how an arm's offload tier is declared. ``methods``: arm -> what ran
    between its turns (named in the cache gates' messages under mode ``auto``).
    """
    spec = scenario.validity
    findings = error_findings(counts.measured, counts.ok, counts.errors_by_kind, spec.max_error_rate)
    findings += _cell_findings(cells)
    findings += [
        f
        for f in (_cache_finding(scenario, stats, command, (methods or {}).get(stats.arm)) for stats in cache)
        if f is not None and not (f.gate == "no_offload_hits" and (stats_key(f) in moved_cells))
    ]
    findings += [
        Finding(
            gate="engine_restarted",
            arm=arm,
            message=f"{arm}: the engine restarted {count} time(s) mid-arm (its counters went down or its start "
            "time moved); the arm's caches were lost",
        )
        for arm, count in sorted(restarts.items())
        if count > 0
    ]
    return Validity(
        verdict=verdict_of(findings),
        error_rate=(counts.errors / counts.measured) if counts.measured else None,
        max_error_rate=spec.max_error_rate,
        errors_by_kind=dict(counts.errors_by_kind),
        findings=findings,
    )


def with_engines_down(validity: Validity, downs: Sequence[EngineDown], last_attempt: int) -> Validity:
    """``validity`` with an ``engine_died`` finding for each arm whose engine died in the last attempt."""
    findings = [
        Finding(
            gate="engine_died",
            arm=down.arm,
            message=f"{down.arm}: {down.reason}{f' while {down.during}' if down.during else ''}; the arm ended there",
        )
        for down in downs
        if down.attempt == last_attempt
    ]
    if not findings:
        return validity
    every = [*validity.findings, *findings]
    return validity.model_copy(update={"findings": every, "verdict": verdict_of(every)})


def judge_errors(measured: int, ok: int, errors_by_kind: Mapping[str, int], max_error_rate: float) -> Validity:
    """The error gates alone (load runs: ``kvbench sweep``)."""
    findings = error_findings(measured, ok, errors_by_kind, max_error_rate)
    return Validity(
        verdict=verdict_of(findings),
        error_rate=((measured - ok) / measured) if measured else None,
        max_error_rate=max_error_rate,
        errors_by_kind=dict(errors_by_kind),
        findings=findings,
    )


COUNTER_CACHE_GATES = frozenset({"reset_missed", "off_arm_hits"})


def with_reset_unavailable(
    validity: Validity,
    unavailable: Mapping[str, str],
    cells: Sequence[TtftCell],
    cache: Sequence[CacheStats],
    max_reset_hit_rate: float,
) -> Validity:
    """``validity`` judged for the arms whose engine could not reset its prefix cache (``unavailable``: arm -> why)."""
    findings: list[Finding] = []
    judged: list[Finding] = []
    told: set[str] = set()
    for found in validity.findings:  # an arm's first counter finding says why it had no reset and what would fix it
        arm = found.arm
        if arm is not None and arm in unavailable and arm not in told and found.gate in COUNTER_CACHE_GATES:
            told.add(arm)
            found = found.model_copy(update={"message": f"{found.message}; {unavailable[arm]}"})
        judged.append(found)
    for arm, why in sorted(unavailable.items()):
        if any(s.arm == arm and s.turn >= 2 and (s.prompt_tokens or s.gpu_queries) for s in cache):
            continue  # the engine's counters judge its later turns (reset_missed, off_arm_hits)
        later = [c for c in cells if c.arm == arm and c.turn >= 2 and c.cached_tokens_median is not None]
        if not later:
            findings.append(
                Finding(
                    gate="reset_unavailable",
                    arm=arm,
                    message=f"{arm}: {why}, and the endpoint reports no cache counters (/metrics) or usage "
                    "cached_tokens, so whether turn 2 hit the GPU prefix cache is unknown",
                )
            )
            continue
        for cell in later:
            prompt = cell.prompt_tokens_median or 0.0
            share = (cell.cached_tokens_median or 0.0) / prompt if prompt else 0.0
            if share > max_reset_hit_rate:
                findings.append(
                    Finding(
                        gate="reset_missed",
                        arm=arm,
                        context_tokens=cell.context_tokens,
                        turn=cell.turn,
                        message=f"{arm} {cell.context_tokens} tokens turn {cell.turn}: {share:.0%} of prompt tokens "
                        f"were cached (usage cached_tokens) and the endpoint cannot reset its prefix cache (limit "
                        f"{max_reset_hit_rate:.0%}); {why}",
                    )
                )
    if not findings and judged == validity.findings:
        return validity
    every = [*judged, *findings]
    return validity.model_copy(update={"findings": every, "verdict": verdict_of(every)})


def client_limits(point: PointResult, spec: ValiditySpec) -> list[str]:
    """Why the client limited ``point``, each with its figure and limit (empty: it kept up, or was not measured)."""
    client = point.client
    if client is None:
        return []
    reasons: list[str] = []
    delay = client.loop_delay_p99_ms
    if delay is not None and delay > spec.max_client_loop_delay_ms:
        reasons.append(f"event-loop delay p99 {delay:.0f} ms > {spec.max_client_loop_delay_ms:g} ms")
    lag = client.send_lag_p99_ms
    if lag is not None and lag > spec.max_client_send_lag_ms:
        # a wait for a free session is part of the send lag: name it, it is fixed by another setting
        slots = (
            f" ({client.slot_waits} arrivals waited for a free session, p99 {client.slot_wait_p99_ms or 0:.0f} ms: "
            "raise sweep.max_active_users)"
            if client.slot_waits
            else ""
        )
        reasons.append(f"send lag p99 {lag:.0f} ms > {spec.max_client_send_lag_ms:g} ms{slots}")
    cpu = client.cpu_fraction
    if cpu is not None and cpu >= spec.max_client_cpu:
        reasons.append(f"a client process used {cpu:.2f} of a core >= {spec.max_client_cpu:g}")
    return reasons


def with_client_limited(validity: Validity, points: Sequence[PointResult], spec: ValiditySpec) -> Validity:
    """``validity`` with a ``client_limited`` finding for each load point the client limited."""
    findings: list[Finding] = []
    for point in points:
        reasons = client_limits(point, spec)
        if reasons:
            unit = "users" if point.mode == "concurrency" else "req/s"
            findings.append(
                Finding(
                    gate="client_limited",
                    arm=point.arm,
                    message=f"{point.arm} @ {point.load:g} {unit}: client-limited: {'; '.join(reasons)}",
                )
            )
    if not findings:
        return validity
    every = [*validity.findings, *findings]
    return validity.model_copy(update={"findings": every, "verdict": verdict_of(every)})


def turn1_hit_share(stats: CacheStats) -> float | None:
    """``(gpu + external hits) / prompt tokens`` of a turn-1 cell; None without the counters."""
    prompt = stats.prompt_tokens or stats.gpu_queries
    if stats.turn != 1 or not prompt or (stats.gpu_hits is None and stats.external_hits is None):
        return None
    return ((stats.gpu_hits or 0.0) + (stats.external_hits or 0.0)) / prompt


def with_warm_turn1(validity: Validity, cache: Sequence[CacheStats], max_turn1_hit_rate: float) -> Validity:
    """``validity`` with a ``warm_turn1`` finding for each turn-1 cell whose hit share passes the limit (for runs
    whose prompts are salted per run: such a turn 1 should find no KV but the shared system prompt's)."""
    findings: list[Finding] = []
    for stats in cache:
        share = turn1_hit_share(stats)
        if share is None or share <= max_turn1_hit_rate:
            continue
        findings.append(
            Finding(
                gate="warm_turn1",
                arm=stats.arm,
                context_tokens=stats.context_tokens,
                turn=1,
                message=f"{stats.arm} {stats.context_tokens} tokens turn 1: {share:.0%} of prompt tokens were cache "
                f"hits (GPU {stats.gpu_hits or 0:.0f}, offload tier {stats.external_hits or 0:.0f} of "
                f"{stats.prompt_tokens or stats.gpu_queries or 0:.0f}) although the run's prompts are its own, so "
                f"turn 1 did not start cold (limit validity.max_turn1_hit_rate {max_turn1_hit_rate:.0%})",
            )
        )
    if not findings:
        return validity
    every = [*validity.findings, *findings]
    return validity.model_copy(update={"findings": every, "verdict": verdict_of(every)})
