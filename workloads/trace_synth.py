"""``kvbench trace synth``: a multi-user QA workload written as a kvbench trace, so it can be replayed exactly.

Sessions start as a Poisson process of ``session_rate`` per second (seeded); session ``s`` is the
:class:`~workloads.multi_user.SessionPlan` of :meth:`MultiUserWorkload.plan` (the same users,
rounds, lengths and think times as ``kvbench sweep`` draws for that seed). Round ``r`` of a session
arrives at

    t_r = t_start + Σ_{i<r} (response_s + think_i)

(``response_s`` stands for the time an answer takes, which a trace cannot know in advance). Its
prompt is the token stream ``system prompt | user context | Q1 A1 … Q_{r−1} A_{r−1} | Q_r`` (content
tokens, as :meth:`SessionPlan.prompt_tokens` counts them), cut into blocks of ``block_tokens``;
the id of block ``k`` is a hash of block ``k−1``'s id and the segments (and offsets) block ``k``
covers, numbered in order of first appearance. So two prompts share block ids exactly as far as
their token streams are equal: the system prompt across all users, a user's context across its
sessions, a session's history across its rounds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from .config import MultiUserQA
from .multi_user import SessionPlan, plan_only, stream
from .trace import HEADER_KEY, HEADER_VERSION

Segment = tuple[str, int, int, int]
"""(kind, owner, index, tokens): the system prompt, a user's context, a question or an answer."""


MAX_SESSIONS = 1_000_000
MAX_SESSION_RATE = 10_000.0
MAX_RESPONSE_S = 3600.0
MAX_BLOCK_TOKENS = 1_000_000


@dataclass(frozen=True)
class SynthSpec:
    """What to synthesize; :meth:`problem` says which setting is out of range."""

    sessions: int
    session_rate: float
    """Sessions started per second (Poisson)."""
    response_s: float = 2.0
    block_tokens: int = 512

    def problem(self) -> str | None:
        """One line naming the first setting out of its range (the CLI flag), or None."""
        checks = (
            ("--sessions", self.sessions, 1 <= self.sessions <= MAX_SESSIONS, f"an integer in [1, {MAX_SESSIONS}]"),
            (
                "--session-rate",
                self.session_rate,
                0 < self.session_rate <= MAX_SESSION_RATE,
                f"a number in (0, {MAX_SESSION_RATE:g}] sessions/s",
            ),
            (
                "--response-s",
                self.response_s,
                0 <= self.response_s <= MAX_RESPONSE_S,
                f"a number of seconds in [0, {MAX_RESPONSE_S:g}]",
            ),
            (
                "--block-tokens",
                self.block_tokens,
                1 <= self.block_tokens <= MAX_BLOCK_TOKENS,
                f"an integer in [1, {MAX_BLOCK_TOKENS}]",
            ),
        )
        for flag, value, ok, allowed in checks:
            if not ok:  # NaN compares false everywhere, so it lands here too
                return f"{flag} {value!r}: must be {allowed}"
        return None


def segments(plan: SessionPlan, round_: int, system_prompt_tokens: int) -> list[Segment]:
    """The content segments of round ``round_``'s prompt, in order."""
    out: list[Segment] = []
    if system_prompt_tokens > 0:
        out.append(("system", 0, 0, system_prompt_tokens))
    out.append(("context", plan.user, 0, plan.context_tokens))
    for index in range(round_ - 1):
        out.append(("question", plan.session, index, plan.question_tokens[index]))
        out.append(("answer", plan.session, index, plan.answer_tokens[index]))
    out.append(("question", plan.session, round_ - 1, plan.question_tokens[round_ - 1]))
    return out


def block_keys(parts: list[Segment], block_tokens: int) -> list[str]:
    """Chained content keys of the token stream's blocks (equal streams up to block k: equal keys up to k)."""
    keys: list[str] = []
    previous = ""
    pieces: list[str] = []
    filled = 0
    for kind, owner, index, tokens in parts:
        offset = 0
        while offset < tokens:
            take = min(tokens - offset, block_tokens - filled)
            pieces.append(f"{kind}:{owner}:{index}:{offset}:{offset + take}")
            offset += take
            filled += take
            if filled == block_tokens:
                previous = hashlib.sha256((previous + "|" + ",".join(pieces)).encode()).hexdigest()
                keys.append(previous)
                pieces, filled = [], 0
    if pieces:
        keys.append(hashlib.sha256((previous + "|" + ",".join(pieces)).encode()).hexdigest())
    return keys


def synthesize(config: MultiUserQA, spec: SynthSpec, *, seed: int) -> Iterator[str]:
    """The trace's lines (JSON, without newlines): the header, then one request per line in time order."""
    workload = plan_only(config, seed=seed)
    arrivals = stream(seed, "trace-synth", "sessions", spec.session_rate)
    rows: list[tuple[float, int, int, SessionPlan]] = []
    start = 0.0
    for session in range(spec.sessions):
        if session > 0:
            start += arrivals.expovariate(spec.session_rate)
        plan = workload.plan(session)
        at = start
        for round_ in range(1, plan.rounds + 1):
            rows.append((at, session, round_, plan))
            at += spec.response_s + plan.think_s[round_ - 1]
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    yield json.dumps(
        {HEADER_KEY: HEADER_VERSION, "block_tokens": spec.block_tokens, "source": "kvbench trace synth", "seed": seed}
    )
    ids: dict[str, int] = {}
    for at, session, round_, plan in rows:
        keys = block_keys(segments(plan, round_, config.system_prompt_tokens), spec.block_tokens)
        hash_ids = [ids.setdefault(key, len(ids)) for key in keys]
        yield json.dumps(
            {
                "timestamp": round(at * 1000.0, 3),
                "session": session,
                "turn": round_,
                "input_length": plan.prompt_tokens(round_, config.system_prompt_tokens),
                "output_length": plan.answer_tokens[round_ - 1],
                "hash_ids": hash_ids,
            }
        )
