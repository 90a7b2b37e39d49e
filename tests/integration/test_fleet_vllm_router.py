"""A real router kvbench starts in front of its replicas: the vLLM Router (PyPI ``vllm-router``).

Two ``kvbench sim serve`` replicas (real processes, started by kvbench as the fleet of one arm),
then ``vllm-router`` from its own virtualenv (``$KVBENCH_ROUTER_PYTHON``, made by
``scripts/install-router.sh``) pointed at them; kvbench sends every request to the router and
learns the serving replica from per-replica ``/metrics`` deltas (the router names it nowhere in
its response). Two arms:

* ``consistent_hash`` (the router's session affinity, keyed on the ``X-Session-ID`` header kvbench
  fills with the conversation id): every turn 2 lands on its turn-1 replica. The router's own log
  line per decision (``key=... -> worker=...``) is read back and must name, for every request, the
  replica kvbench attributed it to -- an account independent of kvbench's counters;
* ``round_robin``: the probe sends a turn's conversations one after another, so with an odd
  number of conversations turn 2 of conversation ``i`` is ``N`` requests after its turn 1 and
  lands on the other replica of two: every turn 2 moved (parity, computed from N below).

Afterwards the router and replicas are gone: their ports are free again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.engines.process import port_busy
from harness.runs.probe import ProbeRunner
from harness.runs.spine import run_sync
from harness.scenario.spec import parse_scenario
from harness.store.rundir import RunDir
from tests import support

pytestmark = [pytest.mark.integration, pytest.mark.router]
CONVERSATIONS = 5
ANSI = re.compile(r"\x1b\[[0-9;]*m")
DECISION = re.compile(
    r"Consistent hash routing: key='header:x-session-id:(?P<key>[^']+)' -> worker='(?P<worker>[^']+)'"
)


def scenario_for(python: str) -> dict[str, object]:
    def router(policy: str) -> dict[str, object]:
        return {"policy": "external", "router": {"kind": "vllm-router", "policy": policy, "python": python}}

    return {
        "name": "fleet-vllm-router", "seed": 5,
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2},
        "arms": [
            {"name": "VR-session", "offload": "cpu", "routing": router("consistent_hash")},
            {"name": "VR-rr", "offload": "cpu", "routing": router("round_robin")},
        ],
        "workload": {
            "kind": "multi_round_qa", "context_tokens": [4000], "conversations": CONVERSATIONS, "turns": 2,
            "question_tokens": 16, "answer_tokens": 8, "between_turns": {"mode": "reset_prefix_cache"},
        },
    }  # fmt: skip


def test_vllm_router_session_and_round_robin(tmp_path: Path) -> None:
    python = support.router_python()
    assert python is not None  # the router tier hook skipped the test otherwise
    scenario = parse_scenario(scenario_for(python), "inline")
    run_dir = RunDir.create(tmp_path, scenario)
    run_sync(ProbeRunner(scenario, run_dir))

    records = [r for r in run_dir.records() if r.phase == "measure"]
    assert len(records) == 2 * 2 * CONVERSATIONS and all(r.ok for r in records)
    assert all(r.replica in (0, 1) for r in records), "every sequential request is attributed from /metrics deltas"
    engines = json.loads(run_dir.manifest_file.read_text())["engines"]

    # consistent_hash on X-Session-ID: turn 2 never moves, and the router's own log agrees with kvbench
    session = [r for r in records if r.arm == "VR-session"]
    assert all(r.moved is False for r in session if r.turn == 2)
    details = engines["VR-session"]["details"]
    assert details["router"].startswith("vLLM Router") and details["attribution"] == "metrics"
    worker_index = {details[f"replica_{i}_base_url"].rstrip("/"): i for i in range(2)}
    log = ANSI.sub("", (run_dir.log_dir("VR-session") / "router.log").read_text())
    decisions = [(m["key"], worker_index[m["worker"].rstrip("/")]) for m in DECISION.finditer(log)]
    measured = [(f"0:4000:{r.conversation}", r.replica) for r in sorted(session, key=lambda r: r.started_ns)]
    assert decisions == measured  # warm-up requests carry no session id: the router logs them with a body key
    # which replica a key hashes to depends on the replicas' (free, random) ports, so all five may land on one:
    # the round-robin arm below is the one that must attribute requests to both

    # round robin: with an odd number of conversations every turn 2 lands on the other replica
    rr = [r for r in records if r.arm == "VR-rr"]
    first = {r.conversation: r.replica for r in rr if r.turn == 1}
    assert list(first.values()).count(0) in (CONVERSATIONS // 2, CONVERSATIONS // 2 + 1)  # alternating
    expect_moved = CONVERSATIONS % 2 == 1
    for record in (r for r in rr if r.turn == 2):
        assert record.moved is expect_moved
        assert record.replica != first[record.conversation]
    assert engines["VR-rr"]["details"]["router_policy"] == "round_robin"

    # the router and the replicas were stopped with the arm: their ports are free again
    for arm in ("VR-session", "VR-rr"):
        command = engines[arm]["details"]["router_command"].split()
        router_port = int(command[command.index("--port") + 1])
        ports = [router_port, *(urlsplit(url).port for url in worker_index)] if arm == "VR-session" else [router_port]
        assert not any(port_busy(port) for port in ports if port is not None)
