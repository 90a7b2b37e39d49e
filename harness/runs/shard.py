"""Shards: one run's load split over independent client processes (``--shard I/N``), started together
(``--start-at TIME``) without a coordinator, merged afterwards from their raw records (``kvbench merge``).

**The partition.** Shards are numbered from 0 (``--shard 0/2`` and ``--shard 1/2``: the numbering of a Kubernetes
Indexed Job's ``JOB_COMPLETION_INDEX``). Everything a run numbers is dealt round-robin: item ``k`` (a user slot,
an open-loop arrival, a session, a trace conversation) belongs to shard ``k mod N``. So with the same scenario and
seed every machine computes the same partition, shard ``I`` gets a disjoint subset and the union is the whole.
A load point of ``C`` concurrent users gives shard ``I`` the slots ``I, I+N, I+2N, ...``: ``C // N`` users, one
more for the first ``C mod N`` shards (:meth:`Shard.share`). An open-loop point of ``R`` requests/s: every shard
draws the whole arrival process of the unsharded run (same seed) and sends the arrivals it owns, so the union of
the shards' arrivals is exactly the one-process schedule. The ``k``-th session a shard opens is global session
``k·N + I``, so two shards never build the same conversation.

**The common start.** ``--start-at`` (ISO 8601 UTC, ``2026-12-02T06:00:00Z``, or Unix seconds) makes the run wait
until that wall-clock time before its first load point. Load point ``k`` (counted over the arms in run order, then
their points) starts at ``start_at + k × period``, where ``period = warmup + duration + drain_timeout +``
:data:`SETUP_ALLOWANCE_S` of the scenario's sweep section: a schedule every shard computes alike from the same
scenario, so shards on different machines start each point together (to the accuracy of their clocks: NTP keeps
them within milliseconds). A shard that reaches a point late starts it at once and says so; the merge then
judges the overlap of the measured windows. Soaks and replays wait for ``--start-at`` once: their one window
follows its own schedule from there.

**The prompt salt.** The shards of one run must build the same prompts for the same sessions: a sharded run whose
scenario salts prompts per run takes its salt from the scenario and ``--start-at`` (:func:`shard_salt`), so a new
``--start-at`` is a new salt and the shards of one run agree without talking to each other.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import KvbenchError

START_LEAD_S = 2.0
"""A load point's countdown ends this long before its common start; the load driver then sleeps to the start itself
(:func:`sleep_until`), so what a point sets up before its load (energy meter, /metrics task) does not delay it."""
SETUP_ALLOWANCE_S = 10.0
"""Seconds of each load point's period for what happens between two points (building the next point's contexts,
resetting the prefix cache); a point that takes longer starts late, and the merge judges the overlap."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based); ``Shard(0, 1)`` is an unsharded run."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: the index must be in 0..{self.count - 1}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N`` with ``0 <= I < N``; a one-line :class:`KvbenchError` naming the flag otherwise."""
        found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if found is None:
            raise KvbenchError(f"--shard {text!r}: give I/N, e.g. 0/4 (shards are numbered 0 to N-1)")
        index, count = int(found.group(1)), int(found.group(2))
        if count < 1 or index >= count:
            raise KvbenchError(f"--shard {text}: I must be in 0..N-1 and N >= 1 (shards are numbered 0 to N-1)")
        return cls(index, count)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def owns(self, item: int) -> bool:
        """Whether the run's ``item``-th slot, arrival, session or conversation is this shard's."""
        return item % self.count == self.index

    def global_number(self, local: int) -> int:
        """The run-wide number of this shard's ``local``-th item (0-based)."""
        return local * self.count + self.index

    def share(self, total: int) -> int:
        """How many of ``total`` numbered items this shard owns: ``total // N``, one more for the first
        ``total mod N`` shards."""
        return total // self.count + (1 if self.index < total % self.count else 0)


WHOLE = Shard(0, 1)
"""An unsharded run: it owns everything."""


def parse_start_at(text: str) -> float:
    """``--start-at``: Unix seconds, or an ISO 8601 time with a UTC offset (``Z`` or ``+00:00``); Unix seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or seconds <= 0:
            raise KvbenchError(f"--start-at {text!r}: Unix seconds must be a positive number")
        return seconds
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise KvbenchError(
            f"--start-at {text!r}: give an ISO 8601 UTC time (2026-12-02T06:00:00Z) or Unix seconds"
        ) from None
    if moment.tzinfo is None:
        raise KvbenchError(f"--start-at {text!r}: give the time zone (a trailing Z for UTC), so every shard agrees")
    return moment.astimezone(UTC).timestamp()


def iso_utc(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shard_salt(scenario_digest: str, count: int, start_at: float | None) -> str:
    """The prompt salt every shard of one run derives alike: from the scenario, the shard count and ``--start-at``."""
    text = f"{scenario_digest}|{count}|{start_at!r}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def point_start(start_at: float, slot: int, period_s: float) -> float:
    """Unix seconds at which load point ``slot`` (counted over arms in run order, then points) starts."""
    return start_at + slot * period_s


def seconds_until(unix_s: float | None) -> float:
    """Seconds from now to wall-clock ``unix_s`` (0 for None or a time passed)."""
    return 0.0 if unix_s is None else max(0.0, unix_s - time.time())


async def sleep_until(unix_s: float | None) -> None:
    """Sleep until wall-clock ``unix_s`` (None, or a time passed: return at once): the load driver's exact start."""
    await asyncio.sleep(seconds_until(unix_s))


async def wait_until(unix_s: float, what: str, show: Callable[[str], None]) -> float:
    """Sleep until wall-clock ``unix_s``, calling ``show`` with a countdown about once a second (a progress bar
    redraws it on a terminal; plain progress thins it to a line now and then); the seconds it was late (0 when on
    time, positive when ``unix_s`` had passed already)."""
    late = time.time() - unix_s
    if late >= 0:
        return late
    while True:
        left = unix_s - time.time()
        if left <= 0:
            return 0.0
        show(f"{what} at {iso_utc(unix_s)}: in {math.ceil(left)} s")
        await asyncio.sleep(min(1.0, left))
