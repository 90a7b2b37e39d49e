"""``arm_order``: the blocks the probe runner runs, fresh and on resume (real run directories on disk)."""

from __future__ import annotations

from pathlib import Path

from harness.runs.probe import ProbeRunner
from harness.scenario.spec import Scenario, parse_scenario
from harness.store.events import GroupDone
from harness.store.rundir import RunDir


def scenario(order: str) -> Scenario:
    return parse_scenario(
        {
            "name": "order",
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
            "arms": [{"name": "A", "offload": "off"}, {"name": "B", "offload": "cpu"}],
            "workload": {"kind": "multi_round_qa", "context_tokens": [1000, 2000]},
            "repetitions": 4,
            "arm_order": order,
        },
        "test",
    )


def names(runner: ProbeRunner) -> list[tuple[int | None, list[str]]]:
    return [(block, [arm.name for arm in arms]) for block, arms in runner.blocks()]


def test_sequential_is_one_block_of_every_arm(tmp_path: Path) -> None:
    runner = ProbeRunner(scenario("sequential"), RunDir.create(tmp_path, scenario("sequential")))
    assert names(runner) == [(None, ["A", "B"])]


def test_interleaved_is_abba_over_repetitions(tmp_path: Path) -> None:
    runner = ProbeRunner(scenario("interleaved"), RunDir.create(tmp_path, scenario("interleaved")))
    assert names(runner) == [(0, ["A", "B"]), (1, ["B", "A"]), (2, ["A", "B"]), (3, ["B", "A"])]


def test_interleaved_resume_skips_finished_groups_and_keeps_the_order(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path, scenario("interleaved"))
    for arm, repetition, context in [
        ("A", 0, 1000),
        ("A", 0, 2000),
        ("B", 0, 1000),
        ("B", 0, 2000),
        ("B", 1, 1000),
        ("B", 1, 2000),
        ("A", 1, 1000),
    ]:
        run_dir.mark_group_done(GroupDone(arm=arm, repetition=repetition, context_tokens=context, attempt=0))
    runner = ProbeRunner(scenario("interleaved"), run_dir)
    assert names(runner) == [(1, ["A"]), (2, ["A", "B"]), (3, ["B", "A"])]
    # block 1 of arm A has only the 2000-token group left
    assert runner._groups(runner.scenario.arms[0], 1) == [(1, 2000)]
