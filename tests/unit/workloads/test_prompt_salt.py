"""Per-run prompt salts in the workloads (:mod:`workloads.salt`): a salt heads every cacheable text, the same salt
builds the same text (what ``--resume`` relies on), another salt other text from the first tokens on, no salt
the text a run built before salts existed; token counts stay exact."""

from __future__ import annotations

import asyncio

from harness.sim.tokenizer import SimTokenizer
from workloads.config import MultiRoundQAProbe, MultiUserQA
from workloads.multi_round_qa import build_conversation, build_filler
from workloads.multi_user import MultiUserWorkload
from workloads.salt import new_salt, point_salt
from workloads.trace import TracePrompts

PROBE = MultiRoundQAProbe.model_validate({"kind": "multi_round_qa", "context_tokens": [300]})
USERS = MultiUserQA.model_validate(
    {"kind": "multi_user_qa", "users": 3, "rounds": 2, "system_prompt_tokens": 40, "context_tokens": 200}
)


def document(salt: str | None) -> str:
    conversation = asyncio.run(
        build_conversation(PROBE, SimTokenizer(), seed=1, repetition=0, context_tokens=300, index=0, salt=salt)
    )
    return conversation.document


def tokens(text: str) -> int:
    return len(asyncio.run(SimTokenizer().encode(text)))


def test_a_salt_heads_the_document_and_keeps_its_length() -> None:
    salt, other = new_salt(), new_salt()
    assert salt != other and salt.isalnum()
    assert document(salt) == document(salt)  # a resumed run rebuilds the very same prompt
    assert document(salt).startswith(f"Run {salt}. Document 0-300-0.")
    assert document(salt).split()[:2] != document(other).split()[:2]  # differs from the first tokens on
    assert document(None).startswith("Document 0-300-0.")  # fixed prompts: as every run before salts
    assert tokens(document(salt)) == tokens(document(None)) == 300


def test_filler_is_salted_too() -> None:
    def filler(salt: str | None) -> str:
        return asyncio.run(build_filler(SimTokenizer(), seed=1, tag="x", tokens=64, salt=salt))

    assert filler("a1") != filler("b2") and filler("a1") == filler("a1")
    assert tokens(filler("a1")) == 64


def test_each_load_point_has_its_own_contexts_and_the_run_one_system_prompt() -> None:
    async def texts(salt: str | None) -> list[tuple[str, str]]:
        workload = MultiUserWorkload(USERS, SimTokenizer(), seed=1, salt=salt)
        out = []
        for point in (0, 1, 0):
            workload.at_point(point)
            await workload.prepare()
            out.append((await workload.system_prompt(), await workload.context(0)))
        return out

    first, second, again = asyncio.run(texts("s1"))
    assert first[0] == second[0]  # the shared system prompt stays shared within the run
    assert first[1] != second[1]  # the next point's users find none of the previous point's contexts
    assert again == first
    assert second[1].startswith(f"Run {point_salt('s1', 1)}. Context of user 0.")
    assert tokens(second[1]) == tokens(first[1])
    other_run = asyncio.run(texts("s2"))
    assert other_run[0][0] != first[0]  # nor another run's system prompt
    fixed = asyncio.run(texts(None))
    assert fixed[0] == fixed[1] and fixed[0][1].startswith("Context of user 0.")


def test_trace_blocks_are_salted_per_run() -> None:
    def block(salt: str | None) -> str:
        return asyncio.run(TracePrompts(SimTokenizer(), seed=1, block_tokens=32, salt=salt).block(7, 32))

    assert block("a1") == block("a1") != block("b2")
    assert block(None).startswith(" [7] ") and block("a1").startswith(" Run a1. [7] ")
    assert tokens(block("a1")) == tokens(block(None)) == 32

    async def joined(salt: str) -> str:
        prompts = TracePrompts(SimTokenizer(), seed=1, block_tokens=32, salt=salt)
        return await prompts.block(7, 32) + await prompts.block(8, 32)

    assert tokens(asyncio.run(joined("a1"))) == 64  # a block's salt never fuses with the block before it
