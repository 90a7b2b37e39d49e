"""A fleet behind a router kvbench does not control, measured from flags: replicas named by a response header.

Two ``kvbench sim serve`` replicas behind :func:`tests.fakes.header_router.header_router` (stdlib, round
robin, the chosen replica's name in ``x-served-by``), as a cluster's router in front of its pods.
``kvbench run --base-url ROUTER/v1`` with ``--set routing.policy=external``, ``--set
routing.replica_header=x-served-by`` and the replicas' names (``engine.endpoints``) must store in every
record the replica the router chose, in the router's order, ``moved`` from that, and say in the
manifest how the replica was learnt. A header value no endpoint names leaves the replica unattributed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.header_router import header_router
from tests.support import SimulatorLauncher, kvbench

pytestmark = pytest.mark.integration

SERVE = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--host", "127.0.0.1")
HEADER = "x-served-by"


def run_behind_router(tmp_path: Path, router_url: str, listed: str) -> tuple[list[dict[str, object]], str]:
    done = kvbench(
        "run",
        "--base-url",
        f"{router_url}/v1",
        "--contexts",
        "1000",
        "--conversations",
        "3",
        "--answer-tokens",
        "4",
        "--set",
        "routing.policy=external",
        "--set",
        f"routing.replica_header={HEADER}",
        "--set",
        f"engine.endpoints={listed}",
        "-o",
        str(tmp_path / "runs"),
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    records = [record for record in map(json.loads, lines) if record["phase"] == "measure"]
    return records, (run_dir / "manifest.json").read_text()


def replica(record: dict[str, object]) -> int | None:
    value = record["replica"]
    assert value is None or isinstance(value, int), value
    return value


def test_records_carry_the_replica_the_router_named(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    names = ["pod-a", "pod-b"]
    with (
        simulator(*SERVE) as first,
        simulator(*SERVE) as second,
        header_router([first, second], names, HEADER) as router,
    ):
        records, manifest = run_behind_router(tmp_path, router.base_url, "[{name: pod-a}, {name: pod-b}]")
        chosen = router.chosen
    assert len(records) == 6
    served = [replica(record) for record in records]
    assert [None if index is None else names[index] for index in served] == chosen[-len(records) :]  # in order
    assert set(served) == {0, 1}
    first_turn = {record["conversation"]: replica(record) for record in records if record["turn"] == 1}
    for record in (record for record in records if record["turn"] == 2):
        assert record["moved"] is (replica(record) != first_turn[record["conversation"]])
    assert f'"attribution": "header {HEADER}"' in manifest


def test_a_name_no_endpoint_lists_stays_unattributed(tmp_path: Path, simulator: SimulatorLauncher) -> None:
    with (
        simulator(*SERVE) as first,
        simulator(*SERVE) as second,
        header_router([first, second], ["pod-a", "pod-x"], HEADER) as router,
    ):
        records, _ = run_behind_router(tmp_path, router.base_url, "[{name: pod-a}, {name: pod-b}]")
        chosen = router.chosen[-len(records) :]
    assert [replica(record) for record in records] == [0 if name == "pod-a" else None for name in chosen]
