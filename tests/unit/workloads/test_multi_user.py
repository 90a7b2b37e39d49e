"""The many-users workload: distributions, plans, texts and the bundled load scenarios' shapes."""

from __future__ import annotations

import random
import statistics

import pytest

from common.errors import ScenarioError
from harness.scenario.spec import load_scenario, parse_scenario
from harness.sim.tokenizer import SimTokenizer
from tests.support import REPO
from workloads.config import MultiUserQA
from workloads.multi_user import (
    MultiUserWorkload,
    expected_mean_prompt_tokens,
    expected_mean_rounds,
    sample,
)


def config(**overrides: object) -> MultiUserQA:
    data: dict[str, object] = {
        "kind": "multi_user_qa",
        "users": 5,
        "rounds": {"dist": "uniform", "low": 2, "high": 5},
        "system_prompt_tokens": 40,
        "context_tokens": {"dist": "lognormal", "mean": 300, "std": 100, "min": 100, "max": 800},
        "question_tokens": {"dist": "uniform", "low": 10, "high": 20},
        "answer_tokens": {"dist": "uniform", "low": 8, "high": 12},
        "think_time_s": {"dist": "exponential", "mean": 0.5},
    }
    data.update(overrides)
    return MultiUserQA.model_validate(data)


def dist(value: object) -> MultiUserQA:
    return config(rounds=value)


def draws(value: object, n: int = 20_000, integer: bool = True) -> list[float]:
    rng = random.Random(1)
    spec = dist(value).rounds
    return [sample(spec, rng, integer=integer) for _ in range(n)]


def test_bare_number_is_fixed_and_uniform_integers_include_both_ends() -> None:
    assert set(draws(4, 10)) == {4.0}
    values = draws({"dist": "uniform", "low": 2, "high": 11})
    assert set(values) == {float(v) for v in range(2, 12)}
    assert statistics.mean(values) == pytest.approx(6.5, abs=0.05)


def test_lognormal_has_the_requested_mean_and_std_and_clipping_applies() -> None:
    values = draws({"dist": "lognormal", "mean": 1000, "std": 400}, n=40_000, integer=False)
    assert statistics.mean(values) == pytest.approx(1000, rel=0.02)
    assert statistics.stdev(values) == pytest.approx(400, rel=0.05)
    clipped = draws({"dist": "lognormal", "mean": 1000, "std": 400, "min": 900, "max": 1100})
    assert min(clipped) == 900 and max(clipped) == 1100


def test_exponential_normal_and_choice() -> None:
    assert statistics.mean(draws({"dist": "exponential", "mean": 3}, integer=False)) == pytest.approx(3, rel=0.03)
    assert min(draws({"dist": "normal", "mean": 1, "std": 5})) == 0  # negative draws become 0
    choices = draws({"dist": "choice", "values": [1, 9], "weights": [3, 1]})
    assert set(choices) == {1.0, 9.0}
    assert choices.count(1.0) / len(choices) == pytest.approx(0.75, abs=0.02)


def test_bad_distribution_names_file_field_and_allowed_values() -> None:
    base = {
        "name": "t",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "A", "offload": "hbm"}],
        "sweep": {"mode": "concurrency", "values": [1]},
    }
    workload = {"kind": "multi_user_qa", "rounds": {"dist": "zipf", "a": 2}, "context_tokens": 100}
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**base, "workload": workload}, "my.yaml")
    message = str(info.value)
    assert "my.yaml" in message and "workload.rounds" in message
    assert "'fixed'" in message and "'lognormal'" in message and "'zipf'" in message
    workload = {"kind": "multi_user_qa", "rounds": {"dist": "uniform", "low": 5, "hihg": 2}, "context_tokens": 100}
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**base, "workload": workload}, "my.yaml")
    assert "workload.rounds.hihg" in str(info.value) and "allowed fields here: dist, high, low" in str(info.value)


def test_plans_are_deterministic_and_users_cycle() -> None:
    one = MultiUserWorkload(config(), SimTokenizer(), seed=7)
    two = MultiUserWorkload(config(), SimTokenizer(), seed=7)
    other = MultiUserWorkload(config(), SimTokenizer(), seed=8)
    plans = [one.plan(s) for s in range(20)]
    assert plans == [two.plan(s) for s in range(20)]
    assert plans != [other.plan(s) for s in range(20)]
    assert [p.user for p in plans] == [s % 5 for s in range(20)]
    # a returning user keeps its context length; its new session draws new rounds and lengths
    assert plans[0].context_tokens == plans[5].context_tokens
    assert len({(p.rounds, p.question_tokens) for p in plans[::5]}) > 1
    for plan in plans:
        assert 2 <= plan.rounds <= 5 and len(plan.question_tokens) == len(plan.answer_tokens) == plan.rounds
        assert all(10 <= q <= 20 for q in plan.question_tokens)
        assert all(8 <= a <= 12 for a in plan.answer_tokens)
        # round r carries S + context + all earlier questions and answers + its own question
        r = plan.rounds
        expected = 40 + plan.context_tokens + sum(plan.question_tokens) + sum(plan.answer_tokens[: r - 1])
        assert plan.prompt_tokens(r, 40) == expected


def test_max_prompt_tokens_cuts_sessions_and_contexts() -> None:
    workload = MultiUserWorkload(config(context_tokens=5000, rounds=50, max_prompt_tokens=1500), SimTokenizer(), seed=1)
    for session in range(10):
        plan = workload.plan(session)
        assert plan.drawn_rounds == 50 and 1 <= plan.rounds < 50
        assert plan.context_tokens < 1500
        for r in range(1, plan.rounds + 1):
            assert plan.prompt_tokens(r, 40) + plan.answer_tokens[r - 1] <= 1500


async def test_texts_have_exact_token_counts_and_the_system_prompt_is_shared() -> None:
    tokenizer = SimTokenizer()
    workload = MultiUserWorkload(config(), tokenizer, seed=3)
    await workload.prepare()
    first = await workload.start_session(0)
    second = await workload.start_session(1)
    assert len(await tokenizer.encode(first.system_prompt)) == 40
    assert first.system_prompt == second.system_prompt
    assert first.context != second.context  # different users
    assert len(await tokenizer.encode(first.context)) == first.plan.context_tokens
    for question, tokens in zip(first.questions, first.plan.question_tokens, strict=True):
        assert len(await tokenizer.encode(question)) == tokens
    # byte-identical in another instance (another arm)
    again = await MultiUserWorkload(config(), SimTokenizer(), seed=3).start_session(0)
    assert again.system_prompt == first.system_prompt
    assert (again.context, again.questions) == (first.context, first.questions)


async def test_session_rounds_resend_the_whole_history() -> None:
    workload = MultiUserWorkload(config(), SimTokenizer(), seed=3)
    session = await workload.start_session(2)
    p1 = session.prompt()
    assert p1.round == 1 and [m["role"] for m in p1.messages] == ["system", "user"]
    assert p1.messages[1]["content"].startswith(session.context) and session.questions[0] in p1.messages[1]["content"]
    assert p1.max_tokens == session.plan.answer_tokens[0]
    session.record_answer("first answer")
    p2 = session.prompt()
    assert [m["role"] for m in p2.messages] == ["system", "user", "assistant", "user"]
    assert p2.messages[2]["content"] == "first answer" and p2.messages[3]["content"] == session.questions[1]
    assert p2.expected_prompt_tokens > p1.expected_prompt_tokens
    assert p2.completion_prompt.startswith(p1.completion_prompt.removesuffix("\nA:").rsplit("Q:", 1)[0])
    while not session.done:
        session.record_answer("x")
    with pytest.raises(ValueError, match="finished"):
        session.prompt()


async def test_staggered_session_starts_mid_conversation_with_synthetic_history() -> None:
    workload = MultiUserWorkload(config(rounds=6), SimTokenizer(), seed=3)
    starts = {workload.stagger_round(workload.plan(s)) for s in range(60)}
    assert starts == set(range(1, 7))  # uniform over the rounds
    session = next(s for s in range(60) if workload.stagger_round(workload.plan(s)) == 4)
    staggered = await workload.start_session(session, start_round=4)
    assert staggered.next_round == 4 and len(staggered.answers) == 3 and staggered.is_prefilled
    assert len(staggered.prompt().messages) == 2 + 2 * 3
    staggered.record_answer("real")
    assert not staggered.is_prefilled


@pytest.mark.parametrize(
    ("name", "prompt", "rounds", "output"),
    [
        ("pliops-qwen3-14b", 9600, 6.5, (80, 120)),
        ("pliops-llama3-70b-fp8", 2200, 15, (170, 170)),
    ],
)
def test_bundled_load_scenarios_have_the_seed_shapes(
    name: str, prompt: float, rounds: float, output: tuple[int, int]
) -> None:
    scenario, _ = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    workload = scenario.load_workload
    assert expected_mean_prompt_tokens(workload, seed=scenario.seed) == pytest.approx(prompt, rel=0.05)
    assert expected_mean_rounds(workload, seed=scenario.seed) == pytest.approx(rounds, abs=0.25)
    plans = [MultiUserWorkload(workload, SimTokenizer(), seed=scenario.seed).plan(s) for s in range(200)]
    answers = [a for p in plans for a in p.answer_tokens]
    assert (min(answers), max(answers)) == output
