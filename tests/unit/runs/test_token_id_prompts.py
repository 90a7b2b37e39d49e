"""``prompt: token_ids``: what the probe runner builds for a turn, and what the arm session sends for it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from harness.runs.probe import ProbeRunner
from harness.runs.spine import ArmSession
from harness.scenario.spec import parse_scenario
from harness.sim.tokenizer import SimTokenizer
from harness.store.rundir import RunDir
from workloads.multi_round_qa import Conversation, ConversationState
from workloads.tokenizer import TokenIds


def runner(tmp_path: Path, **workload: str) -> ProbeRunner:
    spec: dict[str, object] = {"kind": "multi_round_qa", "context_tokens": [1000], **workload}
    scenario = parse_scenario(
        {
            "name": "ids",
            "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
            "arms": [{"name": "ON", "offload": "cpu"}],
            "workload": spec,
        },
        "test",
    )
    return ProbeRunner(scenario, RunDir.create(tmp_path / "-".join(workload.values()), scenario))


def second_turn() -> ConversationState:
    questions = ("Question 1: a?", "Question 2: b?")
    state = ConversationState(Conversation(0, 1000, 0, "Document 0-1000-0. Words.", questions))
    state.record_answer("An answer.")
    return state


async def test_each_turn_is_built_as_the_scenario_sends_it(tmp_path: Path) -> None:
    state = second_turn()
    session = cast(ArmSession, SimpleNamespace(tokenizer=SimTokenizer()))
    text = state.completion_prompt()
    ids = await runner(tmp_path, api="completions", prompt="token_ids")._prompt(session, state)
    assert ids == TokenIds(tuple(await SimTokenizer().prompt_ids(text)))
    assert await runner(tmp_path, api="completions")._prompt(session, state) == text
    assert await runner(tmp_path, api="chat")._prompt(session, state) == state.chat_messages()


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def completion(self, prompt: str | list[int], max_tokens: int, *, ignore_eos: bool = False) -> str:
        self.sent.append(("completion", prompt))
        return "outcome"

    async def chat(self, messages: list[Mapping[str, str]], max_tokens: int, *, ignore_eos: bool = False) -> str:
        self.sent.append(("chat", messages))
        return "outcome"


async def test_token_ids_go_to_the_completions_api_as_a_list_and_never_to_chat() -> None:
    client = Client()
    session = ArmSession.__new__(ArmSession)
    session.client = cast(Any, client)
    await session.send(TokenIds((5, 6, 7)), 4, api="completions", ignore_eos=True)
    await session.send("text", 4, api="completions", ignore_eos=True)
    await session.send("text", 4, api="chat", ignore_eos=True)
    assert client.sent == [
        ("completion", [5, 6, 7]),
        ("completion", "text"),
        ("chat", [{"role": "user", "content": "text"}]),
    ]
    with pytest.raises(TypeError, match="not token ids"):
        await session.send(TokenIds((5,)), 4, api="chat", ignore_eos=True)
    with pytest.raises(TypeError, match="not chat messages"):
        await session.send([{"role": "user", "content": "x"}], 4, api="completions", ignore_eos=True)
