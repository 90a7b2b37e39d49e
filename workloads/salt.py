"""Per-run prompt salts: every run's prompts are its own, so no run finds an earlier run's KV.

A run draws one salt when its run directory is created (``manifest.json``'s ``prompt_salt``; ``--resume``
reuses it). Every text a workload builds that an engine could cache -- a probe's documents, the users'
contexts and the shared system prompt of a multi-user load, a trace's or an agent's hash blocks, filler --
starts with a header naming the salt (:func:`salted`), so its first tokens differ between runs and an
engine's prefix cache (GPU or offload tier) cannot serve one run's turn 1 from another's. What a workload
shares inside a run (the system prompt, a trace's repeated blocks) carries the same salt and stays shared.
Load points add their index (:func:`point_salt`), so a sweep's next point never reuses the
previous point's contexts; a probe group that ``--resume`` re-runs after an earlier attempt sent part of it adds
the attempt (:func:`retry_salt`), so it does not find what that attempt left in an attached endpoint's tier.

``workload.prompt_salt: fixed`` keeps the salt None: the same prompts on every run (a warm start, measured
on purpose), which is also what a run directory written before salts existed holds.
"""

from __future__ import annotations

import secrets
from typing import Literal

PromptSaltMode = Literal["per_run", "fixed"]
SALT_HEX_DIGITS = 8
"""32 random bits: two runs of one engine share a salt with probability 2^-32."""


def new_salt() -> str:
    """A fresh salt for a new run."""
    return secrets.token_hex(SALT_HEX_DIGITS // 2)


def salted(header: str, salt: str | None) -> str:
    """``header`` behind the salt, or ``header`` itself without one."""
    return header if salt is None else f"Run {salt}. {header}"


def point_salt(salt: str | None, point: int) -> str | None:
    """The salt of one load point of a salted run (None stays None: fixed prompts are fixed on every point)."""
    return None if salt is None else f"{salt}-p{point}"


def retry_salt(salt: str | None, attempt: int) -> str | None:
    """The salt of a probe group re-run by attempt ``attempt`` after an earlier attempt sent some of it: an attached
    endpoint's tier may still hold that attempt's turn 1, which the re-run must not find (None stays None)."""
    return None if salt is None else f"{salt}-a{attempt}"
