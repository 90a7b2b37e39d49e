"""Multi-round QA conversations: a unique document of N tokens, then one question per turn.

Turn 1 sends the document and the first question. Every later turn resends the whole history
(document, earlier questions and the engine's own answers) plus a new question, which is what a
chat or agent front end does. The engine can therefore reuse the KV of everything but the new
question, if it still has it.

Content is deterministic from (seed, run salt, repetition, context length, conversation index), so every arm
sees byte-identical documents and questions; token counts are exact for the engine's tokenizer. The run's
salt (:mod:`.salt`) heads every document, so a repeated run's turn 1 finds no KV of an earlier run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .config import MultiRoundQAProbe
from .salt import salted
from .text import fit_to_tokens
from .tokenizer import Tokenizer

SYSTEM_PROMPT = "You are a careful assistant. Answer questions about the document the user provides."


@dataclass(frozen=True)
class Conversation:
    """The fixed content of one conversation (answers are added at run time)."""

    repetition: int
    context_tokens: int
    index: int
    document: str
    questions: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"r{self.repetition}-c{self.context_tokens}-n{self.index}"


@dataclass
class ConversationState:
    """A conversation in progress: its content plus the answers received so far."""

    conversation: Conversation
    answers: list[str] = field(default_factory=list)

    @property
    def next_turn(self) -> int:
        return len(self.answers) + 1

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages for the next turn: the whole history plus the new question."""
        conv = self.conversation
        turn = self.next_turn
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{conv.document}\n\n{conv.questions[0]}"},
        ]
        for done in range(1, turn):
            messages.append({"role": "assistant", "content": self.answers[done - 1]})
            messages.append({"role": "user", "content": conv.questions[done]})
        return messages

    def completion_prompt(self) -> str:
        conv = self.conversation
        parts = [SYSTEM_PROMPT, conv.document]
        for done in range(1, self.next_turn):
            parts.append(f"Q: {conv.questions[done - 1]}\nA: {self.answers[done - 1]}")
        parts.append(f"Q: {conv.questions[self.next_turn - 1]}\nA:")
        return "\n\n".join(parts)

    def record_answer(self, text: str) -> None:
        self.answers.append(text)


def conversation_rng(seed: int, repetition: int, context_tokens: int, index: int, purpose: str) -> random.Random:
    # string seeds are hashed with SHA-512 by random.seed, so they are stable across processes
    return random.Random(f"kvbench:{seed}:{repetition}:{context_tokens}:{index}:{purpose}")


DOCUMENT_CACHE_TOKENS = 16_000_000
"""Above this many document tokens in one group (conversations x context length, ~80 MB of text) a group keeps
no documents between its turns and rebuilds each one (deterministically, from its seed) when it sends it: memory
stays bounded whatever the count of conversations, and the first request goes out as soon as its own document is
built."""


async def build_conversation(
    workload: MultiRoundQAProbe,
    tokenizer: Tokenizer,
    *,
    seed: int,
    repetition: int,
    context_tokens: int,
    index: int,
    salt: str | None = None,
) -> Conversation:
    """Conversation ``index`` of one (repetition, context length) group: the same text every time it is built."""
    doc_rng = conversation_rng(seed, repetition, context_tokens, index, "document")
    header = salted(f"Document {repetition}-{context_tokens}-{index}. ", salt)
    document = await fit_to_tokens(tokenizer, header, doc_rng, context_tokens)
    questions = []
    for turn in range(1, workload.turns + 1):
        q_rng = conversation_rng(seed, repetition, context_tokens, index, f"question-{turn}")
        questions.append(await fit_to_tokens(tokenizer, f"Question {turn}: ", q_rng, workload.question_tokens))
    return Conversation(
        repetition=repetition,
        context_tokens=context_tokens,
        index=index,
        document=document,
        questions=tuple(questions),
    )


async def build_conversations(
    workload: MultiRoundQAProbe, tokenizer: Tokenizer, *, seed: int, repetition: int, context_tokens: int
) -> list[Conversation]:
    """Every conversation of one (repetition, context length) group, built now (for small groups and tests)."""
    return [
        await build_conversation(
            workload, tokenizer, seed=seed, repetition=repetition, context_tokens=context_tokens, index=index
        )
        for index in range(workload.conversations)
    ]


class ConversationGroup:
    """The conversations of one group, built when first sent; kept between turns only while the group is small.

    A group holds every conversation's answers (``answer_tokens`` each) and, up to :data:`DOCUMENT_CACHE_TOKENS`,
    its document; beyond that a conversation is rebuilt from its seed for each turn it sends.
    """

    def __init__(
        self,
        workload: MultiRoundQAProbe,
        tokenizer: Tokenizer,
        *,
        seed: int,
        repetition: int,
        context_tokens: int,
        salt: str | None = None,
    ) -> None:
        self.workload = workload
        self.tokenizer = tokenizer
        self.seed = seed
        self.salt = salt
        self.repetition = repetition
        self.context_tokens = context_tokens
        self.keep_documents = workload.conversations * context_tokens <= DOCUMENT_CACHE_TOKENS
        self._kept: dict[int, Conversation] = {}

    async def state(self, index: int, answers: list[str]) -> ConversationState:
        """Conversation ``index`` with the answers it has received, ready for its next turn."""
        conversation = self._kept.get(index)
        if conversation is None:
            conversation = await build_conversation(
                self.workload,
                self.tokenizer,
                seed=self.seed,
                repetition=self.repetition,
                context_tokens=self.context_tokens,
                index=index,
                salt=self.salt,
            )
            if self.keep_documents:
                self._kept[index] = conversation
        return ConversationState(conversation, answers)


async def build_filler(tokenizer: Tokenizer, *, seed: int, tag: str, tokens: int, salt: str | None = None) -> str:
    """An unrelated prompt used to push other users' KV out of GPU memory (salted: an earlier run's filler KV
    would be a hit, and a hit evicts nothing)."""
    rng = random.Random(f"kvbench:{seed}:filler:{tag}")
    return await fit_to_tokens(tokenizer, salted(f"Filler {tag}. ", salt), rng, tokens)
