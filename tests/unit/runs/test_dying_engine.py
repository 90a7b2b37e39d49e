"""An engine on its way down: its port refuses before its process exits, and the arm still ends as a finding.

Seen on an H200: LMCache's asynchronous loading killed vLLM's engine core while kvbench built the next load
point's contexts; the API server refused ``/tokenize`` for a moment before its process exited, and the sweep
ended with exit 2 instead of recording ``engine_died`` and running the next arm.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

import pytest

from harness.engines.common import EngineRequestError
from harness.runs import spine
from harness.runs.spine import ArmSession, Runner, run_arm_or_record_death
from harness.store.events import EngineDown


@dataclass
class Arm:
    name: str = "ON"


@dataclass
class DyingSession:
    """Up for the first ``up_for`` questions, then exited."""

    up_for: int
    asked: int = 0
    arm: Arm = field(default_factory=Arm)

    async def engine_down(self) -> str | None:
        self.asked += 1
        return "the engine exited (code 1)" if self.asked > self.up_for else None

    async def engine_down_within(self, grace_s: float) -> str | None:
        return await ArmSession.engine_down_within(cast(ArmSession, self), grace_s)

    def sync(self) -> None:
        pass


@dataclass
class Stored:
    downs: list[EngineDown] = field(default_factory=list)

    def append_engine_down(self, event: EngineDown) -> None:
        self.downs.append(event)


@dataclass
class Progress:
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class RefusedRunner:
    attempt: int = 0
    run_dir: Stored = field(default_factory=Stored)
    progress: Progress = field(default_factory=Progress)

    async def run_arm(self, session: object) -> None:
        raise EngineRequestError("POST http://127.0.0.1:1/tokenize failed: ClientConnectorError: refused")


def run(runner: RefusedRunner, session: DyingSession) -> None:
    asyncio.run(run_arm_or_record_death(cast(Runner[object], runner), cast(ArmSession, session)))  # type: ignore[type-var]


def test_an_engine_that_exits_within_the_grace_ends_its_arm_as_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spine, "WATCH_S", 0.01)
    runner, session = RefusedRunner(), DyingSession(up_for=3)
    run(runner, session)
    (down,) = runner.run_dir.downs
    assert down.arm == "ON" and down.reason == "the engine exited (code 1)"
    assert down.during.startswith("POST http://127.0.0.1:1/tokenize failed")
    assert runner.progress.notes and "the arm ends here" in runner.progress.notes[0]


def test_an_error_while_the_engine_stays_up_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spine, "WATCH_S", 0.01)
    monkeypatch.setattr(spine, "DYING_GRACE_S", 0.05)
    runner = RefusedRunner()
    with pytest.raises(EngineRequestError, match="tokenize failed"):
        run(runner, DyingSession(up_for=10**6))
    assert not runner.run_dir.downs
