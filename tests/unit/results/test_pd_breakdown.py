"""The P/D TTFT breakdown and transfer physics (:mod:`harness.results.pd_breakdown`): a consistent group whose parts
are known sums to the client's TTFT with no flag; each kind of broken input is flagged."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from harness.results.pd_breakdown import (
    Geometry,
    Group,
    PdBreakdownResult,
    PhaseLine,
    breakdown,
    build,
    join,
    read_phase_log,
    union_seconds,
)
from harness.store.records import RequestRecord
from reports.pd import flag_lines, render_markdown, transfer_rows, ttft_rows

MS = 1_000_000
BYTES_PER_TOKEN = 131072.0  # Llama-3.1-8B, bf16
TOKENS = 1000
STARTS_MS = (0, 10, 20)
# per request, ms: client -> proxy, proxy hop, prefill leg, proxy hop, decode leg, first byte -> client's token
TO_PROXY, HOP, PREFILL_LEG, DECODE_LEG, BACK = 1.0, 0.5, 40.0, 30.0, 2.0
TTFT = TO_PROXY + HOP + PREFILL_LEG + HOP + DECODE_LEG + BACK
# engine histograms, means per request in ms, and NIXL's transfer time per request
P_QUEUE, P_PREFILL, D_QUEUE, D_PREFILL, XFER = 5.0, 30.0, 3.0, 25.0, 10.0


def record(start_ms: float, ttft_ms: float = TTFT) -> RequestRecord:
    return RequestRecord(
        arm="PD",
        attempt=0,
        phase="measure",
        repetition=0,
        context_tokens=TOKENS,
        conversation=0,
        turn=2,
        request_id=f"r{start_ms}",
        api="chat",
        started_ns=int(start_ms * MS),
        ttft_ns=int(ttft_ms * MS),
        e2e_ns=int((ttft_ms + 100) * MS),
        ok=True,
        http_status=200,
    )


def line(start_ms: float) -> PhaseLine:
    received = start_ms + TO_PROXY
    prefill_answered = received + HOP + PREFILL_LEG
    decode_sent = prefill_answered + HOP
    first = decode_sent + DECODE_LEG
    return PhaseLine(
        received_ns=int(received * MS),
        prefill_sent_ns=int((received + HOP) * MS),
        prefill_answered_ns=int(prefill_answered * MS),
        decode_sent_ns=int(decode_sent * MS),
        decode_first_byte_ns=int(first * MS),
        done_ns=int((first + 100) * MS),
    )


def metrics(
    requests: int = len(STARTS_MS), *, bytes_factor: float = 1.0, d_prefill: float = D_PREFILL
) -> dict[str, float]:
    return {
        "pd_prefill_queue_seconds": requests * P_QUEUE / 1000,
        "pd_prefill_queued": requests,
        "pd_prefill_seconds": requests * P_PREFILL / 1000,
        "pd_prefilled": requests,
        "pd_decode_queue_seconds": requests * D_QUEUE / 1000,
        "pd_decode_queued": requests,
        "pd_decode_prefill_seconds": requests * d_prefill / 1000,
        "pd_decode_prefilled": requests,
        "kv_transfer_seconds": requests * XFER / 1000,
        "kv_transfers": requests,
        "kv_transfer_bytes": bytes_factor * requests * TOKENS * BYTES_PER_TOKEN,
        "kv_transfer_descriptors": requests * 32.0,
        "pd_transferred_tokens": requests * TOKENS,
    }


GEOMETRY = Geometry(kv_bytes_per_token=BYTES_PER_TOKEN, block_size=16, link_gbps=900.0)


def group(values: dict[str, float], ttft_ms: float = TTFT) -> Group:
    return Group("PD", "1000 tok, turn 2", [record(start, ttft_ms) for start in STARTS_MS], values)


def test_known_parts_sum_to_the_clients_ttft_unflagged() -> None:
    lines = [line(start) for start in STARTS_MS]
    row = breakdown(group(metrics()), lines, GEOMETRY)
    assert row is not None and row.matched == row.requests == 3
    parts = row.parts
    assert parts.to_proxy_ms == pytest.approx(TO_PROXY)
    assert parts.proxy_ms == pytest.approx(2 * HOP)
    assert (parts.prefill_queue_ms, parts.prefill_ms) == pytest.approx((P_QUEUE, P_PREFILL))
    assert parts.prefill_other_ms == pytest.approx(PREFILL_LEG - P_QUEUE - P_PREFILL)
    assert (parts.decode_admission_ms, parts.kv_transfer_ms) == pytest.approx((D_QUEUE, XFER))
    assert parts.first_token_ms == pytest.approx(D_PREFILL - XFER)
    assert parts.decode_other_ms == pytest.approx(DECODE_LEG - D_QUEUE - D_PREFILL)
    assert parts.back_to_client_ms == pytest.approx(BACK)
    assert parts.total_ms() == pytest.approx(row.client_ttft_ms) and row.client_ttft_ms == pytest.approx(TTFT)
    assert row.flags == []
    kv = row.transfer
    assert kv is not None and kv.expected_bytes == pytest.approx(kv.bytes)
    moved = 3 * TOKENS * BYTES_PER_TOKEN
    # the decode legs [42, 72], [52, 82], [62, 92] ms overlap: their union is 50 ms, their sum 90
    assert kv.union_s == pytest.approx(0.050)
    assert kv.gbps_union == pytest.approx(moved / 0.050 / 1e9)
    assert kv.gbps_vllm == pytest.approx(moved / (3 * XFER / 1000) / 1e9)


@pytest.mark.parametrize(
    ("values", "ttft_ms", "geometry", "flagged"),
    [
        (metrics(bytes_factor=10.0), TTFT, GEOMETRY, "bytes moved for 3000 tokens"),
        (metrics(bytes_factor=0.0), TTFT, GEOMETRY, "NIXL reports no bytes"),
        (metrics(), TTFT, Geometry(BYTES_PER_TOKEN, 16, link_gbps=5.0), "above the link's 5 GB/s"),
        (metrics(), TTFT + 20.0, GEOMETRY, "the proxy's first byte and the client's TTFT differ"),
        (metrics(d_prefill=60.0), TTFT, GEOMETRY, "decode other is -33.0 ms"),
        ({key: value for key, value in metrics().items() if not key.startswith("kv_")}, TTFT, GEOMETRY, "no NIXL"),
    ],
)
def test_a_broken_input_is_flagged(values: dict[str, float], ttft_ms: float, geometry: Geometry, flagged: str) -> None:
    row = breakdown(group(values, ttft_ms), [line(start) for start in STARTS_MS], geometry)
    assert row is not None
    assert any(flagged in flag for flag in row.flags), row.flags
    result = PdBreakdownResult(scenario="s", tolerance_ms=5.0, tolerance_fraction=0.05, rows=[row])
    assert flag_lines(result) and "## Flagged" in render_markdown(result)


def test_a_line_outside_a_records_ttft_is_not_joined() -> None:
    stale = line(-500)  # an earlier engine session's request
    records = [record(start) for start in STARTS_MS]
    pairs = join(records, [stale, *(line(start) for start in STARTS_MS)])
    assert [pair[1] for pair in pairs] == [line(start) for start in STARTS_MS]
    assert join(records, [stale]) == []
    assert breakdown(group(metrics()), [stale], GEOMETRY) is None


def test_union_of_intervals() -> None:
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)  # [0, 20] and [30, 40]


def test_the_report_shows_every_part_and_both_rates() -> None:
    row = breakdown(group(metrics()), [line(start) for start in STARTS_MS], GEOMETRY)
    assert row is not None
    result = build("s", {"PD": ([group(metrics())], [line(start) for start in STARTS_MS], GEOMETRY)})
    assert result.rows == [row]
    (texts,) = ttft_rows(result)
    assert texts[:4] == ["PD", "1000 tok, turn 2", "3/3", f"{TTFT:.1f}"] and texts[-1] == "no"
    (transfer,) = transfer_rows(result)
    assert transfer[7] == f"{3 * TOKENS * BYTES_PER_TOKEN / 0.03 / 1e9:,.2f}"
    markdown = render_markdown(result)
    assert "## Where TTFT goes (ms)" in markdown and "## KV transfers (NIXL)" in markdown
    assert "## Flagged" not in markdown


def test_the_phase_log_reads_plain_or_packed_and_skips_a_cut_line(tmp_path: Path) -> None:
    lines = [line(start) for start in STARTS_MS]
    text = "".join(item.model_dump_json() + "\n" for item in lines) + '{"received_ns": 12'  # cut by a kill
    plain = tmp_path / "plain" / "pd-proxy.jsonl"
    plain.parent.mkdir()
    plain.write_text(text, encoding="utf-8")
    packed = tmp_path / "packed" / "pd-proxy.jsonl"
    packed.parent.mkdir()
    packed.with_name("pd-proxy.jsonl.xz").write_bytes(lzma.compress(text.encode()))
    assert read_phase_log(plain) == read_phase_log(packed) == lines
    assert read_phase_log(tmp_path / "none.jsonl") == []
