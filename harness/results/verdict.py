"""Whether a run measured what it claims: the verdict fields of the result files and the exit codes.

A run ends in one of three verdicts (:class:`Validity`), judged by :mod:`harness.results.validity`
from the stored files alone:

* ``valid``: exit 0;
* ``failed`` (exit :data:`EXIT_FAILED` = 1): a cell has no successful request, or the failed
  measured requests pass ``validity.max_error_rate`` -- there is nothing trustworthy to report;
* ``inconclusive`` (exit :data:`EXIT_INCONCLUSIVE` = 3): requests succeeded, but the engine's own
  counters show that turn 2 did not measure a returning user served by the offload tier (the
  reset did not happen, the tier never hit, the engine restarted mid-arm).

Exit 2 stays "cannot run or read" (a clear error), as for every other command. The manifest's
attempt status is ``completed``, ``failed`` or ``inconclusive`` accordingly, with the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INCONCLUSIVE = 3

VerdictValue = Literal["valid", "failed", "inconclusive"]
GateName = Literal[
    "no_success",
    "error_rate",
    "no_offload_hits",
    "reset_missed",
    "off_arm_hits",
    "engine_restarted",
    "engine_died",
    "reset_unavailable",
    "warm_turn1",
    "client_limited",
]
FAILING_GATES: frozenset[str] = frozenset({"no_success", "error_rate", "engine_died"})
"""Gates that make the run ``failed``; the others make it ``inconclusive``."""


class Finding(BaseModel):
    """One gate that tripped, where (arm / context / turn when it is about one cell) and why."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    gate: GateName
    message: str
    arm: str | None = None
    context_tokens: int | None = None
    turn: int | None = None


class Validity(BaseModel):
    """The verdict of one run, its error rate, errors by kind, and every finding."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    verdict: VerdictValue
    error_rate: float | None = Field(description="Failed measured requests / measured requests.")
    max_error_rate: float
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    findings: list[Finding] = Field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"valid": EXIT_OK, "failed": EXIT_FAILED, "inconclusive": EXIT_INCONCLUSIVE}[self.verdict]

    def outcome(self) -> Outcome:
        status: Literal["completed", "failed", "inconclusive"] = (
            "completed" if self.verdict == "valid" else self.verdict
        )
        return Outcome(status=status, exit_code=self.exit_code, reasons=tuple(f.message for f in self.findings))


def verdict_of(findings: list[Finding]) -> VerdictValue:
    if any(f.gate in FAILING_GATES for f in findings):
        return "failed"
    return "inconclusive" if findings else "valid"


@dataclass(frozen=True)
class Outcome:
    """How an attempt ends: the manifest's status, the CLI's exit code and why."""

    status: Literal["completed", "failed", "inconclusive"]
    exit_code: int = EXIT_OK
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


COMPLETED = Outcome(status="completed")


def outcome_of(validity: Validity | None) -> Outcome:
    """The outcome a result file's validity implies (a file judged before validity existed: completed)."""
    return COMPLETED if validity is None else validity.outcome()


@runtime_checkable
class Judged(Protocol):
    """A result file that carries a verdict (probe and sweep results)."""

    def outcome(self) -> Outcome: ...


def outcome_of_result(result: object) -> Outcome:
    """The outcome of any result file: its verdict's, or completed for kinds without one (soak has its own)."""
    return result.outcome() if isinstance(result, Judged) else COMPLETED


def worst(outcomes: list[Outcome]) -> Outcome:
    """The outcome a command ending several runs reports: failed before inconclusive before completed."""
    rank = {"failed": 2, "inconclusive": 1, "completed": 0}
    return max(outcomes, key=lambda o: rank[o.status], default=COMPLETED)
