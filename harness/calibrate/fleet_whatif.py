"""Fleet what-if: N simulated replicas, a routing policy and a tier setup, on a virtual clock.

``kvbench sim fleet-whatif`` asks: at N replicas and this traffic, what do the routing policy and
where the KV tier lives do to returning users' TTFT, to hotspots, and to the GPUs needed? Every
replica is the simulator's engine core (:class:`~harness.sim.scheduler.EngineCore`, the same code
as ``kvbench sim serve``), all driven by one discrete-event loop on a virtual clock, so 32 replicas
x minutes of traffic run in seconds to minutes of CPU and nothing sleeps.

Traffic (:class:`Traffic`): ``users`` users, each with its own document of ``context_tokens``
tokens. User ``u`` (0-based) is active with weight ``(u + 1) ** -skew`` (Zipf; ``skew = 0``: all
alike, ``skew ≈ 1``: a few heavy users); the weights set each user's mean think time so that the
users together offer ``rate`` requests per second when answers are instant:
``think_u = Σ weights / (rate × weight_u)``, exponentially distributed. A user's turn ``k`` is the
document, the ``k - 1`` earlier questions and answers, and a new question (``question_tokens``);
answers have ``answer_tokens`` tokens. After ``turns`` turns the user starts a new conversation
about the same document (its prefix is still cached wherever it was), so turn 1 of later
conversations is a returning user too. Turn ``k + 1`` is sent ``think`` after turn ``k``'s answer.

Setups (:class:`Setup`): a routing policy of :class:`harness.client.router.Router` (the conversation
is the session-affinity key; ``prefix_aware`` hashes the document's leading tokens) and an offload
profile; a ``shared`` tier in it is ONE chunk index for all replicas (each replica keeps its own link
bandwidth and latency to it, :class:`~harness.sim.kvcache.OffloadTiers`). A setup with a P/D layout
(:class:`harness.sim.disagg.Disaggregation`) routes among its prefill instances instead of replicas
(``kvbench sim pd-whatif --loaded``). The replicas run in one :class:`harness.sim.disagg.Cluster`.

Results per setup (:class:`SetupResult`), over requests that arrive after ``warmup_s``:

* returning-user TTFT: p50 / p90 of every request that is not a user's very first (seconds), and
  split into ``same`` (served where the user's previous request was) and ``moved``;
* hit share: cached tokens / prompt tokens over those requests;
* hotspots: per-replica busy share of the window, max and mean (utilisation, 0..1); ``imbalance`` =
  max / mean;
* GPUs needed: ``ceil(N × max utilisation / target)`` -- replicas such that the hottest replica stays
  at ``target`` utilisation, assuming each replica's load scales as 1/N when replicas are added
  (true for round robin; an approximation for hash-based routing). All figures are modelled.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.csvfile import write_csv_rows
from common.png import save_titled_png
from harness.client.router import Policy, Router
from harness.sim.disagg import Cluster, ClusterRequest, Disaggregation
from harness.sim.scheduler import Event, FinishEvent
from harness.sim.settings import SimSettings
from offload.profiles import OffloadProfile, OffloadTier

ROUTER_PREFIX_TOKENS = 256
"""prefix_aware: the document's leading tokens that are hashed (as text) for the ring."""


@dataclass(frozen=True)
class Traffic:
    users: int = 256
    skew: float = 1.0
    rate: float = 40.0
    """Requests per second offered by all users together (if answers were instant)."""
    context_tokens: int = 8000
    question_tokens: int = 64
    answer_tokens: int = 32
    turns: int = 4
    duration_s: float = 120.0
    warmup_s: float = 30.0
    seed: int = 0


@dataclass(frozen=True)
class Setup:
    name: str
    policy: Policy
    profile: OffloadProfile
    disaggregation: Disaggregation | None = None
    """A P/D layout (the profile's tiers on its prefill side); None: colocated replicas."""


def default_setups() -> list[Setup]:
    """The three the issue asks about, plus round robin with per-replica tiers as the reference."""
    own = OffloadProfile(name="own-cpu-64g", tiers=(OffloadTier(kind="cpu", capacity_gb=64),))
    shared = OffloadProfile(
        name="shared-10GBps", tiers=(OffloadTier(kind="shared", capacity_gb=4096, read_gbps=10, write_gbps=5),)
    )
    return [
        Setup("round_robin + own CPU tier", "round_robin", own),
        Setup("round_robin + shared tier", "round_robin", shared),
        Setup("session_affinity + own CPU tier", "session_affinity", own),
        Setup("prefix_aware + own CPU tier", "prefix_aware", own),
    ]


@dataclass
class _User:
    index: int
    think_s: float
    conversation: int = 0
    turn: int = 0
    history: list[int] = field(default_factory=list)
    last_replica: int | None = None


@dataclass(frozen=True)
class Served:
    user: int
    turn: int
    arrival: float
    ttft: float
    replica: int
    moved: bool | None
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class SetupResult:
    setup: str
    replicas: int
    requests: int
    ttft_p50_s: float
    ttft_p90_s: float
    same_p50_s: float | None
    moved_p50_s: float | None
    moved_share: float
    hit_share: float
    util_max: float
    util_mean: float
    gpus_needed: int

    @property
    def imbalance(self) -> float:
        return self.util_max / self.util_mean if self.util_mean > 0 else float("nan")


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(
    setup: Setup,
    replicas: int,
    traffic: Traffic,
    *,
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    settings: SimSettings | None = None,
) -> tuple[list[Served], list[float]]:
    """Run one setup; returns the served requests and each engine core's busy seconds inside the window.

    ``replicas`` colocated instances, or the setup's P/D layout (``replicas`` unused; the router then picks the
    prefill instance and the busy seconds list the prefill instances, then the decode instances). ``settings``:
    one instance's settings (a calibrated one) in place of ``model`` on ``hardware`` with the setup's profile.
    """
    settings = settings or SimSettings(model=model, hardware=hardware, offload=setup.profile)
    shared: OrderedDict[int, float] = OrderedDict()
    cluster = Cluster(settings, setup.disaggregation, replicas, shared_chunks=shared)
    window = (traffic.warmup_s, traffic.warmup_s + traffic.duration_s)
    cluster.window = window
    router = Router(
        setup.policy, len(cluster.prefill), seed=traffic.seed, block_chars=ROUTER_PREFIX_TOKENS * 6, prefix_blocks=1
    )
    rng = random.Random(traffic.seed)
    weights = [(u + 1) ** -traffic.skew for u in range(traffic.users)]
    users = [_User(u, sum(weights) / (traffic.rate * w)) for u, w in enumerate(weights)]
    documents = [
        [1000 + (u * 7919 + i * 31) % 50000 for i in range(traffic.context_tokens)] for u in range(traffic.users)
    ]
    arrivals: list[tuple[float, int, int]] = []
    order = itertools.count()
    served: list[Served] = []

    def send(user: _User) -> None:
        user.turn += 1
        if user.turn > traffic.turns:
            user.conversation, user.turn, user.history = user.conversation + 1, 1, []
        question = [
            60000 + (user.index * 131 + user.conversation * 17 + user.turn * 7 + i) % 5000
            for i in range(traffic.question_tokens)
        ]
        prompt = documents[user.index] + user.history + question
        key = f"{user.index}:{user.conversation}"
        text = " ".join(map(str, prompt[:ROUTER_PREFIX_TOKENS]))
        replica = router.pick(key, text)
        moved = None if user.last_replica is None else user.last_replica != replica
        arrival = cluster.clock

        def sink(event: Event, user: _User = user, replica: int = replica, moved: bool | None = moved) -> None:
            if not isinstance(event, FinishEvent):
                return
            # the prefill side's cache hits (P/D: the decode side gets every prompt token's KV)
            request, first = requests[id(user)].served, requests[id(user)].first
            assert request is not None and first is not None
            if request.first_token_at is not None and arrival >= window[0] and arrival < window[1]:
                served.append(
                    Served(
                        user.index,
                        user.turn,
                        arrival,
                        request.first_token_at - arrival,
                        replica,
                        moved,
                        request.prompt_tokens,
                        first.cached_tokens or 0,
                    )
                )
            user.history = request.tokens[len(documents[user.index]) :]
            at = cluster.clock + rng.expovariate(1.0 / user.think_s)
            heapq.heappush(arrivals, (at, next(order), user.index))

        name = f"u{user.index}-c{user.conversation}-t{user.turn}"
        user.last_replica = replica
        requests[id(user)] = cluster.submit(name, prompt, traffic.answer_tokens, sink, instance=replica)

    requests: dict[int, ClusterRequest] = {}
    for user in users:
        heapq.heappush(arrivals, (rng.uniform(0, min(user.think_s, traffic.warmup_s)), next(order), user.index))
    while arrivals or cluster.next_event_time() is not None:
        engine = cluster.next_event_time()
        if arrivals and (engine is None or arrivals[0][0] <= engine):
            at, _, index = heapq.heappop(arrivals)
            if at > window[1]:
                break
            cluster.advance_to(at)
            send(users[index])
        else:
            assert engine is not None
            if engine > window[1]:
                break
            cluster.advance_to(engine)
    return served, cluster.busy_s()


def summarize(
    setup: Setup, replicas: int, traffic: Traffic, served: list[Served], busy: list[float], target_utilization: float
) -> SetupResult:
    returning = [s for s in served if s.moved is not None]
    if not returning:
        raise ValueError(f"{setup.name}: no returning-user request completed inside the window; lengthen it")
    ttfts = [s.ttft for s in returning]
    same = [s.ttft for s in returning if s.moved is False]
    moved = [s.ttft for s in returning if s.moved is True]
    utils = [b / traffic.duration_s for b in busy]
    util_max, util_mean = max(utils), statistics.fmean(utils)
    return SetupResult(
        setup=setup.name,
        replicas=replicas,
        requests=len(returning),
        ttft_p50_s=_quantile(ttfts, 0.5),
        ttft_p90_s=_quantile(ttfts, 0.9),
        same_p50_s=_quantile(same, 0.5) if same else None,
        moved_p50_s=_quantile(moved, 0.5) if moved else None,
        moved_share=len(moved) / len(returning),
        hit_share=sum(s.cached_tokens for s in returning) / max(1, sum(s.prompt_tokens for s in returning)),
        util_max=util_max,
        util_mean=util_mean,
        gpus_needed=math.ceil(replicas * util_max / target_utilization),
    )


def run_fleet_whatif(
    replicas: int,
    traffic: Traffic,
    setups: Sequence[Setup] | None = None,
    *,
    target_utilization: float = 0.7,
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
) -> tuple[list[SetupResult], dict[str, list[float]]]:
    """Every setup at ``replicas``: the results and each setup's per-replica utilisation."""
    results: list[SetupResult] = []
    utilisation: dict[str, list[float]] = {}
    for setup in setups or default_setups():
        served, busy = simulate(setup, replicas, traffic, model=model, hardware=hardware)
        results.append(summarize(setup, replicas, traffic, served, busy, target_utilization))
        utilisation[setup.name] = [b / traffic.duration_s for b in busy]
    return results, utilisation


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def markdown_table(results: Sequence[SetupResult]) -> str:
    lines = [
        "| Setup | Returning TTFT p50 ms | p90 ms | same p50 ms | moved p50 ms | moved | hit % "
        "| util max | util mean | GPUs needed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.setup} | {_ms(r.ttft_p50_s)} | {_ms(r.ttft_p90_s)} | {_ms(r.same_p50_s)} | {_ms(r.moved_p50_s)} "
            f"| {r.moved_share:.0%} | {r.hit_share * 100:.1f} | {r.util_max:.2f} | {r.util_mean:.2f} "
            f"| {r.gpus_needed} |"
        )
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "setup",
    "replicas",
    "requests",
    "ttft_p50_s",
    "ttft_p90_s",
    "same_p50_s",
    "moved_p50_s",
    "moved_share",
    "hit_share",
    "util_max",
    "util_mean",
    "gpus_needed",
)
"""fleet-whatif.csv's columns: each a :class:`SetupResult` field of that name."""


def write_csv(results: Sequence[SetupResult], path: Path) -> None:
    write_csv_rows(path, CSV_COLUMNS, ([getattr(r, name) for name in CSV_COLUMNS] for r in results))


def plot(results: Sequence[SetupResult], utilisation: dict[str, list[float]], path: Path, title: str) -> None:
    """Left: returning-user TTFT p50/p90 per setup; right: per-replica utilisation, sorted (hotspots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    names = [r.setup for r in results]
    x = range(len(results))
    left.bar([i - 0.2 for i in x], [r.ttft_p50_s * 1000 for r in results], 0.4, label="p50")
    left.bar([i + 0.2 for i in x], [r.ttft_p90_s * 1000 for r in results], 0.4, label="p90")
    left.set_xticks(list(x), [name.replace(" + ", "\n+ ") for name in names], fontsize=8)
    left.set_ylabel("returning-user TTFT (ms)")
    left.legend()
    for name in names:
        right.plot(sorted(utilisation[name], reverse=True), marker=".", label=name)
    right.set_xlabel("replica (sorted by utilisation)")
    right.set_ylabel("busy share of the window")
    right.legend(fontsize=8)
    save_titled_png(figure, path, title + " — simulated (kvbench sim), not measured", dpi=120)
