"""The ``client_limited`` gate: a load point whose client fell behind its own schedule is INCONCLUSIVE with the
figure and the limit it passed, never VALID; a point that kept up, or one stored before the client measured
itself, is not judged by it."""

from __future__ import annotations

from harness.client.fidelity import LoopLag
from harness.results.sweep_result import PointResult
from harness.results.validity import client_limits, judge_errors, with_client_limited
from harness.scenario.spec import ValiditySpec
from harness.store.events import ClientLag

MS = 1_000_000
SPEC = ValiditySpec()


def loop(delay_p99_ms: float, cpu: float, role: str = "runner") -> LoopLag:
    wall = 10_000 * MS
    return LoopLag(
        pid=1,
        role="runner" if role == "runner" else "worker",
        ticks=900,
        delay_p99_ns=int(delay_p99_ms * MS),
        delay_max_ns=int(delay_p99_ms * 2 * MS),
        cpu_ns=int(cpu * wall),
        wall_ns=wall,
    )


def client(send_lags_ms: list[float], *loops: LoopLag, slot_waits_ms: tuple[float, ...] = ()) -> ClientLag:
    return ClientLag.of([int(v * MS) for v in send_lags_ms], [int(v * MS) for v in slot_waits_ms], loops)


def point(lag: ClientLag | None, load: float = 8, mode: str = "concurrency") -> PointResult:
    nothing = dict.fromkeys(
        "tps_user_mean tps_user_p50 ttft ttft_round1 ttft_later tpot itl e2e goodput_rps goodput_rps_per_gpu "
        "slo_attainment meets_slo prompt_tokens_mean prompt_tokens_round1_mean prompt_tokens_later_mean "
        "output_tokens_mean cached_share cached_share_later gpu_hit_rate external_hit_rate hit_rate "
        "lag_p99_ms".split()
    )
    return PointResult.model_validate(
        {
            **nothing,
            "arm": "ON",
            "point": 0,
            "load": load,
            "mode": mode,
            "gpus": 1,
            "window_s": 10.0,
            "sent": 100,
            "measured": 100,
            "ok": 100,
            "errors": 0,
            "rps": 10.0,
            "rps_per_gpu": 10.0,
            "output_tps": 100.0,
            "output_tps_per_gpu": 100.0,
            "client": lag,
        }
    )


def test_a_client_that_kept_up_passes() -> None:
    lag = client([1.0] * 99 + [4.0], loop(2.0, 0.3))
    assert lag.send_lag_p99_ms == 1.0 and lag.send_lag_max_ms == 4.0
    validity = with_client_limited(judge_errors(100, 100, {}, 0.05), [point(lag)], SPEC)
    assert validity.verdict == "valid" and not validity.findings


def test_a_late_event_loop_makes_the_point_inconclusive_with_its_figure() -> None:
    lag = client([1.0] * 100, loop(2.0, 0.2), loop(37.0, 0.5, role="worker"))
    assert lag.loop_delay_p99_ms == 37.0  # the worst process's
    validity = with_client_limited(judge_errors(100, 100, {}, 0.05), [point(None), point(lag)], SPEC)
    assert validity.verdict == "inconclusive" and validity.exit_code == 3
    (finding,) = validity.findings
    assert finding.gate == "client_limited" and finding.arm == "ON"
    assert finding.message == "ON @ 8 users: client-limited: event-loop delay p99 37 ms > 25 ms"


def test_send_lag_names_the_session_budget_when_arrivals_waited() -> None:
    lag = client([400.0] * 50, loop(1.0, 0.1), slot_waits_ms=(300.0, 420.0))
    (reason,) = client_limits(point(lag, load=40, mode="qps"), SPEC)
    assert reason.startswith("send lag p99 400 ms > 50 ms (2 arrivals waited for a free session, p99 420 ms")
    assert "sweep.max_active_users" in reason


def test_a_saturated_core_is_client_limited_and_the_limits_come_from_the_config() -> None:
    lag = client([1.0], loop(1.0, 0.95))
    assert client_limits(point(lag), SPEC) == ["a client process used 0.95 of a core >= 0.9"]
    lenient = ValiditySpec(max_client_cpu=1.0, max_client_loop_delay_ms=50, max_client_send_lag_ms=500)
    assert client_limits(point(client([400.0], loop(37.0, 0.95))), lenient) == []
    failed = with_client_limited(judge_errors(100, 0, {"timeout": 100}, 0.05), [point(lag)], SPEC)
    assert failed.verdict == "failed"  # a failing gate still wins over an inconclusive one
