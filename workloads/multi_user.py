"""Many users, each a multi-round QA conversation: the workload of ``kvbench sweep``.

A *user* owns a private context (a document, code, a chat history) of ``context_tokens`` tokens;
every user shares one system prompt of ``system_prompt_tokens`` tokens. A *session* is one
conversation of a user: ``rounds`` rounds, each sending the whole history (system prompt, context,
earlier questions and the engine's own answers) plus a new question, then waiting for the answer
and a think time. Sessions are numbered; session ``s`` belongs to user ``s % users``, so once every
user has had a session the users come back with a new conversation on the same context (a
returning user, whose context KV an offload tier may still hold). With ``user_skew`` s > 0 the user
of each session is drawn instead, user ``u`` with weight ``(u + 1)^-s`` (a few heavy users).

Everything is a pure function of ``(seed, session)`` or ``(seed, user)``:

* :meth:`MultiUserWorkload.plan` draws a session's rounds, question and answer lengths and think
  times (:class:`SessionPlan`), with no tokenizer and no I/O;
* the texts (system prompt, contexts, questions, synthetic answers) are seeded prose cut to an
  exact token count with the engine's tokenizer (:func:`workloads.text.fit_to_tokens`).

So every arm sees byte-identical users. The texts carry the run's salt (:mod:`.salt`): the system prompt
the run's own (shared by every user of the run), each context also the load point's
(:meth:`MultiUserWorkload.at_point`), so a sweep's next point, or a repeated run, never finds a context KV of
an earlier one. Contexts are built before the load is applied (:meth:`MultiUserWorkload.prepare`), because
building a long context is CPU work that would stall the event loop that timestamps responses; questions are
short and built per session, yielding to the event loop between them.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .config import (
    ChoiceDist,
    Distribution,
    ExponentialDist,
    FixedDist,
    LogNormalDist,
    MultiUserQA,
    NormalDist,
    UniformDist,
)
from .salt import point_salt, salted
from .text import fit_to_tokens
from .tokenizer import Tokenizer

TEMPLATE_TOKENS_PER_MESSAGE = 8
"""Allowance for the chat template's tokens around each message when checking ``max_prompt_tokens``."""
MIN_CONTEXT_TOKENS = 16


def stream(seed: int, *parts: object) -> random.Random:
    """An independent, process-stable random stream for one purpose (string seeds hash with SHA-512)."""
    return random.Random("kvbench:multi_user:" + ":".join(str(p) for p in (seed, *parts)))


def sample(dist: Distribution, rng: random.Random, *, integer: bool, minimum: float = 0.0) -> float:
    """One draw of ``dist``: clipped to its ``min``/``max``, then to ``minimum``; rounded if ``integer``.

    ``uniform`` draws whole numbers between ``ceil(low)`` and ``floor(high)`` (both included) for
    integer quantities, so ``{low: 2, high: 11}`` has mean 6.5. ``lognormal`` takes the mean and
    standard deviation of the variable itself: ``σ² = ln(1 + std²/mean²)``, ``μ = ln(mean) − σ²/2``.
    """
    value: float
    if isinstance(dist, FixedDist):
        value = dist.value
    elif isinstance(dist, UniformDist):
        low, high = math.ceil(dist.low), math.floor(dist.high)
        value = float(rng.randint(low, high)) if integer and low <= high else rng.uniform(dist.low, dist.high)
    elif isinstance(dist, NormalDist):
        value = rng.gauss(dist.mean, dist.std)
    elif isinstance(dist, LogNormalDist):
        sigma2 = math.log1p((dist.std / dist.mean) ** 2)
        value = rng.lognormvariate(math.log(dist.mean) - sigma2 / 2.0, math.sqrt(sigma2))
    elif isinstance(dist, ExponentialDist):
        value = rng.expovariate(1.0 / dist.mean)
    else:
        assert isinstance(dist, ChoiceDist)
        value = rng.choices(dist.values, weights=dist.weights)[0]
    if dist.min is not None:
        value = max(value, dist.min)
    if dist.max is not None:
        value = min(value, dist.max)
    value = max(value, minimum)
    return float(round(value)) if integer else value


@dataclass(frozen=True)
class SessionPlan:
    """The shape of one session, drawn before any text exists (token counts are content tokens)."""

    session: int
    user: int
    context_tokens: int
    rounds: int
    """Rounds the session sends (``drawn_rounds`` cut so every prompt fits ``max_prompt_tokens``)."""
    drawn_rounds: int
    question_tokens: tuple[int, ...]
    answer_tokens: tuple[int, ...]
    think_s: tuple[float, ...]
    """Pause after the answer of each round, before the next one."""

    def prompt_tokens(self, round_: int, system_prompt_tokens: int) -> int:
        """Content tokens of round ``round_``'s prompt: S + context + earlier Q&A + this question.

        Earlier answers count as ``answer_tokens`` (exact when the engine ignores EOS); the chat
        template's own tokens are not included.
        """
        if not 1 <= round_ <= self.rounds:
            raise ValueError(f"session {self.session} has rounds 1..{self.rounds}, not {round_}")
        history = sum(self.question_tokens[: round_ - 1]) + sum(self.answer_tokens[: round_ - 1])
        return system_prompt_tokens + self.context_tokens + history + self.question_tokens[round_ - 1]


@dataclass(frozen=True)
class Prompt:
    """What to send for one round."""

    round: int
    messages: tuple[dict[str, str], ...]
    completion_prompt: str
    max_tokens: int
    expected_prompt_tokens: int


@dataclass
class Session:
    """A session in progress: its plan, its texts and the answers received so far."""

    plan: SessionPlan
    system_prompt: str
    context: str
    questions: tuple[str, ...]
    system_prompt_tokens: int
    start_round: int = 1
    answers: list[str] = field(default_factory=list)

    @property
    def next_round(self) -> int:
        return len(self.answers) + 1

    @property
    def done(self) -> bool:
        return self.next_round > self.plan.rounds

    @property
    def is_prefilled(self) -> bool:
        """Whether the next request is the first of a session started past round 1 (history the
        engine never saw, so its cache state is not that of a returning user)."""
        return self.start_round > 1 and self.next_round == self.start_round

    def think_after(self, round_: int) -> float:
        return self.plan.think_s[round_ - 1]

    def prompt(self) -> Prompt:
        """The next round's request."""
        round_ = self.next_round
        if round_ > self.plan.rounds:
            raise ValueError(f"session {self.plan.session} is finished")
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": f"{self.context}\n\n{self.questions[0]}"})
        parts = [p for p in (self.system_prompt, self.context) if p]
        for done in range(1, round_):
            messages.append({"role": "assistant", "content": self.answers[done - 1]})
            messages.append({"role": "user", "content": self.questions[done]})
            parts.append(f"Q: {self.questions[done - 1]}\nA: {self.answers[done - 1]}")
        parts.append(f"Q: {self.questions[round_ - 1]}\nA:")
        return Prompt(
            round=round_,
            messages=tuple(messages),
            completion_prompt="\n\n".join(parts),
            max_tokens=self.plan.answer_tokens[round_ - 1],
            expected_prompt_tokens=self.plan.prompt_tokens(round_, self.system_prompt_tokens),
        )

    def record_answer(self, text: str) -> None:
        if self.done:
            raise ValueError(f"session {self.plan.session} is finished")
        self.answers.append(text)


class MultiUserWorkload:
    """Plans and texts of a :class:`~harness.scenario.spec.MultiUserQA` workload for one seed.

    ``tokenizer`` must be the engine's, so that token counts are exact. Texts are cached: build the
    contexts with :meth:`prepare` before applying load, then :meth:`start_session` only builds the
    (short) questions.
    """

    def __init__(self, config: MultiUserQA, tokenizer: Tokenizer, *, seed: int, salt: str | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.seed = seed
        self.salt = salt
        self.point: int | None = None
        """The load point whose contexts the texts are (None: one load, as a soak's)."""
        self._system_prompt: str | None = None
        self._contexts: dict[int, str] = {}
        self._cumulative: list[float] | None = None

    def at_point(self, point: int) -> None:
        """Build contexts for load point ``point`` from now on: fresh ones, salted with the point, so its users
        find no KV of an earlier point's (a salted run only; fixed prompts stay the same on every point)."""
        if self.salt is not None and point != self.point:
            self._contexts.clear()
        self.point = point

    # -- plans (pure) ----------------------------------------------------------------------
    def user_of(self, session: int) -> int:
        """``session % users``; with ``user_skew`` s > 0 a draw with weights ``(u + 1)^-s`` (Zipf), from the
        session's own stream, so a session's user never depends on which sessions ran before."""
        skew = self.config.user_skew
        if skew == 0:
            return session % self.config.users
        if self._cumulative is None:
            self._cumulative = list(itertools.accumulate((u + 1) ** -skew for u in range(self.config.users)))
        draw = stream(self.seed, "session", session, "user").random() * self._cumulative[-1]
        return min(bisect.bisect_right(self._cumulative, draw), self.config.users - 1)

    def context_tokens(self, user: int) -> int:
        """The user's context length, cut so that round 1 of any session fits ``max_prompt_tokens``."""
        c = self.config
        tokens = int(sample(c.context_tokens, stream(self.seed, "user", user, "context"), integer=True))
        tokens = max(tokens, MIN_CONTEXT_TOKENS)
        if c.max_prompt_tokens is not None:
            room = c.max_prompt_tokens - c.system_prompt_tokens - 3 * TEMPLATE_TOKENS_PER_MESSAGE
            room -= self._max_first_round_extra()
            tokens = max(MIN_CONTEXT_TOKENS, min(tokens, room))
        return tokens

    def _max_first_round_extra(self) -> int:
        """An upper bound of question + answer tokens of one round (to keep round 1 within the limit)."""
        c = self.config
        return int(_upper(c.question_tokens)) + int(_upper(c.answer_tokens))

    def plan(self, session: int) -> SessionPlan:
        """Rounds, lengths and think times of session ``session`` (deterministic, no I/O)."""
        if session < 0:
            raise ValueError(f"session must be >= 0, got {session}")
        c = self.config
        user = self.user_of(session)
        context = self.context_tokens(user)
        drawn = int(sample(c.rounds, stream(self.seed, "session", session, "rounds"), integer=True, minimum=1))
        q_rng = stream(self.seed, "session", session, "questions")
        a_rng = stream(self.seed, "session", session, "answers")
        t_rng = stream(self.seed, "session", session, "think")
        questions = tuple(int(sample(c.question_tokens, q_rng, integer=True, minimum=4)) for _ in range(drawn))
        answers = tuple(int(sample(c.answer_tokens, a_rng, integer=True, minimum=1)) for _ in range(drawn))
        think = tuple(sample(c.think_time_s, t_rng, integer=False) for _ in range(drawn))
        rounds = drawn
        if c.max_prompt_tokens is not None:
            total = c.system_prompt_tokens + context
            rounds = 0
            for index in range(drawn):
                total += questions[index]
                overhead = (2 * index + 3) * TEMPLATE_TOKENS_PER_MESSAGE
                if total + answers[index] + overhead > c.max_prompt_tokens and index > 0:
                    break
                rounds = index + 1
                total += answers[index]
        return SessionPlan(
            session=session,
            user=user,
            context_tokens=context,
            rounds=rounds,
            drawn_rounds=drawn,
            question_tokens=questions[:rounds],
            answer_tokens=answers[:rounds],
            think_s=think[:rounds],
        )

    def stagger_round(self, plan: SessionPlan) -> int:
        """A start round drawn uniformly from 1..rounds (for users present when the load starts)."""
        return stream(self.seed, "session", plan.session, "stagger").randint(1, plan.rounds)

    # -- texts -------------------------------------------------------------------------------
    async def system_prompt(self) -> str:
        if self._system_prompt is None:
            tokens = self.config.system_prompt_tokens
            self._system_prompt = (
                await fit_to_tokens(
                    self.tokenizer, salted("System instructions. ", self.salt), stream(self.seed, "system"), tokens
                )
                if tokens > 0
                else ""
            )
        return self._system_prompt

    async def context(self, user: int) -> str:
        """The user's context text (built on first use, then cached)."""
        text = self._contexts.get(user)
        if text is None:
            rng = stream(self.seed, "user", user, "context-text")
            salt = self.salt if self.point is None else point_salt(self.salt, self.point)
            header = salted(f"Context of user {user}. ", salt)
            text = await fit_to_tokens(self.tokenizer, header, rng, self.context_tokens(user))
            self._contexts[user] = text
        return text

    async def prepare(self, users: Sequence[int] | None = None, on_user: Callable[[int], None] | None = None) -> None:
        """Build the system prompt and the contexts of ``users`` (default: every user), once."""
        await self.system_prompt()
        for user in users if users is not None else range(self.config.users):
            await self.context(user)
            if on_user is not None:
                on_user(user)
            await asyncio.sleep(0)

    async def question(self, session: int, round_: int, tokens: int) -> str:
        rng = stream(self.seed, "session", session, "question-text", round_)
        return await fit_to_tokens(self.tokenizer, f"Question {round_} of conversation {session}: ", rng, tokens)

    async def synthetic_answer(self, session: int, round_: int, tokens: int) -> str:
        """Stand-in answer for the history of a session started past round 1."""
        rng = stream(self.seed, "session", session, "answer-text", round_)
        return await fit_to_tokens(self.tokenizer, "Answer. ", rng, tokens)

    async def start_session(self, session: int, *, start_round: int = 1) -> Session:
        """A session ready to send round ``start_round`` (earlier rounds get synthetic answers)."""
        plan = self.plan(session)
        if not 1 <= start_round <= plan.rounds:
            raise ValueError(f"start_round must be in 1..{plan.rounds}, got {start_round}")
        questions = []
        for index, tokens in enumerate(plan.question_tokens):
            questions.append(await self.question(session, index + 1, tokens))
            await asyncio.sleep(0)  # short CPU bursts only: the event loop is timing responses
        answers = []
        for index in range(start_round - 1):
            answers.append(await self.synthetic_answer(session, index + 1, plan.answer_tokens[index]))
            await asyncio.sleep(0)
        return Session(
            plan=plan,
            system_prompt=await self.system_prompt(),
            context=await self.context(plan.user),
            questions=tuple(questions),
            system_prompt_tokens=self.config.system_prompt_tokens,
            start_round=start_round,
            answers=answers,
        )


def _upper(dist: Distribution) -> float:
    """A practical upper bound of a distribution (its max, or a high quantile for open-ended ones)."""
    if dist.max is not None:
        return dist.max
    if isinstance(dist, FixedDist):
        return dist.value
    if isinstance(dist, UniformDist):
        return dist.high
    if isinstance(dist, ChoiceDist):
        return max(dist.values)
    if isinstance(dist, NormalDist):
        return dist.mean + 4 * dist.std
    if isinstance(dist, LogNormalDist):
        return dist.mean + 6 * dist.std
    assert isinstance(dist, ExponentialDist)
    return dist.mean * 7


def plan_only(config: MultiUserQA, *, seed: int) -> MultiUserWorkload:
    """A workload for plans only (:meth:`MultiUserWorkload.plan`); asking it for text is an error."""
    return MultiUserWorkload(config, _NoTokenizer(), seed=seed)


def expected_mean_prompt_tokens(config: MultiUserQA, *, seed: int = 0, sessions: int = 2000) -> float:
    """Mean content prompt tokens per request over ``sessions`` planned sessions (for scenario design)."""
    workload = plan_only(config, seed=seed)
    total = 0
    count = 0
    for session in range(sessions):
        plan = workload.plan(session)
        for round_ in range(1, plan.rounds + 1):
            total += plan.prompt_tokens(round_, config.system_prompt_tokens)
            count += 1
    return total / count


def expected_mean_rounds(config: MultiUserQA, *, seed: int = 0, sessions: int = 2000) -> float:
    workload = plan_only(config, seed=seed)
    return sum(workload.plan(s).rounds for s in range(sessions)) / sessions


class _NoTokenizer:
    """For plan-only uses; any text request is a programming error."""

    async def encode(self, text: str) -> list[int]:
        raise RuntimeError("plans need no tokenizer")

    async def prompt_ids(self, text: str) -> list[int]:
        raise RuntimeError("plans need no tokenizer")

    async def decode(self, token_ids: Sequence[int]) -> str:
        raise RuntimeError("plans need no tokenizer")
