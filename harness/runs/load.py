"""The load runner: many users of a multi-user workload against one endpoint, for a timed window.

:func:`run_load` drives :class:`~workloads.multi_user.MultiUserWorkload` sessions through
one pooled :class:`~harness.client.openai.OpenAIClient` (or a
:class:`~harness.client.pool.ProcessClientPool`), hands every finished request to
``on_record`` the moment it completes, and returns the :class:`LoadWindow` it measured. It knows
nothing about engines, arms or files, so ``kvbench sweep`` (one short window per load point) and a
soak (one long window, cut into intervals by ``on_tick``, ended by ``stop``) share it.

Timeline (all ``time.monotonic_ns()``)::

    start ── warm-up ──> window_start ── measured window ──> window_end ── drain ──> end

* ``mode="concurrency"``: ``value`` users are active at once (closed loop). User slot ``j`` starts at
  ``start + j·ramp_up/value``; a user sends a round, waits for the answer, thinks, sends the next
  round; when its session ends the slot starts the next session, built while the previous one talked (building
  a session tokenizes its text, on a server's own tokenizer a round trip to the busy engine: built on demand it
  would delay the new user's first send by that round trip and show as send lag though the client was idle).
  Open loop keeps new sessions built ahead the same way (one more each time an arrival found none ready).
* ``mode="qps"``: requests arrive at ``value`` per second (open loop), Poisson (exponential gaps)
  or constant. Each arrival goes to the user that has waited longest since becoming ready (its
  previous answer plus think time); with none ready a new session starts, up to
  ``max_active_users``, beyond which the arrival waits and counts as late. ``scheduled_ns`` in
  the record is the arrival time, so ``started_ns - scheduled_ns`` shows client lag.
* With ``stagger_rounds`` the users present at the start (the first session of each slot, or the
  sessions opened during warm-up) start at a random round of their session with a synthetic
  history, so the mix of rounds is steady from the beginning; such a first request is always a
  warm-up record, because the engine never saw its history.
* A shard (``plan.shard``, :mod:`.shard`) runs the user slots ``j`` it owns (``j mod N == I``, each at its
  unsharded start time), sends only the open-loop arrivals it owns of the whole run's arrival process (so the
  shards' union is that process), opens sessions ``k·N + I`` and takes its share of ``max_active_users``.
* A request is ``measure`` when it is sent inside the window (an open-loop arrival when it was
  *scheduled* inside it, so a client that falls behind in warm-up does not inflate the measured
  rate), ``warmup`` before it. Nothing is sent
  after ``window_end`` (or once ``stop`` is set); requests in flight then have ``drain_timeout_s``
  to finish, after which they are cancelled and recorded as ``timeout`` errors.
* The window's :class:`~harness.store.events.ClientLag` says how far behind its schedule the client fell: the
  send lag of each request sent in the window (sent − due: an arrival's scheduled time, or a user's previous
  answer plus its think time), open-loop waits for a free session, and every sending process's event-loop delay
  and CPU use (:mod:`harness.client.fidelity`; a client pool's workers report their own).

:func:`run_schedule` drives a fixed list of requests instead (a trace replay): each at its own
time (open loop, never waiting for earlier answers) or ``concurrency`` at a time (closed loop),
with the same task, stop and drain machinery (:class:`_Driver`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.client.fidelity import LagReporting, LoopMonitor
from harness.client.openai import RequestOutcome
from harness.client.pool import StreamingClient
from harness.client.router import routing_key
from harness.scenario.spec import SweepSpec
from harness.store.events import ClientLag
from harness.store.records import Phase, RequestRecord
from workloads.multi_user import MultiUserWorkload, Prompt, Session, stream

from .recording import outcome_fields
from .shard import WHOLE, Shard, sleep_until

NS = 1_000_000_000
REFUSED_BACKOFF_BASE_S = 0.1
REFUSED_BACKOFF_CAP_S = 5.0


class RefusedBackoff:
    """How long a closed-loop user waits after its request could not even connect.

    A user whose engine refuses connections would otherwise send its next request at once, hundreds a second,
    and the error rate would measure the client's loop, not the service. After the k-th refusal in a row it
    waits ``min(cap, base * 2**(k-1))`` seconds times a jitter in [0.5, 1.5) (seeded per user, so a run is
    repeatable); any answer, even an error, resets k. So each wait holds one failed attempt, and a dead
    engine costs at most about ``window / cap`` failures per user once the waits reach the cap.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.refused = 0

    def after(self, outcome: RequestOutcome) -> float:
        """Seconds to wait before the user's next request (0 unless the request could not connect)."""
        if outcome.ok or outcome.error_kind != "connection":
            self.refused = 0
            return 0.0
        self.refused += 1
        delay: float = min(REFUSED_BACKOFF_CAP_S, REFUSED_BACKOFF_BASE_S * 2.0 ** (self.refused - 1))
        return delay * self._rng.uniform(0.5, 1.5)


LoadMode = Literal["concurrency", "qps"]
Arrival = Literal["poisson", "constant"]


@dataclass(frozen=True)
class LoadPlan:
    """One load level and its timeline."""

    mode: LoadMode
    value: float
    """Users (concurrency) or requests per second (qps)."""
    warmup_s: float = 0.0
    duration_s: float | None = None
    """Length of the measured window; None runs until ``stop`` is set (a soak)."""
    arrival: Arrival = "poisson"
    ramp_up_s: float = 0.0
    stagger_rounds: bool = True
    drain_timeout_s: float = 60.0
    max_active_users: int = 4096
    first_session: int = 0
    """Sessions are numbered from here (distinct ranges per point give distinct conversations)."""
    seed: int = 0
    """Seeds the arrival process (qps)."""
    shard: Shard = WHOLE
    """The part of the load this process sends (:mod:`.shard`)."""
    start_unix_s: float | None = None
    """Wall-clock time (Unix s) the run starts at: a shard's common start (:mod:`.shard`); None: at once."""

    def __post_init__(self) -> None:
        if not self.value > 0 or math.isinf(self.value):
            raise ValueError(f"load value must be a positive number, got {self.value}")
        if self.mode == "concurrency" and self.value != int(self.value):
            raise ValueError(f"concurrency must be a whole number of users, got {self.value}")
        if self.warmup_s < 0 or self.ramp_up_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("warmup_s, ramp_up_s and drain_timeout_s must be >= 0")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0 or None, got {self.duration_s}")

    @classmethod
    def from_sweep(
        cls, spec: SweepSpec, value: float, *, first_session: int, seed: int, shard: Shard = WHOLE
    ) -> LoadPlan:
        return cls(
            mode=spec.mode,
            value=value,
            warmup_s=spec.warmup,
            duration_s=spec.duration,
            arrival=spec.arrival,
            ramp_up_s=spec.ramp_up,
            stagger_rounds=spec.stagger_rounds,
            drain_timeout_s=spec.drain_timeout,
            max_active_users=spec.max_active_users,
            first_session=first_session,
            seed=seed,
            shard=shard,
        )

    def share(self) -> float:
        """This shard's part of the load: its user slots (concurrency), or its part of the arrivals (qps)."""
        if self.mode == "concurrency":
            return float(self.shard.share(int(self.value)))
        return self.value / self.shard.count


@dataclass(frozen=True)
class RecordContext:
    """Identity stamped into every record of a load run."""

    arm: str
    attempt: int
    repetition: int = 0
    point: int | None = None


@dataclass(frozen=True)
class LoadWindow:
    """What one load run did (times are monotonic ns)."""

    start_ns: int
    window_start_ns: int
    window_end_ns: int
    """When sending stopped: the planned window end, or when ``stop`` was set."""
    end_ns: int
    sent: int
    measured: int
    errors: int
    sessions: int
    max_in_flight: int
    late_arrivals: int
    cancelled: int
    """Requests still running at the end of the drain, cancelled and recorded as errors."""
    client: ClientLag | None = None
    """How far behind its schedule the client fell in the window (None: a driver that does not measure it)."""

    @property
    def window_s(self) -> float:
        return (self.window_end_ns - self.window_start_ns) / NS


class _Stopped(Exception):
    """Internal: sending has stopped."""


@dataclass
class _Counters:
    sent: int = 0
    measured: int = 0
    errors: int = 0
    sessions: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    late: int = 0
    cancelled: int = 0


@dataclass(kw_only=True)
class _Driver:
    """What every load generator here shares: its tasks, stopping, sleeping until a time, draining."""

    on_record: Callable[[RequestRecord], None] | None = None
    counters: _Counters = field(default_factory=_Counters)
    start_ns: int = 0
    planned_end_ns: int | None = None
    stopped_ns: int | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    failure: BaseException | None = None
    send_lags_ns: list[int] = field(default_factory=list)
    """started_ns − due_ns of the requests sent in the window."""
    slot_waits_ns: list[int] = field(default_factory=list)
    """Open-loop arrivals of the window that waited for a free session: how long."""

    @property
    def drain_timeout(self) -> float:
        raise NotImplementedError

    def launch(self) -> None:
        """Spawn the tasks that send (called once the clock has started)."""
        raise NotImplementedError

    # -- task bookkeeping -------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, _Stopped) and self.failure is None:
            self.failure = error
            self.stop()

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped_ns = time.monotonic_ns()
            self.stopped.set()

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    async def pause_until(self, when_ns: int) -> None:
        """Sleep until ``when_ns``; raise :class:`_Stopped` if sending stops first."""
        delay = (when_ns - time.monotonic_ns()) / NS
        if self.stopping:
            raise _Stopped
        if delay <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), delay)
        if self.stopping:
            raise _Stopped

    # -- the run ----------------------------------------------------------------------------
    async def counted(self, request: Awaitable[RequestOutcome], on_cancel: Callable[[], None]) -> RequestOutcome:
        """Await one request counted as sent and in flight; cancelled, it is counted and recorded (``on_cancel``)
        and the cancellation goes on."""
        counters = self.counters
        counters.sent += 1
        counters.in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
        try:
            outcome = await request
        except asyncio.CancelledError:
            counters.in_flight -= 1
            counters.cancelled += 1
            on_cancel()
            raise
        counters.in_flight -= 1
        return outcome

    def emit(self, record: RequestRecord) -> None:
        """Count a finished request's ``record``, measured (in the window) and failed, then hand it on."""
        if record.phase == "measure":
            self.counters.measured += 1
        if not record.ok:
            self.counters.errors += 1
        assert self.on_record is not None
        self.on_record(record)

    def sent_late(self, started_ns: int, due_ns: int, window_start_ns: int) -> None:
        """Count a request's send lag when it was sent in the window (whichever window it was due in)."""
        if started_ns >= window_start_ns:
            self.send_lags_ns.append(max(0, started_ns - due_ns))

    async def judged_window(self, window_start_ns: int, monitor: LoopMonitor, sender: object) -> LoadWindow:
        """:meth:`window` with the client's lag over it: this process's loop (``monitor``) and, when ``sender`` (what
        sent the requests) is a client pool, its workers'."""
        window = self.window(window_start_ns)
        start, end = window.window_start_ns, window.window_end_ns
        loops = [monitor.over(start, end)]
        if isinstance(sender, LagReporting):
            loops += await sender.loop_lag(start, end)
        return dataclasses.replace(window, client=ClientLag.of(self.send_lags_ns, self.slot_waits_ns, loops))

    def window(self, window_start_ns: int) -> LoadWindow:
        """The window this driver ran, once sending has stopped: its edges and counters."""
        c = self.counters
        assert self.stopped_ns is not None
        return LoadWindow(
            start_ns=self.start_ns,
            window_start_ns=window_start_ns,
            window_end_ns=max(self.stopped_ns, window_start_ns),
            end_ns=time.monotonic_ns(),
            sent=c.sent,
            measured=c.measured,
            errors=c.errors,
            sessions=c.sessions,
            max_in_flight=c.max_in_flight,
            late_arrivals=c.late,
            cancelled=c.cancelled,
        )

    async def drive(self, stop: asyncio.Event | None, on_tick: Callable[[int], None] | None, tick_s: float) -> None:
        """Launch, wait until sending stops, drain what is in flight; re-raise a sender's failure."""
        helpers = [asyncio.ensure_future(self._timer(stop))]
        if on_tick is not None:
            helpers.append(asyncio.ensure_future(_ticker(on_tick, tick_s)))
        try:
            self.launch()
            await self.stopped.wait()
            if self.failure is None:
                await self._drain()
        finally:
            for task in [*helpers, *self.tasks]:
                task.cancel()
            await asyncio.gather(*helpers, *self.tasks, return_exceptions=True)
        if self.failure is not None:
            raise self.failure

    async def _timer(self, stop: asyncio.Event | None) -> None:
        waits: list[asyncio.Future[Any]] = []
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        if self.planned_end_ns is not None:
            waits.append(asyncio.ensure_future(asyncio.sleep((self.planned_end_ns - time.monotonic_ns()) / NS)))
        if not waits:
            return
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        self.stop()

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.tasks and self.failure is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.wait(set(self.tasks), timeout=remaining, return_when=asyncio.FIRST_EXCEPTION)


MAX_SPARE_SESSIONS = 8
"""Open loop: new sessions kept built ahead of the arrivals at most (each holds its prompts' text and tokens)."""


@dataclass(kw_only=True)
class _Runner(_Driver):
    client: StreamingClient
    workload: MultiUserWorkload
    plan: LoadPlan
    context: RecordContext
    next_session: int = 0
    window_start_ns: int = 0

    @property
    def drain_timeout(self) -> float:
        return self.plan.drain_timeout_s

    def launch(self) -> None:
        if self.plan.mode == "concurrency":
            users = int(self.plan.value)
            for slot in range(users):
                if self.plan.shard.owns(slot):
                    self.spawn(self.user_slot(slot, users))
        else:
            self.spawn(self.arrivals())

    # -- sessions and requests --------------------------------------------------------------
    async def open_session(self, *, staggered: bool) -> Session:
        session_id = self.plan.first_session + self.plan.shard.global_number(self.next_session)
        self.next_session += 1
        plan = self.workload.plan(session_id)
        start_round = self.workload.stagger_round(plan) if staggered else 1
        return await self.workload.start_session(session_id, start_round=start_round)

    def build_ahead(self, *, staggered: bool) -> asyncio.Task[Session]:
        """Start building a session now, to be taken when a user needs one: building tokenizes its context and
        questions (on the engine's own tokenizer where it has one, a round trip to a busy server), which would
        otherwise delay the user's first send and count as send lag though the client is idle."""
        task = asyncio.ensure_future(self.open_session(staggered=staggered))
        # a session built ahead and then cancelled, or failed and never taken, must not log an unretrieved error
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    def take(self, session: Session) -> Session:
        """Count ``session`` as started (a session built ahead and never taken is not)."""
        self.counters.sessions += 1
        return session

    async def send(self, session: Session, due_ns: int, scheduled_ns: int | None = None) -> RequestOutcome:
        """Send the session's next round (due at ``due_ns``), record it, and keep the answer."""
        if self.stopping:
            raise _Stopped
        prompt = session.prompt()
        now = time.monotonic_ns()
        # an open-loop arrival belongs to the window it was offered in, even when a loaded client sends it late
        arrived_ns = now if scheduled_ns is None else scheduled_ns
        phase: Phase = "warmup" if arrived_ns < self.window_start_ns or session.is_prefilled else "measure"
        outcome = await self.counted(
            self._request(prompt, key=str(session.plan.session)),
            lambda: self._emit(session, prompt, phase, _cancelled(now), scheduled_ns),
        )
        self._emit(session, prompt, phase, outcome, scheduled_ns)
        self.sent_late(outcome.started_ns, due_ns, self.window_start_ns)
        if outcome.ok:
            session.record_answer(outcome.text)
        return outcome

    async def _request(self, prompt: Prompt, *, key: str) -> RequestOutcome:
        config = self.workload.config
        with routing_key(key):  # a fleet routes (and tracks moves) per conversation
            if config.api == "chat":
                return await self.client.chat(prompt.messages, prompt.max_tokens, ignore_eos=config.ignore_eos)
            return await self.client.completion(
                prompt.completion_prompt, prompt.max_tokens, ignore_eos=config.ignore_eos
            )

    def _emit(
        self, session: Session, prompt: Prompt, phase: Phase, outcome: RequestOutcome, scheduled_ns: int | None
    ) -> None:
        plan = session.plan
        config = self.workload.config
        self.emit(
            RequestRecord(
                arm=self.context.arm,
                attempt=self.context.attempt,
                phase=phase,
                repetition=self.context.repetition,
                context_tokens=plan.context_tokens,
                conversation=plan.session,
                turn=prompt.round,
                api=config.api,
                expected_prompt_tokens=prompt.expected_prompt_tokens,
                point=self.context.point,
                load=self.plan.value,
                user=plan.user,
                scheduled_ns=scheduled_ns,
                **outcome_fields(outcome),
            ),
        )

    # -- closed loop ------------------------------------------------------------------------
    async def user_slot(self, slot: int, users: int) -> None:
        due = self.start_ns + int(slot * self.plan.ramp_up_s * NS / users)
        upcoming = self.build_ahead(staggered=self.plan.stagger_rounds)  # the slot's first user, built before it is due
        backoff = RefusedBackoff(seed=self.plan.seed * 1_000_003 + slot)
        try:
            await self.pause_until(due)
            while not self.stopping:
                session = self.take(await upcoming)
                upcoming = self.build_ahead(staggered=False)  # the slot's next user, built while this one talks
                due = await self.converse(session, due, backoff)
        finally:
            upcoming.cancel()

    async def converse(self, session: Session, due: int, backoff: RefusedBackoff) -> int:
        """Run one user's session from ``due`` to its end (or its first failed round); return when the slot is
        due again."""
        while not session.done:
            round_ = session.next_round
            outcome = await self.send(session, due)
            # the user is due again when its answer's last byte arrived (plus its waits): time this loop
            # spends before sending again is the client's, not the user's
            due = _answered_ns(outcome)
            wait_s = backoff.after(outcome)
            if wait_s > 0:
                due += int(wait_s * NS)
                await self.pause_until(due)
            if not outcome.ok:
                break  # a failed round: later rounds would not measure a returning user
            think = session.think_after(round_)
            if not session.done and think > 0:
                due += int(think * NS)
                await self.pause_until(due)
        return due

    # -- open loop --------------------------------------------------------------------------
    async def arrivals(self) -> None:
        plan = self.plan
        rng = stream(plan.seed, "arrivals", plan.first_session, plan.value)
        ready: collections.deque[Session] = collections.deque()
        wake = asyncio.Event()
        active = 0
        max_active = max(1, plan.shard.share(plan.max_active_users))
        arrival = -1

        def returned(session: Session) -> None:
            ready.append(session)
            wake.set()

        async def think_then_return(session: Session, think_s: float) -> None:
            await self.pause_until(time.monotonic_ns() + int(think_s * NS))
            returned(session)

        async def one_request(session: Session, scheduled_ns: int) -> None:
            nonlocal active
            round_ = session.next_round
            outcome = await self.send(session, scheduled_ns, scheduled_ns)
            if not outcome.ok or session.done:
                active -= 1
                wake.set()
                return
            think = session.think_after(round_)
            if think > 0:
                self.spawn(think_then_return(session, think))
            else:
                returned(session)

        def staggered() -> bool:
            return plan.stagger_rounds and time.monotonic_ns() < self.window_start_ns

        # new users built ahead, oldest first; one more whenever an arrival found none ready (Poisson arrivals
        # come in bursts), up to MAX_SPARE_SESSIONS
        spares: collections.deque[tuple[asyncio.Task[Session], bool]] = collections.deque()
        wanted = 1
        try:
            due = self.start_ns
            while True:
                gap = rng.expovariate(plan.value) if plan.arrival == "poisson" else 1.0 / plan.value
                due += int(gap * NS)
                arrival += 1
                if not plan.shard.owns(arrival):
                    continue
                await self.pause_until(due)
                waits = not ready and active >= max_active
                if waits:
                    self.counters.late += 1
                while not ready and active >= max_active:
                    wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), 1.0)
                    if self.stopping:
                        raise _Stopped
                if waits and due >= self.window_start_ns:
                    self.slot_waits_ns.append(time.monotonic_ns() - due)
                if ready:
                    session = ready.popleft()
                else:
                    while spares and spares[0][1] and not staggered():
                        spares.popleft()[0].cancel()  # a synthetic history built in warm-up: the window must not see it
                    if not spares:
                        spares.append((self.build_ahead(staggered=staggered()), staggered()))
                    spare, _ = spares.popleft()
                    if not spare.done():
                        wanted = min(wanted + 1, MAX_SPARE_SESSIONS)
                    session = self.take(await spare)
                    while len(spares) < wanted:
                        spares.append((self.build_ahead(staggered=staggered()), staggered()))
                    active += 1
                self.spawn(one_request(session, due))
        finally:
            for spare, _ in spares:
                spare.cancel()

    # -- the run ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None, on_tick: Callable[[int], None] | None, tick_s: float) -> LoadWindow:
        plan = self.plan
        await sleep_until(plan.start_unix_s)
        self.start_ns = time.monotonic_ns()
        self.window_start_ns = self.start_ns + int(plan.warmup_s * NS)
        if plan.duration_s is not None:
            self.planned_end_ns = self.window_start_ns + int(plan.duration_s * NS)
        async with LoopMonitor("runner") as monitor:
            await self.drive(stop, on_tick, tick_s)
        return await self.judged_window(self.window_start_ns, monitor, self.client)


async def _ticker(on_tick: Callable[[int], None], tick_s: float) -> None:
    next_ns = time.monotonic_ns() + int(tick_s * NS)
    while True:
        await asyncio.sleep(max(0.0, (next_ns - time.monotonic_ns()) / NS))
        on_tick(time.monotonic_ns())
        next_ns += int(tick_s * NS)


def _answered_ns(outcome: RequestOutcome) -> int:
    """When a request's answer ended (its last byte, or its failure)."""
    return outcome.started_ns + outcome.e2e_ns if outcome.e2e_ns is not None else time.monotonic_ns()


def _cancelled(started_ns: int) -> RequestOutcome:
    return RequestOutcome(
        started_ns=started_ns,
        e2e_ns=time.monotonic_ns() - started_ns,
        error_kind="timeout",
        error="still running at the end of the drain timeout; cancelled",
    )


async def run_load(
    client: StreamingClient,
    workload: MultiUserWorkload,
    plan: LoadPlan,
    context: RecordContext,
    *,
    on_record: Callable[[RequestRecord], None],
    stop: asyncio.Event | None = None,
    on_tick: Callable[[int], None] | None = None,
    tick_s: float = 1.0,
) -> LoadWindow:
    """Apply ``plan``'s load with ``workload``'s users through ``client``; see the module docstring.

    ``client`` is an :class:`~harness.client.openai.OpenAIClient`, or a
    :class:`~harness.client.pool.ProcessClientPool` when one event loop cannot keep up.

    ``on_record`` is called once per request, as it completes (warm-up and measured alike).
    ``stop`` ends sending early (or, with ``plan.duration_s=None``, at all); ``on_tick`` is called
    every ``tick_s`` seconds with the current monotonic ns (soak intervals, progress). The client
    must allow at least as many connections as requests in flight, or connection waits will count
    as TTFT. Exceptions from the workload (tokenizer failures) propagate after everything in
    flight is cancelled.
    """
    if plan.duration_s is None and stop is None:
        raise ValueError("a load plan without duration_s needs a stop event")
    if tick_s <= 0:
        raise ValueError("tick_s must be positive")
    runner = _Runner(client=client, workload=workload, plan=plan, context=context, on_record=on_record)
    return await runner.run(stop, on_tick, tick_s)


# ---------------------------------------------------------------------------------------------
# A fixed schedule (trace replay)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleWindow:
    """What one schedule run did (times are monotonic ns)."""

    start_ns: int
    end_ns: int
    sent: int
    errors: int
    cancelled: int
    max_in_flight: int
    waited_for_slot: int
    """Requests that found every slot (``concurrency``) busy at their time, so were sent late."""


SendOne = Callable[[int], Coroutine[Any, Any, RequestOutcome]]
OnOutcome = Callable[[int, RequestOutcome, "int | None"], None]


@dataclass(kw_only=True)
class _Schedule(_Driver):
    """Request ``i`` is due at ``start + due_s[i]`` (open) or when a slot frees (closed, ``due_s`` None)."""

    count: int
    due_s: Sequence[float] | None
    concurrency: int | None
    send_one: SendOne
    on_outcome: OnOutcome
    drain_s: float

    @property
    def drain_timeout(self) -> float:
        return self.drain_s

    def launch(self) -> None:
        self.spawn(self.feed())

    async def feed(self) -> None:
        slots = asyncio.Semaphore(self.concurrency) if self.concurrency is not None else None
        last_wait_end = 0
        for index in range(self.count):
            due_ns: int | None = None
            if self.due_s is not None:
                due_ns = self.start_ns + int(self.due_s[index] * NS)
                await self.pause_until(due_ns)
            if slots is not None:
                waited = slots.locked()
                await slots.acquire()
                # a request queued behind one that waited is as late as if it had waited itself
                if due_ns is not None and (waited or last_wait_end > due_ns):
                    self.counters.late += 1
                if waited:
                    last_wait_end = time.monotonic_ns()
            self.spawn(self.one(index, due_ns, slots))
        self.stop()  # everything is sent: drain what is in flight

    async def one(self, index: int, due_ns: int | None, slots: asyncio.Semaphore | None) -> None:
        counters = self.counters
        counters.sent += 1
        counters.in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
        started = time.monotonic_ns()
        try:
            try:
                outcome = await self.send_one(index)
            except asyncio.CancelledError:
                counters.cancelled += 1
                counters.errors += 1
                self.on_outcome(index, _cancelled(started), due_ns)
                raise
            if not outcome.ok:
                counters.errors += 1
            self.on_outcome(index, outcome, due_ns)
        finally:
            counters.in_flight -= 1
            if slots is not None:
                slots.release()


async def run_schedule(
    count: int,
    send_one: SendOne,
    on_outcome: OnOutcome,
    *,
    due_s: Sequence[float] | None,
    concurrency: int | None,
    drain_timeout_s: float,
    stop: asyncio.Event | None = None,
    on_tick: Callable[[int], None] | None = None,
    tick_s: float = 1.0,
) -> ScheduleWindow:
    """Send ``count`` requests on a fixed schedule through ``send_one(i)``; ``on_outcome(i, outcome, due_ns)``
    is called as each completes (``due_ns`` the monotonic time it was due, None in closed mode).

    Open loop (``due_s`` given, seconds from the start, non-decreasing): request ``i`` is sent at its
    time whatever is still in flight, unless ``concurrency`` caps requests in flight (then it waits for
    a slot and is late). Closed loop (``due_s`` None): ``concurrency`` requests in flight, in order.
    After the last send, requests in flight have ``drain_timeout_s`` to finish, then are cancelled
    and reported as ``timeout`` errors. ``stop`` ends sending early.
    """
    if due_s is None and concurrency is None:
        raise ValueError("a closed-loop schedule needs a concurrency")
    if due_s is not None and len(due_s) != count:
        raise ValueError(f"{len(due_s)} due times for {count} requests")
    driver = _Schedule(
        count=count,
        due_s=due_s,
        concurrency=concurrency,
        send_one=send_one,
        on_outcome=on_outcome,
        drain_s=drain_timeout_s,
    )
    driver.start_ns = time.monotonic_ns()
    await driver.drive(stop, on_tick, tick_s)
    c = driver.counters
    return ScheduleWindow(
        start_ns=driver.start_ns,
        end_ns=time.monotonic_ns(),
        sent=c.sent,
        errors=c.errors,
        cancelled=c.cancelled,
        max_in_flight=c.max_in_flight,
        waited_for_slot=c.late,
    )
