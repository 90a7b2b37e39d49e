"""Every engine session writes its disk and shared tiers' KV into its own new subdirectory, removed at its end.

Real processes: the spine's :meth:`Runner.arm_session` starts two-replica vLLM fleets made of the
stand-in ``vllm`` and ``lmcache`` packages of ``tests/unit/engines/test_render_vllm.py`` (real
servers, real health checks, the real LMCache server command line kvbench builds), and a real
simulator. What is checked is what a measurement's validity rests on: turn 1 of an arm can only
find KV its own session wrote, whatever an earlier arm or engine start left under the same path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.runs.probe import ProbeRunner
from harness.scenario.spec import Scenario, parse_scenario
from harness.store.manifest import Manifest
from harness.store.records import RecordWriter
from harness.store.rundir import RunDir
from tests.scenarios import stand_in_vllm
from tests.unit.engines.test_render_vllm import install_fake_vllm


def fleet_scenario(tmp_path: Path, shared: Path, disk: Path, *, fresh: bool = True) -> Scenario:
    cpu = {"kind": "cpu", "capacity_gb": 0.5}
    disk_tier = {"kind": "disk", "capacity_gb": 10, "path": str(disk), "fresh_per_arm": fresh}
    shared_tier = {"kind": "shared", "capacity_gb": 10, "path": str(shared), "fresh_per_arm": fresh}
    both = [cpu, disk_tier, shared_tier]
    return parse_scenario(
        {
            "name": "tier scope",
            "engine": stand_in_vllm(tmp_path / "tiny", device="cpu", replicas=2, startup_timeout_s=30, stop_grace_s=5),
            "arms": [
                {"name": "shared-rr", "offload": {"name": "sh", "backend": "lmcache-mp", "tiers": both}},
                {"name": "own-rr", "offload": {"name": "own", "backend": "lmcache-mp", "tiers": [cpu, disk_tier]}},
            ],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000]},
        },
        "test",
    )


def server_adapters(record: Path) -> list[Path]:
    """The ``--l2-adapter`` base paths the (one) stand-in LMCache server was started with."""
    argv = record.read_text().split()
    return [Path(json.loads(argv[i + 1])["base_path"]) for i, arg in enumerate(argv) if arg == "--l2-adapter"]


def children(path: Path) -> set[str]:
    return {child.name for child in path.iterdir()}


async def test_arm_sessions_get_fresh_tier_directories_and_remove_only_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_vllm(tmp_path, monkeypatch)
    shared, disk = tmp_path / "mnt-shared", tmp_path / "nvme"
    shared.mkdir()  # a shared tier's base is a mount: it must exist; a disk tier's is created
    (shared / "users-own-file").write_text("not kvbench's")
    scenario = fleet_scenario(tmp_path, shared, disk)
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    runner = ProbeRunner(scenario, run_dir)
    manifest = Manifest.start(run_dir.manifest_file, scenario, None, runner.attempt)
    shared_arm, own_arm = scenario.arms
    sessions: list[str] = []
    with RecordWriter(run_dir.records_file) as writer:
        # arm 1: the fleet's one LMCache server holds the shared tier (and the disk tier) for both replicas
        async with runner.arm_session(shared_arm, writer, manifest):
            disk_dir, shared_dir = server_adapters(tmp_path / "lmcache-record.txt")
            session = shared_dir.name
            assert shared_dir == shared / session and disk_dir == disk / session / "shared-server"
            assert session.startswith("kvbench-") and "shared-rr" in session
            assert shared_dir.is_dir() and disk_dir.is_dir() and not any(shared_dir.iterdir())
            details = manifest.data["engines"]["shared-rr"]["details"]
            assert f"shared tier directory {shared_dir}" in details["shared_tier"]
            assert f"disk tier directory {disk_dir}" in details["shared_tier"]
            ports = {
                json.loads(command.split("--kv-transfer-config ")[1].split()[0])["kv_connector_extra_config"][
                    "lmcache.mp.port"
                ]
                for command in (details["replica_0_command"], details["replica_1_command"])
            }
            assert len(ports) == 1  # both replicas connect to the one server
            assert not (disk / session / "replica-0").exists()  # a replica of a shared server has no disk of its own
            (shared_dir / "chunk-0.kv").write_text("KV of arm shared-rr")  # what the server would have stored
            sessions.append(session)
        assert children(shared) == {"users-own-file"} and children(disk) == set()
        assert (shared / "users-own-file").read_text() == "not kvbench's"

        # arm 2: a server per replica; each replica's disk tier in its own directory
        async with runner.arm_session(own_arm, writer, manifest):
            (session,) = children(disk)
            assert children(disk / session) == {"replica-0", "replica-1"}
            details = manifest.data["engines"]["own-rr"]["details"]
            assert f"disk tier directory {disk / session / 'replica-0'}" in details["notes"]
            assert f"disk tier directory {disk / session / 'replica-1'}" in details["replica_1_notes"]
            assert children(shared) == {"users-own-file"}  # this arm has no shared tier
            sessions.append(session)
        assert children(disk) == set()

        # arm 1 again (an interleaved probe's next engine start): a new, empty shared directory
        async with runner.arm_session(shared_arm, writer, manifest):
            _, shared_dir = server_adapters(tmp_path / "lmcache-record.txt")
            assert shared_dir.parent == shared and shared_dir.name not in sessions
            assert not any(shared_dir.iterdir())  # the KV of the first session is gone, not found in turn 1
            sessions.append(shared_dir.name)
    assert len(set(sessions)) == 3
    assert children(shared) == {"users-own-file"} and children(disk) == set()


async def test_opting_out_attaches_to_the_path_as_given_and_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_vllm(tmp_path, monkeypatch)
    shared, disk = tmp_path / "warm-shared", tmp_path / "nvme"
    shared.mkdir()
    (shared / "chunk-0.kv").write_text("KV a user warmed on purpose")
    scenario = fleet_scenario(tmp_path, shared, disk, fresh=False)
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    runner = ProbeRunner(scenario, run_dir)
    manifest = Manifest.start(run_dir.manifest_file, scenario, None, runner.attempt)
    with RecordWriter(run_dir.records_file) as writer:
        async with runner.arm_session(scenario.arms[0], writer, manifest):
            assert server_adapters(tmp_path / "lmcache-record.txt") == [disk, shared]
            details = manifest.data["engines"]["shared-rr"]["details"]
            assert f"shared tier directory {shared} used as given (fresh_per_arm: false)" in details["shared_tier"]
    assert children(shared) == {"chunk-0.kv"} and disk.is_dir()


async def test_an_engine_without_tier_paths_creates_no_directories(tmp_path: Path) -> None:
    disk = tmp_path / "nvme"
    p = str(disk)
    scenario = parse_scenario(
        {
            "name": "sim tiers",
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
            "arms": [
                {
                    "name": "disk",
                    "offload": {
                        "name": "d",
                        "tiers": [{"kind": "cpu", "capacity_gb": 16}, {"kind": "disk", "capacity_gb": 64, "path": p}],
                    },
                }
            ],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000]},
        },
        "test",
    )
    run_dir = RunDir.create(tmp_path / "runs", scenario)
    runner = ProbeRunner(scenario, run_dir)
    manifest = Manifest.start(run_dir.manifest_file, scenario, None, runner.attempt)
    with RecordWriter(run_dir.records_file) as writer:
        async with runner.arm_session(scenario.arms[0], writer, manifest) as session:
            assert (await session.scrape()) is not None  # a real, running simulator
            assert not disk.exists()  # the simulator models its disk tier; it writes nothing there
    assert not disk.exists()
