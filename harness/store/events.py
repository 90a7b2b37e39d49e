"""Events appended to a run directory as work finishes (one JSON object per line, never rewritten).

* :class:`GroupDone` (``progress.jsonl``): a probe group (arm, repetition, context length) finished
  in an attempt; resume skips it.
* :class:`MetricsDelta` (``engine_metrics.jsonl``): the engine's ``/metrics`` counter deltas over
  one turn of one group, keyed by metric tag (tokens or queries, as counted by the engine).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GroupKey = tuple[str, int, int]
"""(arm, repetition, context_tokens)"""


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GroupDone(Frozen):
    """A progress event: this group finished in this attempt."""

    arm: str
    repetition: int
    context_tokens: int
    attempt: int

    @property
    def key(self) -> GroupKey:
        return (self.arm, self.repetition, self.context_tokens)


class MetricsDelta(Frozen):
    """Engine /metrics counter deltas over one turn of one group (values keyed by metric tag)."""

    arm: str
    attempt: int
    repetition: int
    context_tokens: int
    turn: int
    values: dict[str, float]

    @property
    def key(self) -> GroupKey:
        return (self.arm, self.repetition, self.context_tokens)
