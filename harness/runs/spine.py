"""The spine every run kind goes through: :func:`execute` around an :class:`ArmSession` per arm.

``kvbench run`` (a probe), ``kvbench sweep`` and ``kvbench soak`` differ only in what they do
with a started engine; everything else happens here, once:

1. the attempt number comes from the run directory (:meth:`RunDir.next_attempt`), the manifest
   records the attempt's start, and its end as ``completed``, ``failed`` or ``interrupted`` --
   or, when the result file's verdict (:mod:`harness.results.verdict`) says the run measured
   nothing trustworthy, ``failed`` / ``inconclusive`` with the reasons; before any engine starts,
   an attempt whose engine kind runs on this machine's GPUs with a python (the ``host_link`` column
   of :mod:`harness.engines.kinds`), on a host where ``nvidia-smi`` lists a GPU, measures the host
   link (:mod:`harness.engines.host_link`) into the manifest and shows a one-line summary;
2. for each block of work (:meth:`Runner.blocks`: one, or ABBA blocks of repetitions) and each arm
   with work in it, an :class:`ArmSession` starts the engine (one process per arm and block, so
   caches never leak between arms; disk and shared tiers write to the session's own new
   subdirectory of their ``path``, removed when the session's engines have stopped:
   :func:`offload.profiles.tier_dir`), records its facts in the manifest, opens the client, and
   offers warm-up (failed tries retried), prefix-cache reset, ``/metrics`` scraping (with restart
   detection) and record appending; with ``engine.replicas > 1`` the engine is a fleet
   (:mod:`.fleet`: every replica started in parallel, one routing client, per-replica counters
   stored) and every run kind uses it unchanged;
3. the records file is one append-only :class:`RecordWriter` for the whole attempt;
4. Ctrl-C and SIGTERM cancel the job, so every ``async with`` stops its engine, the records stay,
   and :class:`RunInterrupted` says how to resume (:func:`run_sync`);
5. the runner's ``summarize`` turns the stored files into the kind's versioned result file (and a
   fleet's ``fleet.json``).

A shard (``--shard I/N``, :mod:`.shard`) goes through the same spine: the manifest records which shard it is and
its clocks, every record it appends carries the shard, and its load points wait for their common start
(:meth:`Runner.wait_for_point`).

A runner (:class:`Runner`) says only what differs: which arms have work, what one arm does, how
its result is built. ``probe.py``, ``sweep.py`` and ``soak.py`` hold those differences.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

import aiohttp

from common.errors import EngineStartError, KvbenchError, RunDirError, RunInterrupted
from common.redact import redact_text
from common.schema import VersionedFile
from harness.client.endpoint import Endpoint
from harness.client.fleet import FleetClient
from harness.client.openai import OpenAIClient, RequestOutcome
from harness.client.redirects import followed_under
from harness.client.router import routing_key
from harness.client.scrape import counter_totals, parse_metrics, restarted
from harness.engines.base import LaunchContext, Mortal, PrefixCacheResetUnsupported, RunningEngine, stall_limit
from harness.engines.common import remove_session_dirs
from harness.engines.fleet import RunningFleet, fleet_size
from harness.engines.host_link import probe_host_link
from harness.engines.kinds import create_engine, host_link_target
from harness.results.aggregate import RESET_DETAIL
from harness.results.fleet import summarize_fleet
from harness.results.pd_breakdown import summarize_pd
from harness.results.verdict import outcome_of_result
from harness.scenario.spec import Arm, Scenario
from harness.store.events import EngineDown
from harness.store.manifest import Manifest, prompt_salt_of, read_manifest, scenario_digest
from harness.store.records import Phase, RecordWriter, RequestRecord
from harness.store.rundir import RunDir
from offload.profiles import session_dir_name
from workloads.multi_round_qa import build_filler
from workloads.tokenizer import TokenIds, Tokenizer

from .fleet import open_fleet
from .interrupt import Interrupted, run_interruptible
from .progress import NoProgress, RunProgress
from .recording import outcome_fields
from .shard import WHOLE, Shard, iso_utc, point_start, shard_salt, wait_until

Prompt = str | TokenIds | Sequence[Mapping[str, str]]
"""What :meth:`ArmSession.send` sends: text, token ids (completions only) or chat messages (chat only)."""

log = logging.getLogger(__name__)

ResultT = TypeVar("ResultT", bound=VersionedFile)

WARMUP_PROMPT_TOKENS = 128
WARMUP_ANSWER_TOKENS = 8
WARMUP_ATTEMPTS = 3
"""Tries per warm-up request; each failed try is kept as a ``warmup`` record (``turn`` = the try)."""
WARMUP_RETRY_S = 1.0
DEFAULT_CONNECTIONS = 100
ALIVE_CHECK_S = 2.0
WATCH_S = 1.0
"""How often :meth:`ArmSession.while_alive` asks whether the engine is still up (s)."""
DYING_GRACE_S = 10.0
"""How long an error is held while the engine may be on its way down (s): a vLLM whose engine core died
refuses connections while its API server is still shutting down, a few seconds before its process exits."""
T = TypeVar("T")


class EngineGone(KvbenchError):
    """The arm's engine went down under load; the message says how (its exit code, a refused connection)."""


"""How long a TCP connect to an attached endpoint may take before it counts as up but slow (not down)."""
"""aiohttp's default pool size; load runners ask for their peak concurrency plus headroom."""


REDIRECTED_DETAIL = "redirected"
"""The manifest's ``engines.ARM.details`` key naming the same-origin redirects the arm's requests followed."""


def record_from(
    outcome: RequestOutcome,
    *,
    arm: str,
    attempt: int,
    phase: Phase,
    api: str,
    repetition: int,
    context_tokens: int,
    conversation: int,
    turn: int,
    expected_prompt_tokens: int | None = None,
) -> RequestRecord:
    """The immutable record of one request the spine or a probe sent (load records come from ``load.py``)."""
    return RequestRecord(
        arm=arm,
        attempt=attempt,
        phase=phase,
        repetition=repetition,
        context_tokens=context_tokens,
        conversation=conversation,
        turn=turn,
        api="chat" if api == "chat" else "completions",
        expected_prompt_tokens=expected_prompt_tokens,
        **outcome_fields(outcome),
    )


class ArmSession:
    """One arm's started engine and open client, and what every run kind does with them."""

    def __init__(
        self,
        runner: Runner[VersionedFile],
        arm: Arm,
        engine: RunningEngine,
        client: OpenAIClient | FleetClient,
        writer: RecordWriter,
        block: int | None = None,
        fleet: RunningFleet | None = None,
        manifest: Manifest | None = None,
    ) -> None:
        self.runner = runner
        self.manifest = manifest
        self.block = block
        """Which block of :meth:`Runner.blocks` this engine start serves (None: all the arm's work)."""
        self.arm = arm
        self.engine = engine
        """The engine (a fleet's first replica: its tokenizer and endpoint stand for all)."""
        self.client = client
        """One engine's client, or a :class:`FleetClient` that routes over the replicas."""
        self.writer = writer
        self._counters: dict[str, float] = {}
        self._said_no_metrics = False
        self._restarts = 0
        self.fleet = fleet or RunningFleet((engine,))

    @property
    def attempt(self) -> int:
        return self.runner.attempt

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer()

    def append(self, record: RequestRecord) -> None:
        shard = self.runner.shard
        self.writer.append(record.model_copy(update={"shard": shard.index}) if shard.sharded else record)

    def note(self, key: str, value: str) -> None:
        """Record a fact about the arm's engine that showed while it ran in the manifest (``engines.ARM.details``)."""
        if self.manifest is not None:
            self.manifest.note_engine(self.arm.name, key, value)

    def sync(self) -> None:
        """fsync the records written so far (at the end of each unit of work)."""
        self.writer.sync()

    async def send(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        api: str,
        ignore_eos: bool,
        key: str | None = None,
    ) -> RequestOutcome:
        """One streamed request: ``prompt`` is chat messages, text (sent as one user message for chat) or, for
        completions only, token ids.

        ``key``: the conversation it belongs to (a fleet's session affinity and ``moved``).
        """
        with routing_key(key):
            if api == "chat":
                if isinstance(prompt, TokenIds):
                    raise TypeError("the chat API takes messages or text, not token ids")
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                return await self.client.chat(messages, max_tokens, ignore_eos=ignore_eos)
            if isinstance(prompt, TokenIds):
                return await self.client.completion(list(prompt.ids), max_tokens, ignore_eos=ignore_eos)
            if not isinstance(prompt, str):
                raise TypeError("the completions API takes text or token ids, not chat messages")
            return await self.client.completion(prompt, max_tokens, ignore_eos=ignore_eos)

    async def warm_up(
        self,
        count: int,
        *,
        api: str,
        ignore_eos: bool,
        tag: str,
        prompt_tokens: Sequence[int] = (WARMUP_PROMPT_TOKENS,),
    ) -> None:
        """``count`` unmeasured requests (kernels, allocators, connections), recorded as ``warmup``; request
        i has ``prompt_tokens[i % len(prompt_tokens)]`` prompt tokens (default: short ones).

        A failed one is recorded and retried, up to :data:`WARMUP_ATTEMPTS` times with a pause of
        :data:`WARMUP_RETRY_S` (one blip of a staging engine must not abort a soak); when every try
        fails the arm stops with the engine's log tail: an engine that cannot answer a 128-token
        prompt would only produce error records.
        """
        scenario = self.runner.scenario
        for index in range(count):
            tokens = prompt_tokens[index % len(prompt_tokens)]
            prompt = await build_filler(self.tokenizer, seed=scenario.seed, tag=f"{tag}-{index}", tokens=tokens)
            for attempt in range(1, WARMUP_ATTEMPTS + 1):
                outcome = await self.send(prompt, WARMUP_ANSWER_TOKENS, api=api, ignore_eos=ignore_eos)
                self.append(
                    record_from(
                        outcome, arm=self.arm.name, attempt=self.attempt, phase="warmup", api=api, repetition=-1,
                        context_tokens=tokens, conversation=index, turn=attempt,
                    )
                )  # fmt: skip
                if outcome.ok:
                    break
                log.warning(
                    "arm %s: warm-up request %d failed (try %d of %d): %s: %s",
                    self.arm.name, index, attempt, WARMUP_ATTEMPTS, outcome.error_kind, outcome.error,
                )  # fmt: skip
                if attempt == WARMUP_ATTEMPTS or outcome.permanent:  # a refused key or certificate stays refused
                    tries = "another try cannot help" if outcome.permanent else f"{attempt} tries"
                    raise KvbenchError(
                        f"arm {self.arm.name}: warm-up request failed ({tries}; last: "
                        f"{outcome.error_kind}: {outcome.error}); engine log tail:\n"
                        + "\n".join(self.engine.log_tail(20))
                    )
                await asyncio.sleep(WARMUP_RETRY_S)

    async def reset_prefix_cache(self, *, required: bool) -> bool:
        """Drop the engine's GPU prefix cache (offload tiers stay). False when the engine cannot.

        ``required``: the measurement depends on it (a probe's returning user), so an engine that
        cannot reset is an error; otherwise (a load run starting clean) it is logged and the arm
        starts warm.
        """
        try:
            await asyncio.gather(*(replica.reset_prefix_cache() for replica in self.fleet.replicas))
        except PrefixCacheResetUnsupported:
            if required:
                raise
            log.info("arm %s: the engine cannot reset its prefix cache; it starts warm", self.arm.name)
            self.note(RESET_DETAIL, "the engine cannot reset its prefix cache; the arm started warm")
            return False
        return True

    async def scrape(self) -> str | None:
        """The engine's /metrics page, or None when it has none (the run goes on without cache stats).

        Every page is also compared with the arm's previous one: a cumulative counter that went down
        or a process start time that moved is an engine restart (:meth:`take_restarts`).
        """
        try:
            text = await self.client.metrics_text()
        except (aiohttp.ClientError, TimeoutError) as error:
            if not self._said_no_metrics:  # once per arm: an endpoint without /metrics would say it every turn
                log.warning("arm %s: /metrics unavailable (%s); no cache statistics", self.arm.name, error)
                self._said_no_metrics = True
            return None
        try:
            counters = counter_totals(parse_metrics(text))
        except ValueError:
            return text  # the caller reports the unparseable page
        if self._counters and restarted(self._counters, counters) and await self.engine_down() is None:
            log.warning("arm %s: the engine restarted (its /metrics counters went back)", self.arm.name)
            self._restarts += 1
        self._counters = counters
        return text

    async def while_alive(self, work: Awaitable[T]) -> T:
        """``work``, stopped as soon as the arm's engine is down (polled every :data:`WATCH_S`).

        Under load a dead engine only shows as refused requests, which the load loop counts as errors and
        backs off from; without this a sweep point or a soak window would run to its end against a corpse
        and end as an error-rate verdict. Stopped work raises :class:`EngineGone`, which
        :func:`run_arm_or_record_death` records as the ``engine_died`` finding; the records sent so far stay.
        """
        job = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=WATCH_S)
                if done:
                    return job.result()
                down = await self.engine_down()
                if down is not None:
                    job.cancel()
                    await asyncio.wait({job})  # its own error (refused requests) is not the story: the engine is
                    raise EngineGone(down)
        finally:
            job.cancel()

    async def engine_down(self) -> str | None:
        """Why the arm's engine (or one replica of its fleet) is down, or None while every one is up.

        A process kvbench started is down once it has exited; an attached endpoint, once it refuses a TCP
        connection (a stalled one is not down: requests time out and the verdict judges them).
        """
        for index, replica in enumerate(self.fleet.replicas):
            which = f"replica {index}" if self.fleet.size > 1 else "the engine"
            if isinstance(replica, Mortal):
                code = replica.exit_code()
                if code is not None:
                    return f"{which} exited (code {code})"
                continue
            endpoint = urlsplit(replica.endpoint.base_url)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(endpoint.hostname, endpoint.port or 80), timeout=ALIVE_CHECK_S
                )
            except (OSError, TimeoutError) as error:
                if isinstance(error, ConnectionRefusedError):
                    return f"{which} at {replica.endpoint.base_url} refuses connections"
                continue
            writer.close()
        return None

    async def engine_down_within(self, grace_s: float) -> str | None:
        """:meth:`engine_down`, asked again every :data:`WATCH_S` for up to ``grace_s`` while the engine is up."""
        deadline = time.monotonic() + grace_s
        while True:
            down = await self.engine_down()
            if down is not None or time.monotonic() >= deadline:
                return down
            await asyncio.sleep(min(WATCH_S, max(deadline - time.monotonic(), 0.0)))

    def take_restarts(self) -> int:
        """Engine restarts seen by :meth:`scrape` since the last call."""
        seen, self._restarts = self._restarts, 0
        return seen


class Runner(ABC, Generic[ResultT]):
    """What one run kind does; the spine (:func:`execute`) does the rest."""

    verb: ClassVar[str]
    """The CLI verb that resumes this kind (``kvbench VERB --resume RUN_DIR``)."""
    unit: ClassVar[str]
    """What the progress bar counts."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: RunDir,
        *,
        source: Path | None = None,
        progress: RunProgress | None = None,
        only_arms: Sequence[str] = (),
    ) -> None:
        self.scenario = scenario
        self.run_dir = run_dir
        self.source = source
        self.progress: RunProgress = progress or NoProgress()
        self.attempt = run_dir.next_attempt()
        self.only_arms = frozenset(only_arms)
        self._tier_sessions = 0
        """Engine sessions started so far (the ``s<n>`` of their tier directories)."""
        self._tier_token = uuid.uuid4().hex[:8]
        """Keeps tier directories of two runs apart whose run directories share a name (on one shared path)."""
        self.shard: Shard = WHOLE
        """Which part of the run's load this process sends (``--shard``; :meth:`set_shard`)."""
        self.start_at: float | None = None
        """``--start-at`` in Unix seconds: the wall-clock start of the first load point, None: at once."""
        self._point_slot = 0
        self._clock_recorded = False

    def set_shard(self, shard: Shard, start_at: float | None) -> None:
        """Make this run shard ``shard`` (a new run's ``--shard``, or a resumed shard's manifest) starting its first
        load point at ``start_at``."""
        self.shard, self.start_at = shard, start_at

    def shard_block(self) -> dict[str, object] | None:
        """The manifest's ``shard`` block of a new shard run (None when unsharded)."""
        if not self.shard.sharded and self.start_at is None:
            return None
        start = iso_utc(self.start_at) if self.start_at is not None else None
        return {"index": self.shard.index, "count": self.shard.count, "start_at": start, "shares": self.shares()}

    def shares(self) -> list[dict[str, float]]:
        """Per load point: ``{point, load, share}``, this shard's part of it (kinds without load points: none)."""
        return []

    def point_period_s(self) -> float | None:
        """Seconds between two load points' common starts (:mod:`.shard`); None: the kind has one window."""
        return None

    async def wait_for_point(self, session: ArmSession, point: int = 0, lead_s: float = 0.0) -> float | None:
        """Wait until ``lead_s`` before load point ``point``'s common start (``--start-at`` + its slot ×
        :meth:`point_period_s`; a kind with one window: ``--start-at``, once) and return that start in Unix seconds,
        for the load driver to start on exactly (:func:`~.shard.sleep_until`); None: start at once (no
        ``--start-at``). A shard's first call of an attempt records its clocks in the manifest (:func:`shard_clock`)."""
        if self.shard.sharded and not self._clock_recorded and session.manifest is not None:
            self._clock_recorded = True
            session.manifest.record_clock(await shard_clock(session.engine.endpoint))
        if self.start_at is None:
            return None
        period = self.point_period_s()
        if period is None and self._point_slot > 0:
            return None
        self._point_slot += 1
        arms = [candidate.name for candidate in self.scenario.arms]
        grid = self.work()[0] // max(1, len(self.selected_arms()))
        arm = session.arm
        slot = arms.index(arm.name) * grid + point if period is not None else 0
        when = point_start(self.start_at, slot, period or 0.0)
        what = "the run starts" if slot == 0 else f"{arm.name}'s load point {point + 1} starts"
        late = await wait_until(when - lead_s, what, self.progress.describe) - lead_s
        if late > 1.0:
            self.progress.note(f"{what} {late:.1f} s after its common start {iso_utc(when)} (a shard runs late)")
        return when

    @functools.cached_property
    def prompt_salt(self) -> str | None:
        """The run's prompt salt, from the manifest (so ``--resume`` builds the same prompts); None where the run's
        prompts are fixed (``workload.prompt_salt: fixed``, or a run directory written before salts)."""
        return prompt_salt_of(read_manifest(self.run_dir.manifest_file))[1]

    def selected_arms(self) -> list[Arm]:
        """The scenario's arms this invocation may run (``--arm``; default all). The others keep their
        pending work for a later ``--resume``, which is how a time-limited GPU session runs one arm per call."""
        return [arm for arm in self.scenario.arms if not self.only_arms or arm.name in self.only_arms]

    # -- what differs per kind ------------------------------------------------------------------
    @abstractmethod
    def arms_with_work(self) -> list[Arm]:
        """The arms that still have work, in the order they run."""

    def blocks(self) -> list[tuple[int | None, list[Arm]]]:
        """(block, arms in order) for every block of work: one engine start per arm and block.

        Default: one block (``None``: all of each arm's work) of :meth:`arms_with_work`. A probe with
        ``arm_order: interleaved`` returns one block per repetition, arms in ABBA order.
        """
        return [(None, self.arms_with_work())]

    @abstractmethod
    def work(self) -> tuple[int, int]:
        """(total, already done) units of work, for the progress bar."""

    @abstractmethod
    async def run_arm(self, session: ArmSession) -> None:
        """Everything this kind does with one arm's started engine."""

    @abstractmethod
    def result_of(self) -> ResultT:
        """The kind's result file, aggregated from the stored files alone (writes nothing)."""

    def summarize(self) -> ResultT:
        """:meth:`result_of`, written into the run directory."""
        result = self.result_of()
        result.write_file(self.run_dir.path)
        return result

    def prefix_caching(self, arm: Arm) -> bool:
        """Whether the engine starts with its GPU prefix cache on."""
        return arm.profile.prefix_caching

    def request_timeout_s(self) -> float:
        return self.scenario.workload.request_timeout_s

    def stall_timeout_s(self) -> float | None:
        """Longest silence between two reads of a response (``workload.stall_timeout_s``), if limited."""
        return self.scenario.workload.stall_timeout_s

    def connections(self) -> int:
        return DEFAULT_CONNECTIONS

    def interrupted_message(self) -> str:
        return (
            f"{self.verb} interrupted; engines were stopped and the records kept. Continue with: "
            f"kvbench {self.verb} --resume {self.run_dir.path}"
        )

    # -- the spine ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def arm_session(
        self, arm: Arm, writer: RecordWriter, manifest: Manifest, block: int | None = None
    ) -> AsyncIterator[ArmSession]:
        # every engine session gets fresh tier directories, so turn 1 is cold whatever ran before on this host
        session = session_dir_name(self.run_dir.run_id, arm.name, self.attempt, self._tier_sessions, self._tier_token)
        self._tier_sessions += 1
        context = LaunchContext(
            arm=arm.name,
            profile=arm.profile,
            log_dir=self.run_dir.log_dir(arm.name),
            prefix_caching=self.prefix_caching(arm),
            tier_session=session,
        )
        self.progress.describe(f"{arm.name}: starting {self.scenario.engine.kind} engine")
        try:
            if fleet_size(self.scenario.engine) > 1 or (arm.routing or self.scenario.routing).router is not None:
                async with open_fleet(self, arm, context, manifest) as (fleet, client):
                    runner: Runner[VersionedFile] = self  # type: ignore[assignment]
                    yield ArmSession(
                        runner, arm, fleet.first, client, writer, block=block, fleet=fleet, manifest=manifest
                    )
                return
            async with create_engine(self.scenario.engine, context) as engine:
                manifest.record_engine(arm.name, engine.facts)
                async with OpenAIClient(
                    engine.endpoint,
                    timeout_s=self.request_timeout_s(),
                    read_timeout_s=stall_limit(self.stall_timeout_s(), engine),
                    max_connections=self.connections(),
                    on_note=self.progress.note,
                ) as client:
                    try:
                        yield ArmSession(self, arm, engine, client, writer, block=block, manifest=manifest)  # type: ignore[arg-type]
                    finally:  # the URLs measured, where the endpoint redirected within its origin
                        followed = followed_under(engine.endpoint.base_url)
                        if followed is not None:
                            manifest.note_engine(arm.name, REDIRECTED_DETAIL, followed)
        finally:  # the engines have stopped: the KV they wrote is kvbench's own
            remove_session_dirs(arm.profile, session)


async def record_host_link(runner: Runner[ResultT], manifest: Manifest) -> None:
    """Measure the attempt's host link into the manifest, when its engines will run on this host's GPUs."""
    target = host_link_target(runner.scenario.engine)
    if target is None or manifest.host_gpus == 0 or not any(arms for _, arms in runner.blocks()):
        return
    runner.progress.describe("measuring the host link (pinned host <-> GPU copies)")
    link = await probe_host_link(target)
    manifest.record_host_link(link)
    runner.progress.note(link.console_line())


async def shard_clock(endpoint: Endpoint) -> dict[str, object]:
    """A shard attempt's clocks (:class:`harness.store.manifest_model.AttemptClock`): wall minus monotonic now, and
    the server's ``Date`` header minus this client's clock midway through one ``GET /v1/models``."""
    offset: float | None = None
    url = endpoint.base_url.rstrip("/") + "/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            sent = time.time()
            async with http.get(url, headers=endpoint.headers) as response:
                received = time.time()
                date = response.headers.get("Date")
        if date is None:
            note = f"not measured: {redact_text(url)} sent no Date header"
        else:
            server = email.utils.parsedate_to_datetime(date).timestamp()
            offset = round(server - (sent + received) / 2, 3)
            note = f"Date header of GET {redact_text(url)} (1 s resolution, round trip {received - sent:.3f} s)"
    except (aiohttp.ClientError, TimeoutError, ValueError, TypeError) as error:
        note = f"not measured: GET {redact_text(url)} failed ({type(error).__name__})"
    wall_minus_monotonic = time.time_ns() - time.monotonic_ns()
    return {"wall_minus_monotonic_ns": wall_minus_monotonic, "server_offset_s": offset, "server_offset_note": note}


async def execute(runner: Runner[ResultT]) -> ResultT:
    """Run every arm with work left through an :class:`ArmSession`; return the kind's result."""
    total, done = runner.work()
    runner.progress.start(total, done, runner.unit)
    run_dir = runner.run_dir
    try:
        shard = runner.shard_block()
        salt = None
        if shard is not None:
            salt = shard_salt(scenario_digest(runner.scenario), runner.shard.count, runner.start_at)
        manifest = Manifest.start(
            run_dir.manifest_file, runner.scenario, runner.source, runner.attempt, shard=shard, shard_salt=salt
        )
    except OSError as error:
        raise RunDirError(f"{run_dir.manifest_file}: cannot write: {error.strerror or error}") from None
    status, reason = "interrupted", ""
    try:
        await record_host_link(runner, manifest)
        with RecordWriter(run_dir.records_file) as writer:
            if writer.repaired_bytes:
                runner.progress.describe(
                    f"records.jsonl: cut a torn last line of {writer.repaired_bytes} bytes (kept in records.jsonl.torn)"
                )
            for block, arms in runner.blocks():
                for arm in arms:
                    try:
                        async with runner.arm_session(arm, writer, manifest, block) as session:
                            await run_arm_or_record_death(runner, session)
                    except EngineStartError as error:
                        record_start_failure(runner, arm.name, error)
        result = runner.summarize()
        summarize_fleet(run_dir)  # fleets only (fleet.json): same vs moved, per-replica hits and load
        summarize_pd(run_dir)  # prefill/decode arms only (pd-breakdown.json): TTFT parts, KV-transfer physics
        # a run that ran to the end but measured nothing trustworthy says so here, for every kind
        outcome = outcome_of_result(result)
        status, reason = outcome.status, outcome.reason
    except KvbenchError as error:
        status, reason = "failed", str(error).splitlines()[0] if str(error) else type(error).__name__
        raise
    except OSError as error:  # the run directory became unwritable: full disk, read-only, removed
        status, reason = "failed", f"cannot write to {error.filename or run_dir.path}: {error.strerror or error}"
        raise RunDirError(
            f"{reason}; the records measured so far are kept (free space, then: "
            f"kvbench {runner.verb} --resume {run_dir.path})"
        ) from None
    finally:
        try:
            manifest.finish(status, reason)
        except OSError as error:  # not even in place: say so, but keep the first error
            log.error("%s: could not record status %s: %s", manifest.path, status, error)
    return result


async def run_arm_or_record_death(runner: Runner[ResultT], session: ArmSession) -> None:
    """Run the arm; an engine that died under it ends the arm as a stored finding, not a traceback.

    What the arm measured before stays in the records; the next arm runs; the result's verdict says FAILED
    (``engine_died``, :mod:`harness.results.validity`). An error while the engine is up (still up
    :data:`DYING_GRACE_S` later) is kvbench's or the engine's own and propagates as before.
    """
    try:
        await runner.run_arm(session)
    except (KvbenchError, RuntimeError, aiohttp.ClientError, TimeoutError, ConnectionError) as error:
        down = await session.engine_down_within(DYING_GRACE_S)
        if down is None:
            raise
        during = (str(error).splitlines() or [type(error).__name__])[0]
        event = EngineDown(
            arm=session.arm.name, attempt=runner.attempt, at_unix_ns=time.time_ns(), reason=down, during=during[:500]
        )
        runner.run_dir.append_engine_down(event)
        session.sync()
        log.error("arm %s: %s; the arm ends here (%s)", session.arm.name, down, during)
        runner.progress.note(f"{session.arm.name}: {down}; the arm ends here, its measurements so far are kept")


def record_start_failure(runner: Runner[ResultT], arm: str, error: EngineStartError) -> None:
    """An engine that did not come up ends its arm as a stored finding; the next arm runs.

    Its arm keeps its work pending (``--resume`` tries again); the verdict says FAILED (``engine_died``) with
    the start error's first line, and the full message (the engine log's tail) goes to the console log.
    """
    first = (str(error).splitlines() or [type(error).__name__])[0]
    event = EngineDown(
        arm=arm,
        attempt=runner.attempt,
        at_unix_ns=time.time_ns(),
        reason=f"the engine did not start ({first[:400]})",
        during="",
    )
    runner.run_dir.append_engine_down(event)
    log.error("arm %s: the engine did not start; the arm ends here:\n%s", arm, error)
    runner.progress.note(f"{arm}: the engine did not start ({first[:200]}); the next arm runs")


def run_sync(runner: Runner[ResultT]) -> ResultT:
    """:func:`execute` in its own event loop; Ctrl-C/SIGTERM become :class:`RunInterrupted`."""
    try:
        return run_interruptible(lambda: execute(runner))
    except Interrupted:
        raise RunInterrupted(runner.interrupted_message(), runner.run_dir.path) from None
